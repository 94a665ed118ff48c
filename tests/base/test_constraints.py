"""``pyro_dgp.constraints.positive``: torch's ``positive`` constraint unconstrained by ``exp``
alone (torch's own is ``0 + 1 * exp(x)``, two more operations and autograd nodes per read)."""

import copy
import pickle

import pyro
import torch
from torch.distributions import biject_to, constraints, transform_to
from torch.distributions.transforms import ExpTransform

from pyro_dgp.constraints import positive
from pyro_dgp.kernels import RBF
from pyro_dgp.likelihoods import Gaussian


def test_positive_is_torchs_constraint_with_one_shared_exp():
    x = torch.tensor([-1.0, 0.0, 2.0, float("nan")])
    assert isinstance(positive, constraints.greater_than) and positive.lower_bound == 0.0
    assert torch.equal(positive.check(x), constraints.positive.check(x))
    for registry in (transform_to, biject_to):
        assert isinstance(registry(positive), ExpTransform)
        assert registry(positive) is registry(positive)  # not rebuilt at every read
    u = torch.randn(5, dtype=torch.float64)
    # the same values as torch's transform of constraints.positive, bit for bit
    assert torch.equal(transform_to(positive)(u), transform_to(constraints.positive)(u))


def test_positive_survives_copies_and_pickles():
    assert copy.deepcopy(positive) is positive
    assert pickle.loads(pickle.dumps(positive)) is positive
    kernel = copy.deepcopy(RBF(2))
    assert kernel._pyro_params["variance"][0] is positive


class _Reads(pyro.nn.PyroModule):
    def __init__(self):
        super().__init__()
        self.kernel = RBF(2, variance=1.5, lengthscale=[0.5, 2.0])
        self.likelihood = Gaussian(0.1)

    def forward(self):
        return self.kernel.variance, self.kernel.lengthscale, self.likelihood.variance


def test_positive_parameters_are_one_exp_of_their_stored_value():
    pyro.clear_param_store()
    module = _Reads()
    values = module()
    stored = [module.kernel.variance_unconstrained, module.kernel.lengthscale_unconstrained,
              module.likelihood.variance_unconstrained]
    for value, raw in zip(values, stored, strict=True):
        assert type(value.grad_fn).__name__ == "ExpBackward0"  # torch's: add(mul(exp))
        assert torch.equal(value, raw.exp())
