"""``predict``: the predictive mixture of a deep GP at test inputs from ``S`` guide draws."""

from __future__ import annotations

import torch

from ..errors import user_errors_first
from ..guides.amortized import weighted_paths
from ..guides.base import shared_draws
from ..infer.draws import (
    check_guide_of,
    function_sites,
    set_up_guide,
    trace_draws_and_model,
    unmasked,
)
from ..likelihoods import AnalyticObservation
from ..likelihoods.marginal import source_of
from ..rng import seeded
from ..validation import as_tensor_input, check_inputs, check_positive_int
from .mixture import MixturePredictive, check_units

__all__ = ["predict"]


@user_errors_first
def predict(
    model,
    guide,
    X: torch.Tensor,
    num_samples: int = 100,
    batch_size: int = 1024,
    y_mean: float = 0.0,
    y_std: float = 1.0,
    seed: int | None = None,
) -> MixturePredictive:
    """Predictive mixture at ``X`` from ``num_samples`` guide draws, uniformly weighted; or,
    for a guide whose predictive is a fixed weighted mixture of paths (``guides.Amortized``
    with rule ``AR2P`` or ``AR2PP``: its ``S = num_paths`` quadrature nodes and weights
    ``omega``), exactly that mixture, whatever ``num_samples``.

    :param model: a :class:`~pyro_dgp.DeepGP` (anything with ``.likelihood`` and layers).
    :param guide: any guide of the library (or a completed autoguide).
    :param X: ``(N, D)`` test inputs (a NumPy array: taken in its dtype on the model's
        device).
    :param batch_size: test points per pass (memory grows with S x batch x M).
    :param y_mean, y_std: report in units ``y_mean + y_std * y_model``.
    :param seed: draw the samples from this seed without touching the global random state
        (also the ``mc_seed`` of the returned predictive's sampled estimates; ``None``: 0).
    :returns: :class:`MixturePredictive` with ``.mean``, ``.variance``, ``.log_prob(y)``...
    """
    X = as_tensor_input(X, getattr(next(iter(model.parameters()), None), "device", None))
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    batch_size = check_positive_int(batch_size, "batch_size")
    y_mean, y_std = check_units(y_mean, y_std, "predict")
    likelihood = getattr(model, "likelihood", None)
    if likelihood is None:
        raise ValueError("predict() needs a model with a .likelihood (e.g. pyro_dgp.DeepGP)")
    check_guide_of(model, guide, "predict")
    last = model.layers[-1].name + ".f" if hasattr(model, "layers") else None
    set_up_guide(guide, (X[..., :batch_size, :],), seed, X.device)
    # one U per draw for all points: per-point draws (a training estimator) would give the
    # same per-point mixtures at O(N) times the sampling cost
    with torch.no_grad(), seeded(seed, X.device), shared_draws(guide), \
            weighted_paths(guide) as weights:
        S = S if weights is None else weights.shape[0]
        chunks = [_chunk_draws(model, guide, chunk, S, last)
                  for chunk in X.split(batch_size, dim=-2)]
    locs, vars_, hypers = zip(*chunks, strict=True)
    hyper = {}
    if all(hypers):  # per draw and point, chunk by chunk
        hyper = {k: torch.cat([h[k] for h in hypers], -1) for k in hypers[0]}
    # the draws behind estimates without a closed form (a custom likelihood's CRPS) follow the
    # same seed
    return MixturePredictive(torch.cat(locs, -1), torch.cat(vars_, -1), likelihood, y_mean, y_std,
                             hyper, mc_seed=0 if seed is None else seed, weights=weights)


def _chunk_draws(model, guide, chunk: torch.Tensor, S: int, last: str | None):
    """``(loc, var, hyperparameters)`` of the ``S`` draws at the test inputs ``chunk``: the
    last layer's Gaussians, each ``(S, n)``, and the likelihood's values per draw."""
    n = chunk.shape[-2]
    trace, model_trace = trace_draws_and_model(model, guide, (chunk,), S)
    hyper = _likelihood_values(model_trace, S, n)
    loc, var = _last_marginal(trace, last)
    return loc.squeeze(-1).expand(S, n), var.squeeze(-1).expand(S, n), hyper


def _last_marginal(trace, site_name: str | None):
    """``(loc, var)`` of the Gaussian the guide drew the site ``site_name`` from (default:
    the last ``<layer>.f`` site of the trace)."""
    names = [name for name, _ in function_sites(trace)]
    if not names:
        raise ValueError("the guide produced no '<layer>.f' site")
    name = site_name or names[-1]
    source = source_of(trace.nodes[name]["value"])
    if source is None:
        raise ValueError(f"the guide did not record the Gaussian that '{name}' was drawn from")
    return source.loc, source.var


def _likelihood_values(model_trace, S: int, n: int) -> dict[str, torch.Tensor]:
    """The likelihood's hyperparameters as the model's call read them (a guide's draws of a
    Bayesian noise: one per predictive draw), each ``(S, n)``; ``{}`` if none recorded."""
    for site in model_trace.nodes.values():
        fn = unmasked(site["fn"]) if site["type"] == "sample" else None
        if isinstance(fn, AnalyticObservation):
            # a point value is 0-d; a guide's draws are one per predictive draw, (S, 1)
            return {k: (v.reshape(S, 1) if v.dim() else v).expand(S, n)
                    for k, v in fn.hyperparameters.items()}
    return {}
