"""The deep GP prior: the one GP conditional, ``GPLayer`` and its sites, ``DeepGP``."""

from .amortized import AmortizedGPLayer
from .avdgp import avdgp_regression
from .deep_gp import DeepGP
from .layer import GPLayer

__all__ = ["AmortizedGPLayer", "DeepGP", "GPLayer", "avdgp_regression"]
