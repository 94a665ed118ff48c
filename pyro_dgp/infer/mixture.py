"""Stratified objectives of a mixture guide ``q(U) = sum_k pi_k q_k(U)``
(:class:`~pyro_dgp.guides.Mixture`; Morningstar, Vikram, Ham, Gallagher and Dillon 2021).

Both draw ``S`` reparameterised ``U_ks ~ q_k`` from *every* component ``k`` and weigh each by
``log w_ks = log p(y, U_ks) - log q(U_ks)``, ``q`` the whole mixture:

- the stratified ELBO (:class:`StratifiedELBO`),
  ``sum_k pi_k (1/S) sum_s log w_ks``, the ELBO of ``q`` with each component's share of the
  draws fixed at ``pi_k`` rather than drawn (no discrete draw, so ``pi`` gets an exact
  reparameterised gradient);
- SIWAE (:class:`SIWAE`, stratified importance weighting),
  ``log sum_k pi_k (1/S) sum_s w_ks``, a lower bound on ``log p(y)`` at least as tight as the
  stratified ELBO (log of a mean >= mean of logs), which lets components specialise on
  modes: a component's draws count by their weight, not each by its log-weight.

In the stratified ELBO, ``log p(y | U)`` enters through the guide's own estimator of the last
layer (collapsed where the family collapses, the likelihood's expectation under the Gaussian
of ``f``): an unbiased estimate of the same ELBO. SIWAE is not linear in the weights, so each
``w_ks`` must be an importance weight: the guide's ``f`` are drawn given ``U_ks``
(:meth:`~pyro_dgp.guides.Mixture.sampled_f`) and the observations score ``log p(y | U, f^{<L})``
with the last layer integrated out (:func:`~pyro_dgp.importance_weights`).

Minibatches: the model scales its likelihood by ``N / B``, so on a batch ``log w_ks`` is the
per-batch estimate ``log p(U) + (N / B) log p(y_B | U) - log q(U)``. The stratified ELBO is
linear in it and stays unbiased for the whole-data ELBO; SIWAE on a batch is the bound of that
scaled per-batch joint (the local estimate), not an unbiased estimate of the whole-data SIWAE
(as for :class:`~pyro_dgp.infer.importance.RenyiELBO` and the local alpha objective).

Which objective trains the mixture by default (the stratified ELBO) rests on runs on the two-mode
toy: history.md, section "The mixture guide on the two-mode toy".
"""

from __future__ import annotations

import math

import torch
from pyro.distributions.util import scale_and_mask

from ..guides.protocol import protocol_of
from ..likelihoods.marginal import importance_weights
from ..validation import check_positive_int
from .elbo import LossFromDifferentiable, masked_out, per_draw_sum, plated_traces

__all__ = ["MIXTURE_PLATE", "SIWAE", "StratifiedELBO", "component_log_weights"]

#: the plate of each component's ``S`` draws (dim -2, left of the data plate)
MIXTURE_PLATE = "_mixture_draws"


def check_mixture(guide, where: str):
    if protocol_of(guide).num_components is None:
        raise TypeError(f"{where} trains a mixture guide (pyro_dgp.guides.Mixture), got "
                        f"{type(guide).__name__}; use the ELBO for other guides")
    return guide


def _per_draw(site: dict, S: int) -> torch.Tensor:
    """``(S,)`` a site's scaled and masked log-density summed over all but the draws' dim."""
    lp = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"])
    return per_draw_sum(torch.as_tensor(lp), S)


def _log_weights(model_trace, guide_trace, S: int) -> torch.Tensor:
    """``(S,)`` ``sum log p - sum log q`` of each draw over the sites that are not masked out
    (the layers' ``f``: the guide's estimator reaches the observations instead)."""
    total = 0.0
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for site in trace.nodes.values():
            if site["type"] != "sample" or masked_out(site):
                continue
            if sign < 0 and site["is_observed"]:
                continue
            total = total + sign * _per_draw(site, S)
    return total


def component_log_weights(model, guide, k: int, num_draws: int, args, kwargs,
                          weights: bool = False) -> torch.Tensor:
    """``(S,)`` ``log p(y, U_s) - log q(U_s)`` of ``S = num_draws`` draws ``U_s ~ q_k``,
    vectorised in one run; with ``weights`` each an importance weight (``f`` given ``U``, the
    observations scored ``log p(y | draw)``), else the ELBO's terms (the guide's estimator)."""
    with guide.component(k):
        if not weights:
            model_trace, guide_trace = plated_traces(model, guide, MIXTURE_PLATE, num_draws,
                                                     args, kwargs)
            return _log_weights(model_trace, guide_trace, num_draws)
        with guide.sampled_f(), importance_weights():
            model_trace, guide_trace = plated_traces(model, guide, MIXTURE_PLATE, num_draws,
                                                     args, kwargs)
            return _log_weights(model_trace, guide_trace, num_draws)


class _Stratified(LossFromDifferentiable):
    """A loss from ``S = num_particles`` draws of every component of a mixture guide."""

    #: whether each draw's log-weight is an importance weight (:func:`component_log_weights`)
    importance = False

    def __init__(self, num_particles: int = 1):
        self.num_particles = check_positive_int(num_particles,
                                                f"{type(self).__name__}: num_particles")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_particles={self.num_particles})"

    def _log_weights(self, model, guide, args, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log pi (K,), log w (K, S))`` with their autograd graphs."""
        guide = check_mixture(guide, type(self).__name__)
        log_w = torch.stack([component_log_weights(model, guide, k, self.num_particles, args,
                                                   kwargs, weights=self.importance)
                             for k in range(guide.num_components)])
        return guide.mixture_log_weights(), log_w


class StratifiedELBO(_Stratified):
    """The stratified ELBO of a :class:`~pyro_dgp.guides.Mixture` (module docstring) as a Pyro
    loss (``loss``, ``loss_and_grads``, ``differentiable_loss``): ``-sum_k pi_k (1/S) sum_s
    log w_ks``. For ``K = 1`` it is ``Trace_ELBO``'s estimate for the one component.

    :param num_particles: ``S``, the draws of each component per evaluation.
    """

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        log_pi, log_w = self._log_weights(model, guide, args, kwargs)
        return -(log_pi.exp() * log_w.mean(-1)).sum()


class SIWAE(_Stratified):
    """The stratified importance-weighted bound of a :class:`~pyro_dgp.guides.Mixture` (module
    docstring) as a Pyro loss: ``-log sum_k pi_k (1/S) sum_s w_ks``, at least the stratified
    ELBO on the same draws. With ``S = 1`` per component and ``K = 1`` it is the ELBO of
    importance weights (sampled-u estimator).

    :param num_particles: ``S``, the draws of each component per evaluation.
    """

    importance = True

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        log_pi, log_w = self._log_weights(model, guide, args, kwargs)  # (K,), (K, S)
        return -(torch.logsumexp((log_pi.unsqueeze(-1) + log_w).flatten(), dim=0)
                 - math.log(self.num_particles))
