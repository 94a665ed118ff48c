"""The predictive distribution of a deep GP: a mixture over ``S`` guide draws, each the
likelihood integrated against the last layer's Gaussian of that draw (Salimbeni and Deisenroth
2017), uniform or with weights (the learned quadrature of Meng and Zhang 2024), with its
closed-form CRPS for a Gaussian likelihood (Grimit et al. 2006) or a binary one (the Brier
score), and estimates from seeded draws for any other likelihood."""

from __future__ import annotations

import math

import torch
from torch.special import ndtr

from ..likelihoods import Likelihood
from ..rng import seeded
from ..validation import binary_labels, check_positive_finite, check_positive_int
from .sampled import sample_cdf, sample_crps, sample_moments, sample_quantiles

__all__ = ["ComponentMoments", "MixturePredictive", "bernoulli_cdf", "bernoulli_quantiles",
           "check_units", "check_weights", "gaussian_mixture_cdf", "gaussian_mixture_crps",
           "gaussian_mixture_quantiles", "mixture_average"]

#: entries of ``y`` drawn per block of points (``K S n``): 32 MiB of float64 draws
_DRAW_BLOCK = 2**22


def _crps_A(mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    # A(mu, s^2) = 2 s phi(mu / s) + mu (2 Phi(mu / s) - 1)   (Grimit et al. 2006)
    s = var.sqrt()
    z = mu / s
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return 2 * s * phi + mu * (2 * ndtr(z) - 1)


def gaussian_mixture_crps(y, means, variances, chunk: int | None = None,
                          weights: torch.Tensor | None = None) -> torch.Tensor:
    """CRPS of the mixture ``sum_s w_s N(means_s, variances_s)`` at ``y`` (Grimit et al. 2006):
    ``sum_s w_s A(y - mu_s, s_s^2) - 1/2 sum_{i,j} w_i w_j A(mu_i - mu_j, s_i^2 + s_j^2)``.

    :param y: ``(N,)``; :param means, variances: ``(S, N)``. :returns: ``(N,)``.
    :param weights: ``(S, 1)`` or ``(S, N)`` summing to one over ``S``
        (:func:`check_weights`); ``None``: uniform, ``w_s = 1/S``.
    :param chunk: points per block of the ``(S, S, chunk)`` pairwise term; default: as many
        as keep a block to ``2**21`` entries (16 MiB in float64), whatever ``S``.
    """
    S = means.shape[0]
    if chunk is None:
        chunk = max(1, 2**21 // S**2)
    first = _crps_A(y - means, variances)
    first = first.mean(0) if weights is None else (weights * first).sum(0)
    second = []
    for lo in range(0, means.shape[1], chunk):
        m, v = means[:, lo : lo + chunk], variances[:, lo : lo + chunk]
        pair = _crps_A(m.unsqueeze(0) - m.unsqueeze(1), v.unsqueeze(0) + v.unsqueeze(1))
        if weights is None:
            second.append(pair.sum((0, 1)) / S**2)
        else:
            w = weights[:, lo : lo + chunk] if weights.shape[-1] > 1 else weights
            second.append((w.unsqueeze(0) * w.unsqueeze(1) * pair).sum((0, 1)))
    return first - 0.5 * torch.cat(second)


def mixture_average(t: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``sum_s w_s t_s`` over dim -2 of ``t (..., S, N)`` (``weights`` ``(S, 1)`` or ``(S, N)``);
    ``None``: the mean, ``w_s = 1/S``."""
    return t.mean(-2) if weights is None else (weights * t).sum(-2)


def gaussian_mixture_cdf(y: torch.Tensor, means: torch.Tensor, variances: torch.Tensor,
                         weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(..., N)`` CDF ``sum_s w_s Phi((y - mu_s) / s_s)`` of the mixture of normals at ``y``
    (``(..., N)``); ``means``, ``variances`` ``(S, N)``."""
    return mixture_average(ndtr((y.unsqueeze(-2) - means) / variances.sqrt()), weights)


def gaussian_mixture_quantiles(q: torch.Tensor, means: torch.Tensor, variances: torch.Tensor,
                               weights: torch.Tensor | None = None,
                               iters: int = 60) -> torch.Tensor:
    """``(Q, N)`` quantiles of the mixture of normals for probabilities ``q`` ``(Q, 1)``:
    bisection on its CDF (``iters`` halvings) from ``[min_s mu_s - 12 s_s, max_s mu_s + 12
    s_s]``, which holds every quantile in ``(0, 1)`` representable in float64."""
    sd = variances.sqrt()
    lo = (means - 12 * sd).min(0).values.expand(q.shape[0], -1).clone()
    hi = (means + 12 * sd).max(0).values.expand(q.shape[0], -1).clone()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = gaussian_mixture_cdf(mid, means, variances, weights) < q
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def bernoulli_cdf(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``(..., N)`` CDF of ``Bernoulli(p)`` (``p`` ``(N,)`` the probability of 1) at ``z``."""
    return torch.where(z < 0, 0.0, torch.where(z < 1, 1 - p, 1.0)).to(p.dtype)


def bernoulli_quantiles(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``(Q, N)`` quantiles ``inf {y : F(y) >= q}`` of ``Bernoulli(p)`` for ``q`` ``(Q, 1)``:
    1 where ``q > 1 - p``, else 0."""
    return (q > 1 - p).to(q.dtype)


def check_weights(weights, S: int, N: int, like: torch.Tensor) -> torch.Tensor | None:
    """Mixture weights as ``(S, 1)`` (shared by the points) or ``(S, N)`` (per point), in
    ``like``'s dtype and device; ``None`` stays ``None`` (uniform).

    :param weights: ``(S,)``, ``(S, 1)`` or ``(S, N)``, non-negative and finite, summing to
        one over ``S`` (to ``sqrt(eps)`` of the dtype; they are not renormalised).
    :raises ValueError: naming the shape or the values that are wrong.
    """
    if weights is None:
        return None
    w = torch.as_tensor(weights).to(dtype=like.dtype, device=like.device)
    if w.dim() == 1:
        w = w.unsqueeze(-1)
    if w.dim() != 2 or w.shape[0] != S or w.shape[1] not in (1, N):
        raise ValueError(f"MixturePredictive: weights must be (S,), (S, 1) or (S, N) with S = "
                         f"{S}, N = {N}, got shape {tuple(torch.as_tensor(weights).shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("MixturePredictive: weights must be finite and non-negative")
    total = w.sum(0)
    tol = torch.finfo(w.dtype).eps ** 0.5
    if bool(((total - 1).abs() > tol).any()):
        worst = float(total[(total - 1).abs().argmax()])
        raise ValueError(f"MixturePredictive: weights must sum to one over the S components, "
                         f"got a sum of {worst}")
    return w


def check_units(y_mean, y_std, where: str) -> tuple[float, float]:
    """``(y_mean, y_std)`` as floats: ``y_mean`` finite, ``y_std`` positive and finite."""
    if y_mean is None or isinstance(y_mean, (bool, str, bytes)):
        raise TypeError(f"{where}: y_mean must be a finite number, got {y_mean!r}")
    if not math.isfinite(float(y_mean)):
        raise ValueError(f"{where}: y_mean must be finite, got {float(y_mean)}")
    return float(y_mean), check_positive_finite(y_std, f"{where}: y_std")



class ComponentMoments:
    """The mean and variance of a mixture predictive from its components' moments
    (``_component_moments() -> (m, v)``, each ``(S, N)`` in reporting units, or
    ``NotImplementedError``), its ``weights`` and, where the components have no moments, its
    draws (``_over_draws``, in model units, scaled by ``y_mean`` and ``y_std``)."""

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N,)`` mean and variance in reporting units: the law of total variance over the
        components' moments, ``sum_s w_s v_s + sum_s w_s (m_s - mean)^2``, or the draws'
        where the likelihood has none."""
        try:
            m, v = self._component_moments()
        except NotImplementedError:
            mean, var = self._over_draws(
                lambda draws, _, w: torch.stack(sample_moments(draws, w)))
            return self.y_mean + self.y_std * mean, self.y_std**2 * var
        if self.weights is None:
            return m.mean(0), v.mean(0) + m.var(0, unbiased=False)
        mean = mixture_average(m, self.weights)
        return mean, mixture_average(v, self.weights) + mixture_average(
            (m - mean).square(), self.weights)

    @property
    def mean(self) -> torch.Tensor:
        """``(N,)`` predictive mean (``p(y = 1)`` for a binary predictive)."""
        return self._moments()[0]

    @property
    def variance(self) -> torch.Tensor:
        """``(N,)`` predictive variance (law of total variance over the mixture)."""
        return self._moments()[1]


class MixturePredictive(ComponentMoments):
    """``p(y* | x*) = sum_s w_s int p(y* | f) N(f; loc_s, var_s) df`` per test point, with
    ``w_s = 1/S`` or given weights.

    Closed forms where the likelihood has them (``docs/likelihoods.md``): the log-density
    (``predictive_log_prob``), mean and variance (``predictive_moments``), and the CRPS, CDF and
    quantiles of a Gaussian (``gaussian_predictive``) or binary (``binary``) predictive. Else
    they are estimated from draws of ``y`` (``predictive_sample``): ``K = max(2, ceil(mc_samples
    / S))`` per component and point, from the seed ``mc_seed``, so each estimate is the same at
    every call and torch's global random state is left as it was (see :mod:`.sampled`).

    :param loc, var: ``(S, N)`` last-layer marginals of the S guide draws (model units),
        ``S >= 1``, ``var >= 0``.
    :param likelihood: the model's likelihood.
    :param y_mean, y_std: affine map from model units to reporting units (``y = y_mean +
        y_std * y_model``); densities are divided by ``y_std`` accordingly. ``y_mean`` finite,
        ``y_std`` positive and finite.
    :param hyperparameters: the likelihood's values per draw (each broadcasting against
        ``(S, N)``), as :func:`~pyro_dgp.predict` records them.
    :param mc_samples: draws per point for the estimates (default 1000; their standard error
        falls as ``mc_samples^{-1/2}``).
    :param mc_seed: seed of those draws; ``None`` draws from the global random state.
    :param weights: the components' weights, ``(S,)`` or per point ``(S, N)``, summing to
        one (:func:`check_weights`); ``None``: uniform. Every closed form and estimate is
        that of the weighted mixture.
    """

    def __init__(self, loc, var, likelihood: Likelihood, y_mean=0.0, y_std=1.0,
                 hyperparameters: dict[str, torch.Tensor] | None = None,
                 mc_samples: int = 1000, mc_seed: int | None = 0, weights=None):
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
        self.mc_samples = check_positive_int(mc_samples, "MixturePredictive: mc_samples")
        self.mc_seed = (None if mc_seed is None else
                        check_positive_int(mc_seed, "MixturePredictive: mc_seed", allow_zero=True))
        #: ``(S, 1)`` or ``(S, N)`` weights of the components, or ``None`` (uniform)
        self.weights = check_weights(weights, *loc.shape, loc)

    def _average(self, t: torch.Tensor) -> torch.Tensor:
        """``sum_s w_s t_s`` over dim -2 of ``t (..., S, N)``: the mean for uniform weights."""
        return mixture_average(t, self.weights)

    @property
    def binary(self) -> bool:
        """Whether ``y`` holds 0/1 labels: the predictive is Bernoulli (the likelihood's
        ``binary``)."""
        return bool(self.likelihood.binary)

    def class_probabilities(self) -> torch.Tensor:
        """``(N, 2)`` ``(p(y = 0), p(y = 1))`` of a binary predictive.

        :raises ValueError: the likelihood is not binary."""
        if not self.binary:
            raise ValueError(f"class_probabilities needs a binary predictive; this one's "
                             f"likelihood ({type(self.likelihood).__name__}) is not binary")
        p = self._bernoulli_p()
        return torch.stack([1 - p, p], -1)

    def _fixed(self):
        """The likelihood evaluated at the draws' own hyperparameters (Bayesian noise: one per
        draw, broadcasting against ``(S, N)``), where the draws carried them."""
        return self.likelihood.fixed(self.hyperparameters)

    @property
    def num_samples(self) -> int:
        return self.loc.shape[0]

    @property
    def draws_per_component(self) -> int:
        """``K``: draws of ``y`` per component and point for the sampled estimates."""
        return max(2, math.ceil(self.mc_samples / self.num_samples))

    def rescale(self, y_mean: float, y_std: float) -> MixturePredictive:
        """The same predictive reported in units ``y = y_mean + y_std * y_model``."""
        return MixturePredictive(self.loc, self.var, self.likelihood, y_mean, y_std,
                                 self.hyperparameters, self.mc_samples, self.mc_seed,
                                 self.weights)

    def _model_moments(self):
        """``(S, N)`` mean and variance of each component in model units."""
        with torch.no_grad(), self._fixed():
            return self.likelihood.predictive_moments(self.loc, self.var)

    def _component_moments(self):
        mean, var = self._model_moments()
        return self.y_mean + self.y_std * mean, self.y_std**2 * var

    def _over_draws(self, fn) -> torch.Tensor:
        """``fn(draws, points, weights)`` over blocks of points, concatenated along the last
        dim: ``draws`` ``(K, S, n)`` of ``y`` in model units at the points ``points`` (a slice),
        from ``mc_seed``; the likelihood's per-point hyperparameters (``(S, N)``) and the
        weights (``None``, ``(S, 1)`` or ``(S, n)``) sliced alike."""
        S, N = self.loc.shape
        K = self.draws_per_component
        step = max(1, _DRAW_BLOCK // (K * S))
        out = []
        with torch.no_grad(), seeded(self.mc_seed, self.loc.device):
            for lo in range(0, N, step):
                points = slice(lo, min(N, lo + step))
                hyper = {k: v[..., points] if v.dim() and v.shape[-1] == N else v
                         for k, v in self.hyperparameters.items()}
                with self.likelihood.fixed(hyper):
                    draws = self.likelihood.predictive_sample(self.loc[:, points],
                                                              self.var[:, points], K)
                w = self.weights
                if w is not None and w.shape[-1] == N:
                    w = w[:, points]
                out.append(fn(draws, points, w))
        return torch.cat(out, -1)

    def check_targets(self, y) -> torch.Tensor:
        """``y`` as a tensor of the predictive's ``(N,)`` shape (a ``(N, 1)`` ``y`` would
        broadcast against the ``(S, N)`` components into wrong numbers), in its dtype.

        For a binary likelihood ``y`` holds labels coded 0/1 or -1/1 (floating-point, integer
        or boolean), as :func:`~pyro_dgp.metrics.accuracy` reads them: any other value would
        be scored as one of the classes (the probit's ``log p(y)`` reads ``y > 0.5`` as
        class 1), so it is refused with a ``ValueError`` naming the values."""
        y = torch.as_tensor(y, dtype=self.loc.dtype, device=self.loc.device)
        if y.shape != self.loc.shape[-1:]:
            hint = "; use y.squeeze(-1)" if y.shape == self.loc.shape[-1:] + (1,) else ""
            raise ValueError(f"y must have the predictive's shape {tuple(self.loc.shape[-1:])}, "
                             f"got {tuple(y.shape)}{hint}")
        if self.likelihood.binary:  # as 0/1: rmse and coverage compare y with p(y = 1)
            ones = binary_labels((y - self.y_mean) / self.y_std).to(y.dtype)
            y = ones * self.y_std + self.y_mean
        return y

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` mixture log-density ``logsumexp_s (log p_s(y) + log w_s)``, ``log w_s =
        -log S`` for uniform weights (not the mean of per-sample log-densities)."""
        y = self.check_targets(y)
        z = (y - self.y_mean) / self.y_std
        with torch.no_grad(), self._fixed():
            lp = self.likelihood.predictive_log_prob(z, self.loc, self.var)
        if self.weights is None:
            return torch.logsumexp(lp, 0) - math.log(self.num_samples) - math.log(self.y_std)
        return torch.logsumexp(lp + self.weights.log(), 0) - math.log(self.y_std)

    def _bernoulli_p(self) -> torch.Tensor:
        """``(N,)`` ``p(y = 1)`` of a binary likelihood's mixture, a Bernoulli (model units)."""
        return self._average(self._model_moments()[0])

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` CRPS at ``y``: closed form for a Gaussian mixture (Grimit et al. 2006) and
        for a binary likelihood (the Brier score ``(p - 1{y = 1})^2``, labels 0/1 or -1/1);
        otherwise the unbiased estimate from ``mc_samples`` draws
        (:func:`~pyro_dgp.prediction.sampled.sample_crps`)."""
        y = self.check_targets(y)
        if self.likelihood.gaussian_predictive:
            m, v = self._component_moments()
            return gaussian_mixture_crps(y, m, v, weights=self.weights)
        z = (y - self.y_mean) / self.y_std
        if self.likelihood.binary:
            p = self._bernoulli_p()
            return self.y_std * (p - binary_labels(z).to(p.dtype)).square()
        return self.y_std * self._over_draws(
            lambda draws, points, w: sample_crps(z[points], draws, w))

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """``(..., N)`` mixture CDF at ``y`` (broadcast against ``(N,)``): closed form for a
        Gaussian or binary predictive, else the empirical CDF of ``mc_samples`` draws."""
        if self.likelihood.gaussian_predictive:
            return gaussian_mixture_cdf(y, *self._component_moments(), self.weights)
        z = (y - self.y_mean) / self.y_std
        z = z.expand(*z.shape[:-1], self.loc.shape[-1])
        if self.likelihood.binary:
            return bernoulli_cdf(z, self._bernoulli_p())
        return self._over_draws(lambda draws, points, w: sample_cdf(z[..., points], draws, w))

    def quantiles(self, q, iters: int = 60) -> torch.Tensor:
        """``(Q, N)`` quantiles for probabilities ``q``: bisection on a Gaussian mixture's CDF
        (``iters`` steps), ``inf {y : F(y) >= q}`` of a binary one, else the quantiles of
        ``mc_samples`` draws (:func:`~pyro_dgp.prediction.sampled.sample_quantiles`)."""
        q = torch.as_tensor(q, dtype=self.loc.dtype, device=self.loc.device).reshape(-1, 1)
        if not bool(((q > 0) & (q < 1)).all()):
            raise ValueError("quantile probabilities must lie in (0, 1)")
        if self.likelihood.gaussian_predictive:
            return gaussian_mixture_quantiles(q, *self._component_moments(), self.weights, iters)
        if self.likelihood.binary:
            z = bernoulli_quantiles(q, self._bernoulli_p())
        else:
            z = self._over_draws(lambda draws, _, w: sample_quantiles(q.reshape(-1), draws, w))
        return self.y_mean + self.y_std * z
