"""Estimates from draws of a predictive mixture where no closed form exists: CRPS, CDF,
quantiles and moments.

The draws are stratified: ``draws`` of shape ``(K, S, n)`` hold ``K >= 2`` independent draws of
``y`` from each of the ``S`` equally weighted components at ``n`` points (see
:meth:`~pyro_dgp.likelihoods.Likelihood.predictive_sample`), so the pooled ``m = K S`` draws are
a sample of the uniform mixture with each component represented exactly ``K`` times.

Each estimate also takes mixture ``weights`` ``w_s`` (``(S, 1)`` or ``(S, n)``, summing to one
over ``s``; ``None``: uniform): draw ``k`` of component ``s`` then carries the weight
``w_s / K``, which keeps every estimate unbiased for the weighted mixture
``sum_s w_s F_s``.
"""

from __future__ import annotations

import torch

__all__ = ["sample_cdf", "sample_crps", "sample_moments", "sample_quantiles"]


def _check(draws: torch.Tensor) -> None:
    if draws.dim() != 3 or draws.shape[0] < 2:
        raise ValueError("draws must be (K, S, n) with K >= 2 draws per component, got shape "
                         f"{tuple(draws.shape)}")


def _draw_weights(weights: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """``(K, S, n)``: the weight ``w_s / K`` of each draw."""
    K = draws.shape[0]
    return (weights / K).expand(draws.shape[1:]).unsqueeze(0).expand(draws.shape)


def _weighted_pair_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum_{i < j} w_i w_j |x_i - x_j|`` along dim 0, ``O(m log m)``: with ``x`` sorted,
    ``sum_j w_j (x_j W_j - V_j)`` where ``W_j = sum_{i < j} w_i`` and ``V_j = sum_{i < j} w_i
    x_i``."""
    xs, order = x.sort(0)
    ws = w.gather(0, order)
    wx = ws * xs
    W = ws.cumsum(0) - ws
    V = wx.cumsum(0) - wx
    return (wx * W - ws * V).sum(0)


def _pair_sum(x: torch.Tensor) -> torch.Tensor:
    """``sum_{i < j} |x_i - x_j|`` along dim 0: with ``x`` sorted, ``sum_k (2k - m + 1)
    x_(k)`` (k from 0), ``O(m log m)``."""
    m = x.shape[0]
    coef = torch.arange(1 - m, m, 2, dtype=x.dtype, device=x.device)
    return torch.tensordot(coef, x.sort(0).values, dims=1)


def sample_crps(y: torch.Tensor, draws: torch.Tensor,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(n,)`` unbiased estimate of the CRPS of the mixture at ``y`` (``(n,)``).

    Energy form (Gneiting and Raftery 2007): ``CRPS(F, y) = E|Y - y| - E|Y - Y'| / 2``, ``Y``,
    ``Y'`` independent draws of ``F``. The first term is the mean of ``|Y_i - y|`` over the
    stratified draws (weighted: ``sum_s w_s`` of each component's mean). The second,
    ``(1/S^2) sum_{a, b} E|Y_a - Y'_b|``, averages each pair of components over its
    independent pairs of draws: all ``K^2`` pairs across two components, the ``K (K - 1)``
    pairs of distinct draws within one ("fair" estimator, Ferro 2014; the naive mean over all
    pairs, zero-distance self-pairs included, is biased low by about ``E|Y - Y'| / (2 m)``).
    With weights, ``1/S^2`` becomes ``w_a w_b``: the pair sum over all draws weighs each by
    ``w_s / K``, and the pairs within a component are reweighted from ``w_s^2 / K^2`` to
    ``w_s^2 / (K (K - 1))``. Pair sums come from sorting (:func:`_pair_sum`), after centring
    each point's draws (differences are shift-invariant; this keeps the weighted sums from
    cancelling). Its standard error falls as ``m^{-1/2}``.
    """
    _check(draws)
    K, S, n = draws.shape
    centred = draws - draws.mean((0, 1))
    within = 2 * _pair_sum(centred)  # (S, n): ordered pairs inside each component
    if weights is None:
        first = (draws - y).abs().mean((0, 1))
        total = 2 * _pair_sum(centred.reshape(K * S, n))  # ordered pairs of all m draws
        spread = ((total - within.sum(0)) / K**2 + within.sum(0) / (K * (K - 1))) / S**2
        return first - 0.5 * spread
    w = _draw_weights(weights, draws)
    first = (w * (draws - y).abs()).sum((0, 1))
    total = 2 * _weighted_pair_sum(centred.reshape(K * S, n), w.reshape(K * S, n))
    w2 = weights.expand(S, n).square()
    spread = total - (w2 * within).sum(0) / K**2 + (w2 * within).sum(0) / (K * (K - 1))
    return first - 0.5 * spread


def sample_cdf(y: torch.Tensor, draws: torch.Tensor,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(..., n)`` empirical CDF of the pooled draws at ``y`` (``(..., n)``): the fraction
    (weighted: the total weight) of draws ``<= y``, unbiased for the mixture's CDF."""
    _check(draws)
    K, S, n = draws.shape
    pooled, order = draws.reshape(K * S, n).T.sort(-1)  # (n, m)
    values = y.expand(*y.shape[:-1], n).movedim(-1, 0).reshape(n, -1).contiguous()
    count = torch.searchsorted(pooled.contiguous(), values, right=True)
    if weights is None:
        cdf = count.to(draws.dtype) / (K * S)
    else:  # the cumulative weight of the `count` smallest draws
        w = _draw_weights(weights, draws).reshape(K * S, n).T.gather(-1, order)
        cum = torch.cat([w.new_zeros(n, 1), w.cumsum(-1)], -1)
        cdf = cum.gather(-1, count)
    return cdf.reshape(n, *y.shape[:-1]).movedim(0, -1)


def sample_quantiles(q: torch.Tensor, draws: torch.Tensor,
                     weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(Q, n)`` quantiles of the pooled draws for probabilities ``q`` (``(Q,)``, in (0, 1)):
    the generalised inverse of the empirical CDF, ``inf {y : F_m(y) >= q}``, the
    ``ceil(q m)``-th smallest draw (a draw itself, so a discrete predictive gets values of
    its support); weighted: the smallest draw whose cumulative weight reaches ``q``."""
    _check(draws)
    K, S, n = draws.shape
    m = K * S
    pooled, order = draws.reshape(m, n).sort(0)
    if weights is None:
        index = torch.ceil(q * m).long() - 1  # q in (0, 1): ceil(q m) in [1, m]
        return pooled[index]
    cum = _draw_weights(weights, draws).reshape(m, n).gather(0, order).cumsum(0)  # (m, n)
    target = q.reshape(-1, 1).expand(-1, n).T.contiguous()  # (n, Q)
    index = torch.searchsorted(cum.T.contiguous(), target).clamp_max(m - 1)  # (n, Q)
    return pooled.gather(0, index.T)


def sample_moments(draws: torch.Tensor,
                   weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, variance)``, each ``(n,)``, unbiased estimates of the mixture's.

    The mean is that of all ``m`` draws. For the variance ``sigma^2``: with ``v_s`` the
    components' variances and ``vbar`` their mean, ``E sum_i (Y_i - Ybar)^2 = m sigma^2 -
    m Var(Ybar) = m sigma^2 - vbar`` for stratified draws, so ``(sum_i (Y_i - Ybar)^2 + vhat) /
    m`` is unbiased, ``vhat`` the mean of the components' unbiased sample variances (with one
    component, the usual ``m - 1`` divisor). The law of total variance over component means
    estimated from ``K`` draws each would instead add their noise, ``~ vbar / K``.

    Weighted: the mean is ``Ybar = sum_s w_s Ybar_s``, and ``E sum_i (w_s(i) / K) (Y_i -
    Ybar)^2 = sigma^2 - Var(Ybar) = sigma^2 - sum_s w_s^2 v_s / K``, so the weighted sum of
    squares plus ``sum_s w_s^2 vhat_s / K`` is unbiased (uniform weights: the form above).
    """
    _check(draws)
    K, S, n = draws.shape
    if weights is None:
        pooled = draws.reshape(K * S, n)
        mean = pooled.mean(0)
        within = draws.var(0).mean(0)
        return mean, ((pooled - mean).square().sum(0) + within) / (K * S)
    w = _draw_weights(weights, draws)
    mean = (w * draws).sum((0, 1))
    squares = (w * (draws - mean).square()).sum((0, 1))
    return mean, squares + (weights.square() * draws.var(0)).sum(0) / K
