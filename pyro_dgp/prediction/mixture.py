"""Predictive distributions: a uniform mixture over S guide draws (REFERENCE.md §5)."""

from __future__ import annotations

import math

import pyro
import torch
from pyro import poutine
from pyro.distributions import MaskedDistribution
from pyro.infer.autoguide import AutoGuide
from torch.special import ndtr

from ..gp.sites import function_site
from ..guides.base import LayerGuide, shared_draws
from ..likelihoods.base import Gaussian, Likelihood, _Expected
from ..likelihoods.marginal import source_of
from ..rng import seeded
from ..validation import check_inputs, check_positive_finite, check_positive_int

__all__ = ["MixturePredictive", "predict", "gaussian_mixture_crps"]


def _crps_A(mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    # A(mu, s^2) = 2 s phi(mu / s) + mu (2 Phi(mu / s) - 1)   (Grimit et al. 2006)
    s = var.sqrt()
    z = mu / s
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return 2 * s * phi + mu * (2 * ndtr(z) - 1)


def gaussian_mixture_crps(y, means, variances, chunk: int | None = None) -> torch.Tensor:
    """CRPS of the uniform mixture ``(1/S) sum_s N(means_s, variances_s)`` at ``y``.

    :param y: ``(N,)``; :param means, variances: ``(S, N)``. :returns: ``(N,)``.
    :param chunk: points per block of the ``(S, S, chunk)`` pairwise term; default: as many
        as keep a block to ``2**21`` entries (16 MiB in float64), whatever ``S``.
    """
    S = means.shape[0]
    if chunk is None:
        chunk = max(1, 2**21 // S**2)
    first = _crps_A(y - means, variances).mean(0)
    second = []
    for lo in range(0, means.shape[1], chunk):
        m, v = means[:, lo : lo + chunk], variances[:, lo : lo + chunk]
        pair = _crps_A(m.unsqueeze(0) - m.unsqueeze(1), v.unsqueeze(0) + v.unsqueeze(1))
        second.append(pair.sum((0, 1)) / S**2)
    return first - 0.5 * torch.cat(second)


def _check_units(y_mean, y_std, where: str) -> tuple[float, float]:
    """``(y_mean, y_std)`` as floats: ``y_mean`` finite, ``y_std`` positive and finite."""
    if y_mean is None or isinstance(y_mean, (bool, str, bytes)):
        raise TypeError(f"{where}: y_mean must be a finite number, got {y_mean!r}")
    if not math.isfinite(float(y_mean)):
        raise ValueError(f"{where}: y_mean must be finite, got {float(y_mean)}")
    return float(y_mean), check_positive_finite(y_std, f"{where}: y_std")


class MixturePredictive:
    """``p(y* | x*) = (1/S) sum_s int p(y* | f) N(f; loc_s, var_s) df`` per test point.

    :param loc, var: ``(S, N)`` last-layer marginals of the S guide draws (model units),
        ``S >= 1``, ``var >= 0``.
    :param likelihood: the model's likelihood.
    :param y_mean, y_std: affine map from model units to reporting units (``y = y_mean +
        y_std * y_model``); densities are divided by ``y_std`` accordingly. ``y_mean`` finite,
        ``y_std`` positive and finite.
    """

    def __init__(self, loc, var, likelihood: Likelihood, y_mean=0.0, y_std=1.0,
                 hyperparameters: dict[str, torch.Tensor] | None = None):
        if loc.shape != var.shape or loc.dim() != 2:
            raise ValueError(f"loc and var must both be (S, N), got {loc.shape} and {var.shape}")
        if loc.shape[0] == 0:
            raise ValueError("MixturePredictive: loc and var must hold at least one draw "
                             f"(S >= 1), got shape {tuple(loc.shape)}")
        if bool((var < 0).any()):
            raise ValueError(f"MixturePredictive: var must be non-negative, got "
                             f"{int((var < 0).sum())} negative value(s)")
        self.loc, self.var, self.likelihood = loc, var, likelihood
        self.y_mean, self.y_std = _check_units(y_mean, y_std, "MixturePredictive")
        self.hyperparameters = hyperparameters or {}

    def _fixed(self):
        """The likelihood evaluated at the draws' own hyperparameters (Bayesian noise: one per
        draw, broadcasting against ``(S, N)``), where the draws carried them."""
        return self.likelihood.fixed(self.hyperparameters)

    @property
    def num_samples(self) -> int:
        return self.loc.shape[0]

    def rescale(self, y_mean: float, y_std: float) -> MixturePredictive:
        """The same predictive reported in units ``y = y_mean + y_std * y_model``."""
        return MixturePredictive(self.loc, self.var, self.likelihood, y_mean, y_std,
                                 self.hyperparameters)

    def _component_moments(self):
        with torch.no_grad(), self._fixed():
            mean, var = self.likelihood.predictive_moments(self.loc, self.var)
        return self.y_mean + self.y_std * mean, self.y_std**2 * var

    @property
    def mean(self) -> torch.Tensor:
        """``(N,)`` predictive mean."""
        return self._component_moments()[0].mean(0)

    @property
    def variance(self) -> torch.Tensor:
        """``(N,)`` predictive variance (law of total variance over the mixture)."""
        m, v = self._component_moments()
        return v.mean(0) + m.var(0, unbiased=False)

    def _targets(self, y) -> torch.Tensor:
        """``y`` as a tensor of the predictive's ``(N,)`` shape (a ``(N, 1)`` ``y`` would
        broadcast against the ``(S, N)`` components into wrong numbers)."""
        y = torch.as_tensor(y, dtype=self.loc.dtype, device=self.loc.device)
        if y.shape != self.loc.shape[-1:]:
            hint = "; use y.squeeze(-1)" if y.shape == self.loc.shape[-1:] + (1,) else ""
            raise ValueError(f"y must have the predictive's shape {tuple(self.loc.shape[-1:])}, "
                             f"got {tuple(y.shape)}{hint}")
        return y

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` mixture log-density ``logsumexp_s log p_s(y) - log S`` (not the mean of
        per-sample log-densities)."""
        y = self._targets(y)
        z = (y - self.y_mean) / self.y_std
        with torch.no_grad(), self._fixed():
            lp = self.likelihood.predictive_log_prob(z, self.loc, self.var)
        return torch.logsumexp(lp, 0) - math.log(self.num_samples) - math.log(self.y_std)

    def _require_gaussian(self, what: str) -> None:
        if not isinstance(self.likelihood, Gaussian):
            raise NotImplementedError(
                f"{what} is implemented for Gaussian mixtures (Gaussian likelihood)"
            )

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` closed-form CRPS of the Gaussian mixture."""
        self._require_gaussian("crps")
        m, v = self._component_moments()
        return gaussian_mixture_crps(self._targets(y), m, v)

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """``(..., N)`` mixture CDF at ``y`` (broadcast against ``(N,)``)."""
        self._require_gaussian("cdf")
        m, v = self._component_moments()
        return ndtr((y.unsqueeze(-2) - m) / v.sqrt()).mean(-2)

    def quantiles(self, q, iters: int = 60) -> torch.Tensor:
        """``(Q, N)`` quantiles for probabilities ``q`` (bisection on the mixture CDF)."""
        self._require_gaussian("quantiles")
        q = torch.as_tensor(q, dtype=self.loc.dtype, device=self.loc.device).reshape(-1, 1)
        if not bool(((q > 0) & (q < 1)).all()):
            raise ValueError("quantile probabilities must lie in (0, 1)")
        m, v = self._component_moments()
        sd = v.sqrt()
        lo = (m - 12 * sd).min(0).values.expand(q.shape[0], -1).clone()
        hi = (m + 12 * sd).max(0).values.expand(q.shape[0], -1).clone()
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            below = self.cdf(mid) < q
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)


def _last_marginal(trace, site_name: str | None):
    names = [n for n, s in trace.nodes.items() if s["type"] == "sample" and function_site(s) is not None]
    if not names:
        raise ValueError("the guide produced no '<layer>.f' site")
    name = site_name or names[-1]
    source = source_of(trace.nodes[name]["value"])
    if source is None:
        raise ValueError(f"the guide did not record the Gaussian that '{name}' was drawn from")
    return source.loc, source.var


def set_up_guide(guide, args: tuple, seed: int | None, device) -> None:
    """Set ``guide`` up (its parameters, from a prototype trace of the model: a first call's
    work) before seeded draws are taken from it.

    The set-up draws from the random stream (the prototype runs the model, an autoguide may
    initialise from prior draws), so done inside the seeded block it would shift the draws
    of a first call with ``seed`` against every later one. Here it runs in a block of its own,
    seeded by ``seed`` (the caller's random state untouched) and then reseeded for the draws
    themselves. A library guide or a Pyro autoguide that is already set up, or any other
    callable, is left alone.
    """
    if isinstance(guide, LayerGuide):
        ready = guide._set_up and getattr(guide, "_inner_ready", True)  # complete(): inner too
    elif isinstance(guide, AutoGuide):
        ready = guide.prototype_trace is not None
    else:
        return
    if not ready:
        with torch.no_grad(), seeded(seed, device), poutine.block(), shared_draws(guide):
            guide(*args)


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
    """Predictive mixture at ``X`` from ``num_samples`` guide draws.

    :param model: a :class:`~pyro_dgp.DeepGP` (anything with ``.likelihood`` and layers).
    :param guide: any guide of the library (or a completed autoguide).
    :param X: ``(N, D)`` test inputs.
    :param batch_size: test points per pass (memory grows with S x batch x M).
    :param y_mean, y_std: report in units ``y_mean + y_std * y_model``.
    :param seed: draw the samples from this seed without touching the global random state.
    :returns: :class:`MixturePredictive` with ``.mean``, ``.variance``, ``.log_prob(y)``...
    """
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    batch_size = check_positive_int(batch_size, "batch_size")
    y_mean, y_std = _check_units(y_mean, y_std, "predict")
    likelihood = getattr(model, "likelihood", None)
    if likelihood is None:
        raise ValueError("predict() needs a model with a .likelihood (e.g. pyro_dgp.DeepGP)")
    if isinstance(guide, LayerGuide) and guide.model is not model:
        raise ValueError("predict: the guide was built for another model; pass the model the "
                         "guide was built for (guide.model)")
    last = model.layers[-1].name + ".f" if hasattr(model, "layers") else None
    one_pass = isinstance(guide, LayerGuide) and guide.model is model
    locs, vars_, hypers = [], [], []
    set_up_guide(guide, (X[..., :batch_size, :],), seed, X.device)
    # one U per draw for all points: per-point draws (a training estimator) would give the
    # same per-point mixtures at O(N) times the sampling cost
    with torch.no_grad(), seeded(seed, X.device), shared_draws(guide):
        for chunk in X.split(batch_size, dim=-2):
            n = chunk.shape[-2]
            with pyro.plate("_predictive_samples", S, dim=-2):
                if one_pass:  # the model's view too: its likelihood's values per draw
                    trace, model_trace = guide.traces(chunk)
                else:  # any other guide: the model replayed on its draws
                    trace = poutine.trace(guide).get_trace(chunk)
                    model_trace = poutine.trace(poutine.replay(model, trace=trace)).get_trace(
                        chunk)
                hypers.append(_likelihood_values(model_trace, S, n))
            loc, var = _last_marginal(trace, last)
            locs.append(loc.squeeze(-1).expand(S, n))
            vars_.append(var.squeeze(-1).expand(S, n))
    hyper = {}
    if hypers and all(hypers):  # per draw and point, chunk by chunk
        hyper = {k: torch.cat([h[k] for h in hypers], -1) for k in hypers[0]}
    return MixturePredictive(torch.cat(locs, -1), torch.cat(vars_, -1), likelihood, y_mean, y_std,
                             hyper)


def _likelihood_values(model_trace, S: int, n: int) -> dict[str, torch.Tensor]:
    """The likelihood's hyperparameters as the model's call read them (a guide's draws of a
    Bayesian noise: one per predictive draw), each ``(S, n)``; ``{}`` if none recorded."""
    for site in model_trace.nodes.values():
        fn = site["fn"] if site["type"] == "sample" else None
        while isinstance(fn, MaskedDistribution):
            fn = fn.base_dist
        if isinstance(fn, _Expected):
            # a point value is 0-d; a guide's draws are one per predictive draw, (S, 1)
            return {k: (v.reshape(S, 1) if v.dim() else v).expand(S, n)
                    for k, v in fn.hyperparameters.items()}
    return {}
