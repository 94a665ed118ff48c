"""Gaussian likelihood ``y ~ N(f, variance)``, with closed-form expectations."""

from __future__ import annotations

import math

import pyro.distributions as dist
from pyro.nn import PyroParam

from ..constraints import positive
from ..validation import positive_tensor
from .base import Likelihood

__all__ = ["Gaussian"]


class Gaussian(Likelihood):
    """``y ~ N(f, variance)``; ``variance`` is a positive ``PyroParam`` (init 0.01): a number
    (torch's default dtype) or a one-element floating-point tensor (its own dtype and
    device). Its predictive is the normal ``N(loc, var + variance)``
    (``gaussian_predictive``)."""

    gaussian_predictive = True

    def __init__(self, variance: float = 0.01):
        super().__init__()
        variance = positive_tensor(variance, "Gaussian: variance", scalar=True)
        self.variance = PyroParam(variance, positive)

    def conditional(self, f):
        return dist.Normal(f, self.variance.sqrt())

    def expected_log_prob(self, y, loc, var):
        # E log N(y | f, s2) under N(f; loc, var), written out (no Normal to construct)
        noise = self.variance
        return -0.5 * (math.log(2 * math.pi) + noise.log() + ((y - loc).square() + var) / noise)

    def alpha_log_expectation(self, y, loc, var, alpha: float):
        # log E[N(y | f, s2)^a] = -(a/2) log(2 pi s2) - log1p(a v / s2) / 2
        #                         - a (y - loc)^2 / (2 (s2 + a v))      (docs/maths.md, §10):
        # no cancellation as a -> 0, unlike the scaled-Gaussian form
        noise = self.variance
        return (-0.5 * alpha * (math.log(2 * math.pi) + noise.log())
                - 0.5 * (alpha * var / noise).log1p()
                - alpha * (y - loc).square() / (2 * (noise + alpha * var)))

    def predictive_log_prob(self, y, loc, var):
        return dist.Normal(loc, (var + self.variance).sqrt()).log_prob(y)

    def predictive_moments(self, loc, var):
        """Mean and variance of ``y`` under ``N(f; loc, var)``."""
        return loc, var + self.variance
