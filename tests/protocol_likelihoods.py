"""Likelihoods written by the protocol alone (docs/likelihoods.md), shared by the protocol's
and the weighted mixture's tests, and the replica check of a sampled estimate."""

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from pyro_dgp.likelihoods import Likelihood

#: standard errors an estimate may lie from the truth (two-sided normal tail ~6e-5 per check)
Z = 4.0


class ProtocolGaussian(Likelihood):
    """The built-in Gaussian by the protocol alone: only ``conditional``."""

    def __init__(self, variance=0.1):
        super().__init__()
        self.variance = PyroParam(torch.as_tensor(variance), constraints.positive)

    def conditional(self, f):
        return dist.Normal(f, self.variance.sqrt())


class _NormalWithoutMoments(dist.TorchDistribution):
    """A normal that can only be scored and drawn from (no ``mean``, no ``variance``)."""

    arg_constraints = {}
    support = constraints.real

    def __init__(self, loc, scale):
        self.base = dist.Normal(loc, scale)
        super().__init__(self.base.batch_shape, torch.Size(), validate_args=False)

    def log_prob(self, value):
        return self.base.log_prob(value)

    def sample(self, sample_shape=torch.Size()):
        return self.base.sample(sample_shape)


class BareGaussian(ProtocolGaussian):
    def conditional(self, f):
        return _NormalWithoutMoments(f, self.variance.sqrt())


def tiled(loc, var, y, copies):
    """Each point repeated ``copies`` times: the copies' estimates are independent replicas
    (draws are independent across points), whose spread gives the standard error."""
    return loc.repeat(1, copies), var.repeat(1, copies), y.repeat(copies)


def replica_check(estimate, exact, copies, power_check=None):
    """Mean of the ``copies`` replicas of each point within Z standard errors of ``exact``."""
    reps = estimate.reshape(copies, -1)
    se = reps.std(0) / math.sqrt(copies)
    err = (reps.mean(0) - exact).abs()
    assert bool((err < Z * se).all()), (err / se).tolist()
    return se
