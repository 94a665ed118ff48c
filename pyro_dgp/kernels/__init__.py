"""Batched covariance functions.

``pyro.contrib.gp`` kernels accept only 2-D inputs; deep GP layers evaluate kernels on inputs
with leading sample dimensions (particles, predictive samples), so these kernels broadcast over
any leading batch dims.

Every kernel is called as ``kernel(X1, X2=None, diag=False)``:

- ``X1``: ``(..., N, D)``, ``X2``: ``(..., M, D)`` -> ``(..., N, M)``
- ``X2=None`` means ``X2 = X1`` *and* the same points, so noise-like kernels (``White``) add
  their diagonal only there;
- ``diag=True`` -> ``(..., N)``, the variances ``k(x_i, x_i)``;
- a stationary kernel built with ``outputs=P`` (one set of hyperparameters per output GP of a
  layer) adds a dim of size ``P`` before the point dims: ``(..., P, N, M)``, ``(..., P, N)``.

Hyperparameters are positive ``PyroParam``s; assign a ``PyroSample`` to make one Bayesian.
Their initial values are numbers (torch's default dtype) or floating-point tensors, which keep
their own dtype and device. A kernel built on its own gets a unique Pyro name, so two
top-level kernels never share parameters in Pyro's param store; assigned to a layer it is
renamed after its attribute path (``<layer>.kernel``).

- :mod:`~pyro_dgp.kernels.base`: :class:`Kernel`, :class:`Stationary` and the hyperparameter
  helpers;
- :mod:`~pyro_dgp.kernels.stationary`: :class:`RBF`, :class:`Matern12`, :class:`Matern32`,
  :class:`Matern52`;
- :mod:`~pyro_dgp.kernels.periodic`: :class:`Periodic`; :mod:`~pyro_dgp.kernels.white`:
  :class:`White`; :mod:`~pyro_dgp.kernels.combination`: :class:`Sum`, :class:`Product`.
"""

from .base import Kernel, Stationary
from .combination import Product, Sum
from .periodic import Periodic
from .stationary import RBF, Matern12, Matern32, Matern52
from .white import White

__all__ = [
    "Kernel",
    "Stationary",
    "RBF",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "White",
    "Sum",
    "Product",
]
