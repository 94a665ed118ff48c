"""``AnalyticKL_ELBO``: Pyro's ``TraceMeanField_ELBO`` without the log-densities it never reads.

``TraceMeanField_ELBO`` (via ``get_importance_trace``) evaluates ``log p`` at every model site
and ``log q`` with its score parts at every guide site before it sums the ELBO, then replaces
most of them by analytic KL terms. For a deep GP that means a multivariate-normal log-density
per layer (a triangular solve against each ``S``), a Gaussian density over every point of every
masked ``<layer>.f`` site, and a score-part tuple per site, all discarded.

This class computes the same estimator from the same two traces, evaluating only what enters
the sum. For a layer guide of the model it takes both traces from one run of the guide, which
runs the model itself (:meth:`~pyro_dgp.guides.base.LayerGuide.traces`), instead of running
the model again under ``poutine.replay``: that second run redid nothing the loss needs (its
share of a step: ``benchmarks/results/history.md``, "AnalyticKL_ELBO without the model's
replay"). The sum:

- an observed model site: its scaled and masked log-density;
- a latent site: ``KL(q || p)`` in closed form where one is registered, else
  ``log p - log q`` at the guide's value (as ``TraceMeanField_ELBO``);
- a site masked out entirely (``mask=False``, like the layers' ``<layer>.f`` sites): nothing,
  since its every term is multiplied by zero;
- an auxiliary guide site (absent from the model): ``-log q``.

With Pyro's validation enabled it defers to ``TraceMeanField_ELBO``'s own trace checks (model
and guide sites match, plate shapes, the mean-field requirement) before summing, so the first,
validated step of :func:`pyro_dgp.fit` is checked as before. Its value and gradient equal
``TraceMeanField_ELBO``'s for the same random draws (``tests/infer/test_elbo_known_answers.py``).
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions.kl import kl_divergence
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import is_identically_zero, scale_and_mask
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.util import check_fully_reparametrized, is_validation_enabled, torch_item
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import prune_subsample_sites

from ..guides.protocol import protocol_of
from ..guides.prototype import is_vectorising

__all__ = ["AnalyticKL_ELBO", "LossFromDifferentiable", "ReparamTrace_ELBO", "log_prob_sum",
           "model_and_guide_traces", "plated_traces", "single_pass"]


def masked_out(site: dict) -> bool:
    """Whether a trace site is masked out entirely (its mask, or its distribution's, is
    ``False``): it contributes no log-density."""
    fn = site["fn"]
    return site["mask"] is False or (isinstance(fn, MaskedDistribution) and fn._mask is False)


def per_draw_sum(lp: torch.Tensor, S: int) -> torch.Tensor:
    """``(S,)``: a log-density of batch shape ``(S, n)`` (or broadcastable) summed over all
    but the draws' dim; one without the draws' dim (``()`` or ``(n,)``) is every draw's."""
    if lp.dim() < 2:
        return lp.sum().expand(S)
    return lp.sum(-1).reshape(-1).expand(S)


def log_prob_sum(site: dict) -> torch.Tensor:
    """``sum(scale * mask * log fn(value))`` of a trace site; reuses Pyro's value if computed."""
    if "log_prob_sum" in site:
        return site["log_prob_sum"]
    log_p = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
    return scale_and_mask(log_p, site["scale"], site["mask"]).sum()


def _uncovered_latent_message(name: str, site: dict) -> str:
    """Why a latent model site without a guide site cannot enter the analytic-KL ELBO."""
    plates = [f.name for f in site["cond_indep_stack"] if not is_vectorising(f)]
    where = (f"a local (per-point) latent inside the plate(s) {plates}" if plates
             else "a latent site")
    return (
        f"AnalyticKL_ELBO: the model's site '{name}' is {where} that the guide does not "
        "sample, so the ELBO has no q for it (no KL term to take). The library's layer guides "
        "cover only the GP layers' '<layer>.u' / '<layer>.f' sites (and, through complete(), "
        "the global latents of the inner guide), not a model's own per-point latents. Give "
        f"'{name}' a fixed value (obs=... or poutine.condition), integrate it out of the "
        "model (e.g. into the likelihood), or train with Trace_ELBO knowingly: it then draws "
        f"'{name}' from its prior and adds log p({name}), which is not the ELBO of the model "
        "with that latent."
    )


def single_pass(model, guide) -> bool:
    """Whether the model's trace can come from the guide's own run of ``model``
    (:meth:`LayerGuide.traces <pyro_dgp.guides.base.LayerGuide.traces>`): a layer guide of this
    very model, and no handler around the loss that would act on the model's sites (only
    ``SVI.step``'s capture of parameters)."""
    if not (protocol_of(guide).is_layer_guide and model is guide.model):
        return False
    return all(isinstance(m, TraceMessenger) and m.param_only for m in _PYRO_STACK)


