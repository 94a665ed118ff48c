"""The predictive distribution of a deep GP: a uniform mixture over ``S`` guide draws, each
the likelihood integrated against the last layer's Gaussian of that draw (Salimbeni and
Deisenroth 2017), with its closed-form CRPS for a Gaussian likelihood (Grimit et al. 2006)."""

from __future__ import annotations

import math

import torch
from torch.special import ndtr

from ..likelihoods import Gaussian, Likelihood
from ..validation import check_positive_finite

__all__ = ["MixturePredictive", "check_units", "gaussian_mixture_crps"]


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


def check_units(y_mean, y_std, where: str) -> tuple[float, float]:
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
        self.y_mean, self.y_std = check_units(y_mean, y_std, "MixturePredictive")
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

    def check_targets(self, y) -> torch.Tensor:
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
        y = self.check_targets(y)
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
        return gaussian_mixture_crps(self.check_targets(y), m, v)

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
