"""``predict``: the predictive mixture of a deep GP at test inputs from ``S`` guide draws.

A model with ``.likelihood`` (a :class:`~pyro_dgp.DeepGP`, the gallery's models) gives the
analytic mixture of its last layer's Gaussians. Any other model is traced under its guide and
its observation site read: a site a package likelihood emitted with the Gaussian of ``f``
(:class:`~pyro_dgp.likelihoods.AnalyticObservation`) gives that same analytic mixture, any
other distribution the mixture of the site's own distributions over the draws
(:class:`~pyro_dgp.prediction.DrawMixturePredictive`)."""

from __future__ import annotations

import torch

from ..errors import user_errors_first
from ..guides.draws import (
    check_guide_of,
    function_sites,
    observation_sites,
    set_up_guide,
    trace_draws_and_model,
    unmasked,
)
from ..guides.protocol import protocol_of, shared_draws
from ..likelihoods import AnalyticObservation
from ..likelihoods.marginal import source_of
from ..rng import seeded
from ..validation import as_tensor_input, check_inputs, check_positive_int
from .draw_mixture import DrawMixturePredictive
from .mixture import MixturePredictive, check_units

__all__ = ["predict"]


@user_errors_first(renamed={"batch_size": "chunk_rows"})
def predict(
    model,
    guide,
    X: torch.Tensor,
    num_samples: int = 100,
    chunk_rows: int = 1024,
    y_mean: float = 0.0,
    y_std: float = 1.0,
    seed: int | None = 0,
    observed: str | None = None,
) -> MixturePredictive | DrawMixturePredictive:
    """Predictive mixture at ``X`` from ``num_samples`` guide draws, uniformly weighted; or,
    for a guide whose predictive is a fixed weighted mixture of paths (``guides.Amortized``
    with rule ``AR2P`` or ``AR2PP``: its ``S = num_paths`` quadrature nodes and weights
    ``omega``), exactly that mixture, whatever ``num_samples``.

    :param model: a :class:`~pyro_dgp.DeepGP` (anything with ``.likelihood`` and layers), or
        any model called as ``model(X)`` that samples its observation with ``pyro.sample(name,
        distribution, obs=y)`` (of batch shape ``(N,)`` in its data plate, event shape
        ``()``), directly or through a :mod:`pyro_dgp.likelihoods` likelihood.
    :param guide: any guide of the library (or a completed autoguide).
    :param X: ``(N, D)`` test inputs (a NumPy array: taken in its dtype on the model's
        device).
    :param chunk_rows: test points per pass (memory grows with S x chunk_rows x M).
    :param y_mean, y_std: report in units ``y_mean + y_std * y_model``.
    :param seed: draw the samples from this seed without touching the global random state
        (also the ``mc_seed`` of the returned predictive's sampled estimates); ``None``: from
        the global random state (``mc_seed`` 0).
    :param observed: the name of the observation site, where the model's trace under the guide
        has several sites the guide does not draw; ``None``: the model's ``.likelihood``, else
        the one such site.
    :returns: :class:`MixturePredictive` (a ``.likelihood``, or a site emitted by a package
        likelihood under a guide that records the last layer's Gaussian), else
        :class:`DrawMixturePredictive`; both with ``.mean``, ``.variance``, ``.log_prob(y)``,
        ``.crps(y)``, ``.quantiles(q)``...
    :raises ValueError: no observation site found, naming what ``predict`` needs.
    """
    X = as_tensor_input(X, getattr(next(iter(model.parameters()), None), "device", None))
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    chunk_rows = check_positive_int(chunk_rows, "chunk_rows")
    y_mean, y_std = check_units(y_mean, y_std, "predict")
    _check_observed(observed)
    likelihood = getattr(model, "likelihood", None) if observed is None else None
    check_guide_of(model, guide, "predict")
    last = model.layers[-1].name + ".f" if hasattr(model, "layers") else None
    set_up_guide(guide, (X[..., :chunk_rows, :],), seed, X.device)
    # the model's likelihood at its last layer's Gaussians, or the site its trace shows
    draw_chunk, site = ((_chunk_draws, last) if likelihood is not None
                        else (_chunk_observations, observed))
    # one U per draw for all points: per-point draws (a training estimator) would give the
    # same per-point mixtures at O(N) times the sampling cost
    with torch.no_grad(), seeded(seed, X.device), shared_draws(guide), \
            protocol_of(guide).weighted_paths() as weights:
        S = S if weights is None else weights.shape[0]
        chunks = [draw_chunk(model, guide, chunk, S, site)
                  for chunk in X.split(chunk_rows, dim=-2)]
    # the draws behind estimates without a closed form (a custom likelihood's CRPS) follow the
    # same seed
    return _mixture(chunks, y_mean, y_std, 0 if seed is None else seed, weights)


def _check_observed(observed) -> None:
    if observed is not None and not isinstance(observed, str):
        raise TypeError(f"predict: observed must be a site name (str), got "
                        f"{type(observed).__name__}")


