"""Traces of a guide's draws: the one routine behind prediction, export, plots and PSIS.

``S`` draws of a guide are taken in one vectorised run under
``pyro.plate(SAMPLE_PLATE, S, dim=-2)``, with one ``U`` per draw for all points
(:func:`~pyro_dgp.guides.protocol.shared_draws`). The ``<layer>.f`` values are drawn by the guide's
estimator, per point from their marginals given the draw (unbiased for predictions), or with
``paths=True`` jointly over the points (:func:`~pyro_dgp.guides.protocol.sample_paths`), so that
they are one composition of functions per draw (sample paths). The model replayed on a guide trace
(:func:`trace_model`) gives the model's view of the same draws: its observation sites, its
likelihood's hyperparameters.

A caller that wants reproducible draws sets the guide up first (:func:`set_up_guide`: the set-up
uses the random stream) and then traces inside ``pyro_dgp.rng.seeded(seed, device)``.
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions import MaskedDistribution
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..gp.sites import function_site, layer_site
from ..likelihoods import AnalyticObservation
from ..rng import seeded
from ..validation import pyro_name
from .protocol import protocol_of, sample_paths, shared_draws

__all__ = [
    "check_guide_of",
    "SAMPLE_PLATE",
    "function_sites",
    "global_draws",
    "is_layer_guide",
    "observation_log_prob",
    "observation_sites",
    "set_up_guide",
    "trace_draws",
    "trace_draws_and_model",
    "trace_model",
    "unmasked",
]

#: name of the plate (at dim -2) over the ``S`` draws of a guide
SAMPLE_PLATE = "_predictive_samples"


def set_up_guide(guide, args: tuple, seed: int | None, device) -> None:
    """Set ``guide`` up (its parameters, from a prototype trace of the model: a first call's
    work) before seeded draws are taken from it.

    The set-up draws from the random stream (the prototype runs the model, an autoguide may
    initialise from prior draws), so done inside the seeded block it would shift the draws
    of a first call with ``seed`` against every later one. Here it runs in a block of its own,
    seeded by ``seed`` (the caller's random state untouched); the caller then reseeds for the
    draws themselves. A library guide or a Pyro autoguide that is already set up, or any other
    callable, is left alone.
    """
    if _is_set_up(guide):
        return
    with torch.no_grad(), seeded(seed, device), poutine.block(), shared_draws(guide):
        guide(*args)


def check_guide_of(model, guide, where: str) -> None:
    """Refuse a layer guide built for another model (it would train or report nothing of
    ``model``), naming both.

    :raises ValueError: where ``guide.model`` is not ``model``."""
    if is_layer_guide(guide) and guide.model is not model:
        def name(m):
            return f"{type(m).__name__} '{pyro_name(m) or id(m)}'"

        copy = (" (another object of the same name: a copy? copy a model and its guide "
                "together, copy.deepcopy((model, guide)))" if name(guide.model) == name(model)
                else "")
        raise ValueError(
            f"{where}: the guide {type(guide).__name__} was built for the model "
            f"{name(guide.model)}, not for {name(model)}{copy}; build the guide on this model "
            "(e.g. guides.MeanField(model)) or pass the guide's own model (guide.model)"
        )


def is_layer_guide(guide) -> bool:
    """Whether ``guide`` is a layer guide (``layer_sites``, ``site``, ``traces``...; the
    guide protocol, :class:`~pyro_dgp.guides.protocol.GuideProtocol`)."""
    return protocol_of(guide).is_layer_guide


def _is_set_up(guide) -> bool:
    """Whether ``guide`` needs no set-up run: a layer guide (completed: its inner guide too)
    or a Pyro autoguide that has run, or any other callable."""
    return protocol_of(guide).is_set_up


def trace_draws(guide, args: tuple, num_samples: int, replay: Trace | None = None,
                paths: bool = False) -> Trace:
    """The guide's trace of ``num_samples`` draws at ``args``, each one ``U`` for all points.

    :param replay: a trace whose values to replay, e.g. :func:`global_draws` of an earlier
        trace, to evaluate the same draws of the global latents at other inputs.
    :param paths: draw each layer's ``f`` jointly over the points given the draw's ``U``
        (:func:`~pyro_dgp.guides.protocol.sample_paths`), rather than from the guide's
        per-point estimator.
    """
    fn = guide if replay is None else poutine.replay(guide, trace=replay)
    draws = sample_paths(guide) if paths else shared_draws(guide)
    with pyro.plate(SAMPLE_PLATE, num_samples, dim=-2), draws:
        return poutine.trace(fn).get_trace(*args)


def trace_model(model, guide_trace: Trace, args: tuple, num_samples: int) -> Trace:
    """The model's trace replayed on the draws of ``guide_trace`` (``num_samples`` of them)."""
    with pyro.plate(SAMPLE_PLATE, num_samples, dim=-2):
        return poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args)


