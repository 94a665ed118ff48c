"""The local alpha-divergence objective: one alpha-power per data point (power EP with tied
sites, the cavity replaced by ``q``; Hernández-Lobato's lecture on deep GPs, ``docs/maths.md``
§10):

    L_alpha = N/|B| sum_{i in B} (1/alpha) log (1/S) sum_s E_{N(f; m_is, v_is)} [p(y_i | f)^alpha]
              - KL(q(U) || p(U)),

with ``S`` draws ``s`` of the guide (its ``u`` and inner layers) and ``N(m_is, v_is)`` the
Gaussian the guide attaches to the last layer's ``f`` at point ``i`` in draw ``s`` (collapsed
over ``u^L`` where the guide collapses it). ``alpha -> 0`` is the ELBO of the same guide;
``alpha = 1`` makes each point's term the log-density of the ``S``-draw predictive mixture.
For ``alpha > 0`` it is not a lower bound on ``log p(y)``: :class:`LocalAlpha` calls its value
a loss, never an ELBO. The power sits inside each point's term, so a minibatch estimate is
unbiased for the ``S``-draw objective; the inner ``log (1/S) sum_s`` is biased low for finite
``S``. The inner expectation is the likelihood's
:meth:`~pyro_dgp.likelihoods.Likelihood.alpha_log_expectation` (closed form for the Gaussian,
Gauss-Hermite otherwise); for an observation scored at a sampled ``f`` (a hand-written
``dist.Normal(f, s)``), ``alpha log p(y_i | f_is)``, a Monte Carlo estimate.

The KL part is that of the guide's ELBO: closed form per layer for guides that factorise like
the prior (``mean_field``), else ``log p - log q`` at the draws; averaged over the ``S`` draws.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.util import is_validation_enabled

from ..deprecation import renamed_keywords
from ..guides.draws import unmasked
from ..guides.protocol import protocol_of
from ..likelihoods import AnalyticObservation
from ..validation import check_positive_int
from .elbo import AnalyticKL_ELBO, LossFromDifferentiable, log_prob_sum, plated_traces

__all__ = ["ALPHA_PLATE", "LocalAlpha"]

#: the plate of the ``S`` draws per point (dim -2, left of the data plate, as for predictions)
ALPHA_PLATE = "_alpha_draws"


def check_alpha(alpha) -> float:
    """``alpha`` as a float in ``(0, 1]``."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise TypeError(f"alpha must be a number in (0, 1], got {alpha!r}")
    if not 0 < alpha <= 1 or not math.isfinite(alpha):
        raise ValueError(f"alpha must lie in (0, 1] (alpha -> 0: the ELBO; 1: the predictive "
                         f"objective), got {alpha}")
    return float(alpha)


class LocalAlpha(LossFromDifferentiable, AnalyticKL_ELBO):
    """The local alpha-divergence objective (module docstring) as a Pyro loss: usable with
    ``pyro.infer.SVI`` (``loss``, ``loss_and_grads``) and with ``fit(objective="alpha")``.

    :param alpha: in ``(0, 1]``.
    :param num_particles: ``S >= 1`` draws of the guide per point, vectorised in one run (the
        ``K`` of Pyro's ``RenyiELBO(num_particles=K)``; formerly ``num_samples``).
    """

    @renamed_keywords("LocalAlpha", num_samples="num_particles")
    def __init__(self, alpha: float = 0.5, num_particles: int = 10):
        S = check_positive_int(num_particles, "LocalAlpha: num_particles")
        # Pyro's ELBO loops over its num_particles in its own loss methods, which this class
        # replaces: its S draws are one vectorised run (differentiable_loss)
        super().__init__(num_particles=S)
        self.alpha = check_alpha(alpha)

    def __repr__(self) -> str:
        return f"LocalAlpha(alpha={self.alpha:g}, num_particles={self.num_particles})"

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """``-L_alpha`` for one set of ``S`` draws (a tensor to differentiate)."""
        model_trace, guide_trace = plated_traces(model, guide, ALPHA_PLATE, self.num_particles,
                                                 args, kwargs)
        data = sum((self._local_term(s) for s in model_trace.nodes.values()
                    if s["type"] == "sample" and s["is_observed"]), start=0.0)
        return -(data + self._latent_part(model_trace, guide_trace, guide) / self.num_particles)

    def _observed_term(self, site: dict):
        return 0.0  # the local terms replace the observations' log-densities

    def _latent_part(self, model_trace, guide_trace, guide) -> torch.Tensor:
        """``-KL`` summed over the ``S`` draws: closed form for mean-field guides, else
        ``log p - log q`` at the draws (as ``Trace_ELBO``)."""
        if protocol_of(guide).mean_field:
            if is_validation_enabled():  # its check that every draw is reparameterised
                guide_trace.compute_score_parts()
            return self._elbo_particle(model_trace, guide_trace)
        total = 0.0
        for site in model_trace.nodes.values():
            if site["type"] == "sample" and not site["is_observed"]:
                total = total + log_prob_sum(site)
        for site in guide_trace.nodes.values():
            if site["type"] == "sample" and not site["is_observed"]:
                total = total - log_prob_sum(site)
        return total

    def _local_term(self, site: dict) -> torch.Tensor:
        """``sum_i scale (1/alpha) (logsumexp_s a_is - log S)`` of an observed site, with
        ``a_is = log E_s[p(y_i | f)^alpha]``."""
        fn, y, S = unmasked(site["fn"]), site["value"], self.num_particles
        if isinstance(fn, AnalyticObservation):
            a = fn.alpha_log_prob(y, self.alpha)
        else:
            a = self.alpha * fn.log_prob(y)
        if a.dim() < 2 or a.shape[-2] != S:
            a = a.expand(torch.broadcast_shapes(a.shape, (S, 1)))  # the same for every draw
        per_point = (torch.logsumexp(a, dim=-2) - math.log(S)) / self.alpha
        return scale_and_mask(per_point, site["scale"], site["mask"]).sum()
