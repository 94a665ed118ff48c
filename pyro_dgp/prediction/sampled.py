"""Estimates from draws of a predictive mixture where no closed form exists: CRPS, CDF,
quantiles and moments.

The draws are stratified: ``draws`` of shape ``(K, S, n)`` hold ``K >= 2`` independent draws of
``y`` from each of the ``S`` equally weighted components at ``n`` points (see
:meth:`~pyro_dgp.likelihoods.Likelihood.predictive_sample`), so the pooled ``m = K S`` draws are
a sample of the uniform mixture with each component represented exactly ``K`` times.
"""

from __future__ import annotations

import torch

__all__ = ["sample_cdf", "sample_crps", "sample_moments", "sample_quantiles"]


def _check(draws: torch.Tensor) -> None:
    if draws.dim() != 3 or draws.shape[0] < 2:
        raise ValueError("draws must be (K, S, n) with K >= 2 draws per component, got shape "
                         f"{tuple(draws.shape)}")


def _pair_sum(x: torch.Tensor) -> torch.Tensor:
    """``sum_{i < j} |x_i - x_j|`` along dim 0: with ``x`` sorted, ``sum_k (2k - m + 1)
    x_(k)`` (k from 0), ``O(m log m)``."""
    m = x.shape[0]
    coef = torch.arange(1 - m, m, 2, dtype=x.dtype, device=x.device)
    return torch.tensordot(coef, x.sort(0).values, dims=1)


def sample_crps(y: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``(n,)`` unbiased estimate of the CRPS of the mixture at ``y`` (``(n,)``).

    Energy form (Gneiting and Raftery 2007): ``CRPS(F, y) = E|Y - y| - E|Y - Y'| / 2``, ``Y``,
    ``Y'`` independent draws of ``F``. The first term is the mean of ``|Y_i - y|`` over the
    stratified draws. The second, ``(1/S^2) sum_{a, b} E|Y_a - Y'_b|``, averages each pair of
    components over its independent pairs of draws: all ``K^2`` pairs across two components,
    the ``K (K - 1)`` pairs of distinct draws within one ("fair" estimator, Ferro 2014; the
    naive mean over all pairs, zero-distance self-pairs included, is biased low by about
    ``E|Y - Y'| / (2 m)``). Pair sums come from sorting (:func:`_pair_sum`), after
    centring each point's draws (differences are shift-invariant; this keeps the weighted sums
    from cancelling). Its standard error falls as ``m^{-1/2}``.
    """
    _check(draws)
    K, S, n = draws.shape
    first = (draws - y).abs().mean((0, 1))
    centred = draws - draws.mean((0, 1))
    total = 2 * _pair_sum(centred.reshape(K * S, n))  # ordered pairs of all m draws
    within = 2 * _pair_sum(centred).sum(0)  # ordered pairs inside each component
    spread = ((total - within) / K**2 + within / (K * (K - 1))) / S**2
    return first - 0.5 * spread


def sample_cdf(y: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` empirical CDF of the pooled draws at ``y`` (``(..., n)``): the fraction of
    draws ``<= y``, unbiased for the mixture's CDF."""
    _check(draws)
    K, S, n = draws.shape
    pooled = draws.reshape(K * S, n).T.sort(-1).values.contiguous()  # (n, m)
    values = y.expand(*y.shape[:-1], n).movedim(-1, 0).reshape(n, -1).contiguous()
    count = torch.searchsorted(pooled, values, right=True)
    return (count.to(draws.dtype) / (K * S)).reshape(n, *y.shape[:-1]).movedim(0, -1)


def sample_quantiles(q: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``(Q, n)`` quantiles of the pooled draws for probabilities ``q`` (``(Q,)``, in (0, 1)):
    the generalised inverse of the empirical CDF, ``inf {y : F_m(y) >= q}``, the
    ``ceil(q m)``-th smallest draw (a draw itself, so a discrete predictive gets values of
    its support)."""
    _check(draws)
    K, S, n = draws.shape
    m = K * S
    index = torch.ceil(q * m).long() - 1  # q in (0, 1): ceil(q m) in [1, m]
    return draws.reshape(m, n).sort(0).values[index]


def sample_moments(draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, variance)``, each ``(n,)``, unbiased estimates of the mixture's.

    The mean is that of all ``m`` draws. For the variance ``sigma^2``: with ``v_s`` the
    components' variances and ``vbar`` their mean, ``E sum_i (Y_i - Ybar)^2 = m sigma^2 -
    m Var(Ybar) = m sigma^2 - vbar`` for stratified draws, so ``(sum_i (Y_i - Ybar)^2 + vhat) /
    m`` is unbiased, ``vhat`` the mean of the components' unbiased sample variances (with one
    component, the usual ``m - 1`` divisor). The law of total variance over component means
    estimated from ``K`` draws each would instead add their noise, ``~ vbar / K``.
    """
    _check(draws)
    K, S, n = draws.shape
    pooled = draws.reshape(K * S, n)
    mean = pooled.mean(0)
    within = draws.var(0).mean(0)
    return mean, ((pooled - mean).square().sum(0) + within) / (K * S)
