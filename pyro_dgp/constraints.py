"""The constraint of the package's positive parameters.

``torch.distributions.constraints.positive`` is ``greater_than(0)``, and torch maps every
``greater_than(b)`` to the unconstrained space by ``b + 1 * exp(x)``: a new
``ComposeTransform`` built at every ``pyro.param`` read, and two more operations (and autograd
nodes) per read, forward and backward, than ``exp(x)``. :data:`positive` is the same
constraint (an instance of torch's ``greater_than`` with bound 0, checked the same way) whose
transform is one shared ``ExpTransform``: the same values, bit for bit (``0 + 1 * v == v``),
and the same gradients.
"""

from __future__ import annotations

from torch.distributions import biject_to, constraints, transform_to
from torch.distributions.transforms import ExpTransform

__all__ = ["positive"]


class _Positive(constraints.greater_than):  # torch's public alias of its _GreaterThan class
    """``x > 0``, unconstrained by ``exp`` alone (see the module)."""

    def __init__(self):
        super().__init__(0.0)

    def __reduce__(self):  # pickles (copies of modules) refer to the one instance
        return (_instance, ())


positive = _Positive()
_EXP = ExpTransform()


def _instance() -> _Positive:
    return positive


@transform_to.register(_Positive)
@biject_to.register(_Positive)
def _exp(constraint: _Positive) -> ExpTransform:
    return _EXP