def _mixture(chunks: list, y_mean: float, y_std: float, mc_seed: int, weights):
    """The predictive of the chunks of test points: :class:`DrawMixturePredictive` of the
    site's distributions, or :class:`MixturePredictive` of ``(loc, var, hyperparameters,
    likelihood)`` per chunk."""
    if not all(isinstance(chunk, tuple) for chunk in chunks):
        return DrawMixturePredictive(chunks, y_mean, y_std, mc_seed=mc_seed, weights=weights)
    locs, vars_, hypers, likelihoods = zip(*chunks, strict=True)
    hyper = {}
    if all(hypers):  # per draw and point, chunk by chunk
        hyper = {k: torch.cat([h[k] for h in hypers], -1) for k in hypers[0]}
    return MixturePredictive(torch.cat(locs, -1), torch.cat(vars_, -1), likelihoods[0], y_mean,
                             y_std, hyper, mc_seed=mc_seed, weights=weights)


def _chunk_draws(model, guide, chunk: torch.Tensor, S: int, last: str | None):
    """``(loc, var, hyperparameters, likelihood)`` of the ``S`` draws at the test inputs
    ``chunk``: the last layer's Gaussians, each ``(S, n)``, the likelihood's values per draw,
    and the model's likelihood."""
    n = chunk.shape[-2]
    trace, model_trace = trace_draws_and_model(model, guide, (chunk,), S)
    observation = next((fn for fn in (unmasked(site["fn"]) for site in model_trace.nodes.values()
                                      if site["type"] == "sample")
                        if isinstance(fn, AnalyticObservation)), None)
    hyper = {} if observation is None else _likelihood_values(observation, S, n)
    loc, var = _last_marginal(trace, last)
    return loc.squeeze(-1).expand(S, n), var.squeeze(-1).expand(S, n), hyper, model.likelihood


#: what ``predict`` needs of a model, for its errors
NEEDS = ("predict() needs a model with a .likelihood (pyro_dgp.DeepGP, the gallery's models) "
         "or one whose call model(X) samples its observation with pyro.sample(name, "
         "distribution, obs=y) or a pyro_dgp.likelihoods likelihood, in its data plate, at a "
         "site the guide does not draw")


def _chunk_observations(model, guide, chunk: torch.Tensor, S: int, observed: str | None):
    """The observation site's predictive components at the test inputs ``chunk`` from ``S``
    draws: ``(loc, var, hyperparameters, likelihood)`` of a package likelihood's analytic
    site, else its distribution of batch shape ``(S, n)``."""
    n = chunk.shape[-2]
    guide_trace, model_trace = trace_draws_and_model(model, guide, (chunk,), S)
    name, site = _observation_site(model_trace, guide_trace, observed)
    fn = unmasked(site["fn"])
    if isinstance(fn, AnalyticObservation):
        return (fn.loc.expand(S, n), fn.var.expand(S, n), _likelihood_values(fn, S, n),
                fn.likelihood)
    if not isinstance(fn, torch.distributions.Distribution) or fn.event_shape != ():
        raise ValueError(
            f"predict: the observation site '{name}' must be a torch distribution of event "
            f"shape () (one y per point), got {type(fn).__name__} of event shape "
            f"{tuple(getattr(fn, 'event_shape', ()))}; {NEEDS}")
    try:
        return fn.expand((S, n))
    except (RuntimeError, ValueError, NotImplementedError) as err:
        raise ValueError(
            f"predict: the observation site '{name}' has batch shape {tuple(fn.batch_shape)}, "
            f"not one y per draw and test point ({S}, {n}): sample it inside the data plate "
            f"(dim -1) with batch shape (N,); {NEEDS}") from err


def _observation_site(model_trace, guide_trace, observed: str | None) -> tuple[str, dict]:
    """``(name, site)`` of the observation: the site ``observed``, else the one sample site
    of the model that is observed or that the guide does not draw (not a layer site)."""
    candidates = observation_sites(model_trace, guide_trace)
    if observed is not None:
        site = model_trace.nodes.get(observed)
        if site is None or site["type"] != "sample":
            raise ValueError(f"predict: the model has no sample site observed={observed!r}; "
                             f"its candidate observation sites: "
                             f"{[n for n, _ in candidates]}")
        return observed, site
    if not candidates:
        raise ValueError(f"predict: the model's trace under the guide has no observation site; "
                         f"{NEEDS}")
    if len(candidates) > 1:
        raise ValueError(f"predict: the model has several sites the guide does not draw, "
                         f"{[n for n, _ in candidates]}: name the observation with "
                         "predict(..., observed='<name>')")
    return candidates[0]


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


def _likelihood_values(observation: AnalyticObservation, S: int,
                       n: int) -> dict[str, torch.Tensor]:
    """The likelihood's hyperparameters as the model's call read them at its observation site
    (a guide's draws of a Bayesian noise: one per predictive draw), each ``(S, n)``."""
    # a point value is 0-d; a guide's draws are one per predictive draw, (S, 1)
    return {k: (v.reshape(S, 1) if v.dim() else v).expand(S, n)
            for k, v in observation.hyperparameters.items()}
