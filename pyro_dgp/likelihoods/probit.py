"""Bernoulli-probit likelihood ``p(y = 1 | f) = Phi(f)`` for binary classification."""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.special import log_ndtr, ndtr

from .base import Likelihood

__all__ = ["BernoulliProbit"]


class BernoulliProbit(Likelihood):
    """``p(y = 1 | f) = Phi(f)`` for labels in {0, 1}.

    The predictive ``log p(y)`` is closed-form; the ELBO's ``E log Phi(+-f)`` is
    ``num_gh_points``-point Gauss-Hermite, exact to rounding for latent variances up to about
    1. Its error grows with the variance: ``log Phi`` bends over a width of about 1 around 0,
    which nodes spaced in proportion to the latent standard deviation resolve less well
    (``tests/data/test_likelihoods.py`` measures it at variances 10 and 100). Raise
    ``num_gh_points`` where the last layer's variance is large.

    ``binary``: a predictive mixture of it is Bernoulli with ``p(y = 1)`` its mean, whose CRPS
    is the Brier score.
    """

    binary = True

    def conditional(self, f):
        return _Probit(f)

    def predictive_log_prob(self, y, loc, var):
        z = loc / (1 + var).sqrt()
        return torch.where(y > 0.5, log_ndtr(z), log_ndtr(-z))

    def predictive_moments(self, loc, var):
        p = ndtr(loc / (1 + var).sqrt())
        return p, p * (1 - p)


class _Probit(dist.TorchDistribution):
    """Bernoulli with ``p = Phi(f)``, scored with ``log_ndtr`` (stable in the tails)."""

    arg_constraints = {}
    support = constraints.boolean

    def __init__(self, f):
        self.f = f
        super().__init__(f.shape, torch.Size(), validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return _Probit(self.f.expand(batch_shape))

    def log_prob(self, value):
        return torch.where(value > 0.5, log_ndtr(self.f), log_ndtr(-self.f))

    def sample(self, sample_shape=torch.Size()):
        return torch.bernoulli(ndtr(self.f).expand(sample_shape + self.f.shape))
