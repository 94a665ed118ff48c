"""Counts with a deep GP: ``y_n ~ Poisson(exp(f^L(x_n)))`` (a log-Gaussian Cox process on
the inputs when the counts are binned events; Adams, Murray and MacKay 2009 for the GP
case).

Sites: ``layer<l>.u``, ``layer<l>.f`` and the observation ``y`` (non-negative counts, float).
:class:`Poisson` follows the likelihood protocol (``docs/likelihoods.md``) and gives the
analytic last layer in closed form: for ``f ~ N(m, v)``,

    E log Poisson(y | e^f) = y m - E e^f - log y! = y m - exp(m + v / 2) - log y!,

the log-normal mean ``E e^f = exp(m + v / 2)``. The predictive moments are closed forms too:
``E y = exp(m + v/2)``, ``Var y = E y + (e^v - 1) exp(2 m + v)`` (law of total variance).

Guides: every layer family; ``Amortized`` with ``amortized=True``.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch

from pyro_dgp.likelihoods import Likelihood

from .regression import DGP

__all__ = ["OffsetPoisson", "Poisson", "PoissonDGP"]


class Poisson(Likelihood):
    """``y ~ Poisson(exp(f))``; ``f``, ``y``, ``loc``, ``var`` of shape ``(..., N)``."""

    def conditional(self, f):
        return dist.Poisson(f.exp(), validate_args=False)

    def expected_log_prob(self, y, loc, var):
        return y * loc - (loc + 0.5 * var).exp() - torch.lgamma(y + 1)

    def predictive_moments(self, loc, var):
        mean = (loc + 0.5 * var).exp()
        return mean, mean + var.expm1() * mean.square()

    def forward(self, f, y=None, name="y"):
        if y is not None and not bool(((y >= 0) & (y == y.round())).all()):
            raise ValueError(f"{type(self).__name__}: {name} must hold counts (non-negative "
                             "whole numbers)")
        return super().forward(f, y, name)


class PoissonDGP(DGP):
    """:class:`~models.regression.DGP` with the :class:`Poisson` likelihood; the last layer's
    zero mean is offset by ``log_rate`` (``log`` of a typical rate, e.g. of ``y.mean()``), so
    that ``f^L = 0`` means that rate."""

    def __init__(self, X: torch.Tensor, hidden: tuple[int, ...] = (1,),
                 num_inducing: int = 10, log_rate: float = 0.0, amortized: bool = False):
        if not math.isfinite(log_rate):
            raise ValueError(f"PoissonDGP: log_rate must be finite, got {log_rate}")
        super().__init__(X, OffsetPoisson(log_rate), hidden, num_inducing, amortized)


class OffsetPoisson(Poisson):
    """``y ~ Poisson(exp(offset + f))``: :class:`Poisson` of ``f`` shifted by a fixed offset."""

    def __init__(self, offset: float = 0.0):
        super().__init__()
        self.offset = offset

    def conditional(self, f):
        return super().conditional(f + self.offset)

    def expected_log_prob(self, y, loc, var):
        return super().expected_log_prob(y, loc + self.offset, var)

    def predictive_moments(self, loc, var):
        return super().predictive_moments(loc + self.offset, var)