def plated_traces(model, guide, plate_name: str, size: int, args, kwargs):
    """``(model_trace, guide_trace)``, subsample sites pruned, of one run with ``size`` draws
    vectorised in ``pyro.plate(plate_name, size, dim=-2)`` (left of the data plate): from the
    guide's own run where :func:`single_pass` allows, else the model replayed on the guide."""
    with pyro.plate(plate_name, size, dim=-2):
        return model_and_guide_traces(model, guide, args, kwargs)


def model_and_guide_traces(model, guide, args, kwargs):
    """``(model_trace, guide_trace)`` of one run, subsample sites pruned (see
    :func:`plated_traces`)."""
    if single_pass(model, guide):
        guide_trace, model_trace = guide.traces(*args, **kwargs)
        return model_trace, guide_trace  # without subsample sites already
    guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
        *args, **kwargs)
    return prune_subsample_sites(model_trace), prune_subsample_sites(guide_trace)


class LossFromDifferentiable:
    """``loss`` and ``loss_and_grads`` (what ``pyro.infer.SVI`` calls) of a class that defines
    ``differentiable_loss(model, guide, *args, **kwargs)``."""

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            return float(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return float(loss.detach())


class ReparamTrace_ELBO(Trace_ELBO):  # noqa: N801 (Pyro's naming of ELBO classes)
    """Pyro's ``Trace_ELBO`` whose ``differentiable_loss`` reads nothing back to the host.

    Pyro's sums the ELBO's value as Python floats (one ``.item()`` per site) and checks the
    loss for NaN: each makes the host wait for the GPU, and a step that waits cannot be
    recorded as a CUDA graph (:mod:`pyro_dgp.train.cuda_graph`). Where every guide site is
    reparametrised (score-function terms zero) Pyro's surrogate objective is the ELBO itself,
    so here the loss is ``-(sum log p - sum log q)`` as one tensor: the same value (summed
    in the tensors' dtype) and gradient. A particle with a site that is not reparametrised
    is evaluated by Pyro's own code (value and surrogate gradient).
    """

    def differentiable_loss(self, model, guide, *args, **kwargs):
        loss = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            guide_sites = [s for s in guide_trace.nodes.values() if s["type"] == "sample"]
            if any(not is_identically_zero(s["score_parts"].score_function)
                   for s in guide_sites):
                value, surrogate = self._differentiable_loss_particle(model_trace, guide_trace)
                particle = surrogate + (value - surrogate.detach())
            else:  # the terms in Pyro's order: the same rounding, value and gradient
                elbo = 0.0
                for site in model_trace.nodes.values():
                    if site["type"] == "sample":
                        elbo = elbo + site["log_prob_sum"]
                for site in guide_sites:
                    elbo = elbo - site["score_parts"].entropy_term.sum()
                particle = -elbo
            loss = loss + particle / self.num_particles
        return loss


class AnalyticKL_ELBO(TraceMeanField_ELBO):  # noqa: N801 (Pyro's naming of ELBO classes)
    """``E_q log p(y | ...) - sum KL(q || p)`` with analytic KL terms, like
    :class:`pyro.infer.TraceMeanField_ELBO` (same constructor, same validity conditions: the
    guide must factorise like the model's prior), evaluating only the terms of the sum."""

    def _get_trace(self, model, guide, args, kwargs):
        if is_validation_enabled():
            return super()._get_trace(model, guide, args, kwargs)
        return model_and_guide_traces(model, guide, args, kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        """The loss ``-ELBO`` (a tensor to differentiate), as ``TraceMeanField_ELBO``'s, without
        its per-call ``.item()`` and NaN check: each makes the host wait for the forward pass
        on a GPU before it can queue the backward one. :func:`~pyro_dgp.fit` checks the loss
        once per step."""
        loss = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            loss = loss - self._elbo_particle(model_trace, guide_trace) / self.num_particles
        return loss

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        elbo = self._elbo_particle(model_trace, guide_trace)
        return -torch_item(elbo), -elbo

    def _observed_term(self, site: dict) -> torch.Tensor:
        """An observed site's part of the sum: its scaled and masked log-density."""
        return log_prob_sum(site)

    def _elbo_particle(self, model_trace, guide_trace) -> torch.Tensor:
        elbo = 0.0
        validating = is_validation_enabled()
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or masked_out(site):
                continue
            if site["is_observed"]:
                elbo = elbo + self._observed_term(site)
                continue
            guide_site = guide_trace.nodes.get(name)
            if guide_site is None:
                raise ValueError(_uncovered_latent_message(name, site))
            if validating:
                check_fully_reparametrized(guide_site)
            try:
                kl = kl_divergence(guide_site["fn"], site["fn"])
            except NotImplementedError:
                elbo = elbo + log_prob_sum(site) - log_prob_sum(guide_site)
                continue
            kl = scale_and_mask(kl, scale=guide_site["scale"], mask=guide_site["mask"])
            if torch.is_tensor(kl):
                kl_sum = kl.sum()
            else:
                kl_sum = kl * torch.Size(guide_site["fn"].batch_shape).numel()
            elbo = elbo - kl_sum
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                elbo = elbo - log_prob_sum(guide_site)  # auxiliary site
        return elbo