def trace_draws_and_model(model, guide, args: tuple, num_samples: int) -> tuple[Trace, Trace]:
    """``(guide_trace, model_trace)`` of ``num_samples`` draws at ``args``.

    A layer guide built for ``model`` runs the model itself, so one run gives both views
    (``guide.traces``); any other guide is traced and the model replayed on its draws. Both
    take the same random draws in the same order.
    """
    if is_layer_guide(guide) and guide.model is model:
        with pyro.plate(SAMPLE_PLATE, num_samples, dim=-2), shared_draws(guide):
            return guide.traces(*args)
    guide_trace = trace_draws(guide, args, num_samples)
    return guide_trace, trace_model(model, guide_trace, args, num_samples)


def global_draws(trace: Trace) -> Trace:
    """A copy of ``trace`` without the ``<layer>.f`` sites and other per-point sites, for
    replaying the global draws (``u``, hyperparameters, an autoguide's latent) on other
    inputs or in the model."""
    out = trace.copy()
    for name, site in list(out.nodes.items()):
        if site["type"] != "sample":
            continue
        local = any(f.dim is not None and f.dim == -1 for f in site["cond_indep_stack"])
        if function_site(site) is not None or local or site_is_subsample(site):
            out.remove_node(name)
    return out


def function_sites(trace: Trace) -> list[tuple[str, dict]]:
    """The ``<layer>.f`` sites of a trace, in the order the model samples them."""
    return [(n, s) for n, s in trace.nodes.items()
            if s["type"] == "sample" and function_site(s) is not None]


def observation_sites(model_trace: Trace, guide_trace: Trace) -> list[tuple[str, dict]]:
    """Sites of the model that the guide does not provide and that are not layer sites: the
    observations (observed when ``y`` was given, sampled otherwise)."""
    out = []
    for n, s in model_trace.nodes.items():
        if s["type"] != "sample" or site_is_subsample(s) or layer_site(s) is not None:
            continue
        if s["infer"].get("_deterministic") or s["infer"].get("is_auxiliary"):
            continue  # pyro.deterministic and pyro.factor: observed sites, not observations
        if s["is_observed"] or n not in guide_trace.nodes:
            out.append((n, s))
    return out


def unmasked(fn):
    """A site's distribution without its ``MaskedDistribution`` wrappers."""
    while isinstance(fn, MaskedDistribution):
        fn = fn.base_dist
    return fn


def observation_log_prob(site: dict) -> torch.Tensor:
    """Per-draw, per-point ``log p(y_i | draw)`` of an observation site: the
    Gaussian-integrated last layer where the site scores an expectation
    (:class:`~pyro_dgp.likelihoods.AnalyticObservation`, under the draws' own noise if it is
    Bayesian), else the site's own ``log_prob``. Batch shape as the site's."""
    fn = unmasked(site["fn"])
    if isinstance(fn, AnalyticObservation):
        return fn.predictive_log_prob(site["value"])
    return fn.log_prob(site["value"])
