"""How far a guide's predictive is from the gold standard's, on a grid of inputs.

Both predictives are uniform mixtures of the last layer's Gaussians ``(1/S) sum_s N(loc_s,
var_s)`` per grid point (:class:`~pyro_dgp.prediction.MixturePredictive`), of the latent
``f(x)``: the likelihood's noise is the model's and the same for both, so it is left out.
Three figures, each averaged over the grid:

- ``mean_abs``: ``|E_a f(x) - E_b f(x)|``, the mixtures' means;
- ``log_var_abs``: ``|log Var_a f(x) - log Var_b f(x)|``, with the mixture's variance by
  the law of total variance, ``Var f = mean_s var_s + var_s loc_s``;
- ``w1``: the 1-Wasserstein distance of the two marginals of ``f(x)``, estimated from draws
  (``scipy.stats.wasserstein_distance``). Draw ``j`` at a point is
  ``loc_{j mod S} + sqrt(var_{j mod S}) z_j`` with the same standard normals ``z_j`` for both
  predictives (common random numbers): two single Gaussians of equal variance are then at
  exactly ``|mu_a - mu_b|``, their true distance, and in general the estimate's noise is
  that of the difference, not of each side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy.stats import wasserstein_distance

from ..guides.draws import function_sites, set_up_guide, trace_draws
from ..prediction import MixturePredictive, predict
from ..rng import seeded
from ..validation import check_positive_int
from .nuts import GoldStandard

__all__ = ["PredictiveDistance", "compare_to_gold", "draws_w1", "guide_layer_values",
           "mixture_moments", "predictive_distance"]


@dataclass(frozen=True)
class PredictiveDistance:
    """Grid averages of the module docstring's three distances (``0`` for equal
    predictives)."""

    mean_abs: float
    log_var_abs: float
    w1: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def mixture_moments(pred: MixturePredictive) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, var)`` of ``f`` at each point, each ``(N,)``: ``mean_s loc_s`` and
    ``mean_s var_s + var_s loc_s`` (law of total variance, population variance over ``s``)."""
    mean = pred.loc.mean(0)
    return mean, pred.var.mean(0) + (pred.loc - mean).square().mean(0)


def _draws(pred: MixturePredictive, z: torch.Tensor) -> torch.Tensor:
    """``(J, N)``: draw ``j`` from component ``j mod S`` with the standard normals ``z``."""
    S = pred.loc.shape[0]
    index = torch.arange(z.shape[0], device=z.device) % S
    return pred.loc[index] + pred.var[index].clamp_min(0).sqrt() * z


def predictive_distance(reference: MixturePredictive, other: MixturePredictive,
                        num_draws: int = 2000, seed: int = 0) -> PredictiveDistance:
    """The distances of ``other``'s predictive of ``f`` from ``reference``'s, averaged over
    their ``N`` points (module docstring).

    :param reference, other: predictives at the same ``N`` inputs (any numbers of
        components).
    :param num_draws: draws per point for ``w1``, the same standard normals for both sides.
    :param seed: seed of those draws (the global random state is left as it was).
    :raises ValueError: the two are at different numbers of points, or one is a weighted
        mixture (AR2P/AR2PP's), whose components these moments and draws would weigh
        equally.
    """
    J = check_positive_int(num_draws, "num_draws")
    if reference.weights is not None or other.weights is not None:
        raise ValueError("predictive_distance takes mixtures of equally weighted components; "
                         "a weighted mixture (an AR2P/AR2PP guide's predictive) is not "
                         "supported")
    N = reference.loc.shape[-1]
    if other.loc.shape[-1] != N:
        raise ValueError(f"the predictives are at different numbers of points: {N} and "
                         f"{other.loc.shape[-1]}")
    mean_a, var_a = mixture_moments(reference)
    mean_b, var_b = mixture_moments(other)
    if bool((var_a <= 0).any() or (var_b <= 0).any()):
        raise ValueError("a predictive has a zero variance of f somewhere: its log is "
                         "undefined (a deterministic guide or a noise-free point)")
    ref = reference.loc
    with seeded(seed, ref.device):
        z = torch.randn(J, N, dtype=ref.dtype, device=ref.device)
    return PredictiveDistance(
        mean_abs=float((mean_a - mean_b).abs().mean()),
        log_var_abs=float((var_a.log() - var_b.log()).abs().mean()),
        w1=draws_w1(_draws(reference, z), _draws(other, z.to(other.loc))))


def draws_w1(a: torch.Tensor, b: torch.Tensor) -> float:
    """The 1-Wasserstein distance of the empirical marginals of draws ``a`` ``(S_a, *shape)``
    and ``b`` ``(S_b, *shape)`` at each entry of ``shape`` (e.g. grid points and a layer's
    outputs), averaged over the entries (``scipy.stats.wasserstein_distance``).

    :raises ValueError: the two have different ``shape``."""
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"the draws are of different shapes: {tuple(a.shape[1:])} and "
                         f"{tuple(b.shape[1:])}")
    a = a.detach().flatten(1).cpu().numpy()
    b = b.detach().flatten(1).cpu().numpy()
    return float(np.mean([wasserstein_distance(a[:, i], b[:, i]) for i in range(a.shape[1])]))


def guide_layer_values(model, guide, X: torch.Tensor, layer: str, num_samples: int = 1000,
                       seed: int | None = 0) -> torch.Tensor:
    """``(S, N, D_l)``: draws of the layer ``layer``'s ``f`` at ``X`` from ``guide``, one
    ``U`` per draw for all points (as :meth:`GoldStandard.layer_values` draws the gold
    standard's), seeded; the global random state is left as it was."""
    S = check_positive_int(num_samples, "num_samples")
    set_up_guide(guide, (X,), seed, X.device)
    with torch.no_grad(), seeded(seed, X.device):
        trace = trace_draws(guide, (X,), S)
    sites = dict(function_sites(trace))
    name = f"{layer}.f"
    if name not in sites:
        raise ValueError(f"the guide drew no site '{name}' (it drew {sorted(sites)})")
    value = sites[name]["value"]  # (S, N, D), or (S, 1, N, D) under the model's own plates
    return value.reshape(S, X.shape[-2], -1)


def compare_to_gold(gold: GoldStandard, guides: Mapping[str, object], X: torch.Tensor,
                    num_samples: int = 500, num_draws: int = 2000,
                    seed: int = 0) -> dict[str, PredictiveDistance]:
    """Per guide, :func:`predictive_distance` of its predictive at ``X`` (``num_samples``
    draws, :func:`~pyro_dgp.predict`) from the gold standard's (all its draws).

    :param guides: ``{name: guide}``, each a guide of ``gold.model``.
    """
    reference = gold.predict(X, seed=seed)
    out = {}
    for name, guide in guides.items():
        pred = predict(gold.model, guide, X, num_samples=num_samples, seed=seed)
        out[name] = predictive_distance(reference, pred, num_draws=num_draws, seed=seed)
    return out

