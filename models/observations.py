"""Observation distributions of the multi-output models with an analytic last layer.

A guide records the Gaussian ``N(loc, var)`` (per point and output) that its draw of the last
layer's ``f`` came from (``pyro_dgp.likelihoods.marginal.source_of``). Where it did, these
distributions score ``E_{N(f; loc, var)} log p(y | f)`` in closed form instead of ``log
p(y | f)`` at the draw: the same expectation with less variance (the analytic last layer of
Salimbeni and Deisenroth 2017). Inside ``pyro_dgp.importance_weights()`` (objectives that need
each draw's own importance weight) and for a value no guide drew, they score the draw.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from pyro_dgp.likelihoods.marginal import importance_weighting, source_of

__all__ = ["DiagonalNormal", "HeteroscedasticNormal"]

LOG_2PI = math.log(2 * math.pi)


class _AtDrawOrExpected(dist.TorchDistribution):
    """``p(y | f)`` at the draw ``f`` ``(..., N, K)``, or its expectation under ``f``'s
    recorded Gaussian; batch shape ``f.shape[:-1]``."""

    arg_constraints = {}
    support = constraints.real

    def __init__(self, f: torch.Tensor, scale: torch.Tensor, event_shape=torch.Size()):
        self.f, self.scale = f, scale
        source = None if importance_weighting() else source_of(f)
        self.loc, self.var = (None, None) if source is None else (source.loc, source.var)
        super().__init__(f.shape[:-1], event_shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = type(self).__new__(type(self))
        new.f = self.f.expand(batch_shape + self.f.shape[-1:])
        new.scale = self.scale
        new.loc = None if self.loc is None else self.loc.expand(new.f.shape)
        new.var = None if self.var is None else self.var.expand(new.f.shape)
        super(_AtDrawOrExpected, new).__init__(batch_shape, self.event_shape,
                                               validate_args=False)
        return new

    def at_draw(self) -> dist.Distribution:
        raise NotImplementedError

    def expected_log_prob(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def log_prob(self, y):
        return self.at_draw().log_prob(y) if self.loc is None else self.expected_log_prob(y)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.at_draw().sample(sample_shape)


class HeteroscedasticNormal(_AtDrawOrExpected):
    """``y ~ N(f_1, s^2 exp(2 f_2))`` at ``f`` ``(..., N, 2)``, noise scale ``s``.

    For ``f_k ~ N(m_k, v_k)`` independent, ``E[exp(-2 f_2)] = exp(-2 m_2 + 2 v_2)`` (the
    log-normal mean), so

        E log p(y | f) = -log(2 pi) / 2 - log s - m_2 - ((y - m_1)^2 + v_1) exp(2 v_2 - 2 m_2)
                         / (2 s^2).
    """

    def at_draw(self):
        return dist.Normal(self.f[..., 0], self.scale * self.f[..., 1].exp())

    def expected_log_prob(self, y):
        m1, m2 = self.loc[..., 0], self.loc[..., 1]
        v1, v2 = self.var[..., 0], self.var[..., 1]
        s2 = self.scale.square()
        return (-0.5 * LOG_2PI - self.scale.log() - m2
                - 0.5 * ((y - m1).square() + v1) * (2 * v2 - 2 * m2).exp() / s2)


class DiagonalNormal(_AtDrawOrExpected):
    """``y ~ N(f, diag(scale^2))`` at ``f`` ``(..., N, P)``, event shape ``(P,)``:
    ``E log p(y | f) = sum_p -log(2 pi scale_p^2) / 2 - ((y_p - m_p)^2 + v_p) / (2 scale_p^2)``.
    """

    def __init__(self, f: torch.Tensor, scale: torch.Tensor):
        super().__init__(f, scale, f.shape[-1:])

    def at_draw(self):
        return dist.Normal(self.f, self.scale).to_event(1)

    def expected_log_prob(self, y):
        s2 = self.scale.square()
        terms = -0.5 * (LOG_2PI + s2.log()) - 0.5 * ((y - self.loc).square() + self.var) / s2
        return terms.sum(-1)
