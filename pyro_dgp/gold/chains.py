"""Combining NUTS chains that sit in different modes: group the chains that agree, weigh the
groups by stacking (Yao, Vehtari and Gelman 2022).

NUTS does not cross between well-separated modes, so a share of chains per mode says little
about the modes' masses. Following Yao, Vehtari and Gelman (2022), the chains are instead
combined by stacking: the weights of the mixture of the chains' predictive distributions that
predicts the held-out data best, here each training point left out in turn (PSIS-LOO,
Vehtari, Gelman and Gabry 2017). Chains in the same mode are first pooled into one group:

1. **Groups.** Chains ``a`` and ``b`` agree where the rank-normalised split-R-hat (Vehtari et
   al. 2021; ``arviz_stats``) of the two chains together is below ``threshold`` for every
   sampled quantity; the groups are the connected components of that relation.
2. **Weights.** Per group, ``log p(y_n | y_-n)`` from its pooled draws by Pareto-smoothed
   importance sampling of the draws' leave-one-out log-likelihoods, and the groups' weights
   are :func:`~pyro_dgp.stacking.stacking_weights` of those ``(N, G)`` values. Stacking
   weights are not the modes' posterior masses (for two mirror-image modes that predict the
   data equally well, any weights predict equally well); they weigh what the modes predict.
3. **Diagnostics per group.** The largest R-hat and the smallest bulk ESS per chain over the
   sampled quantities, within the group only. A group with R-hat above 1.01 or fewer than 100
   effective draws per chain (Vehtari et al. 2021) raises :class:`GoldMixingWarning`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from arviz_stats.base import array_stats

from ..stacking import stacking_weights

__all__ = ["GROUP_THRESHOLD", "MAX_R_HAT", "MIN_ESS_PER_CHAIN", "MIN_PSIS_DRAWS", "ChainGroups",
           "GoldMixingWarning", "combine_chains", "group_chains"]

#: chains whose pairwise split-R-hat is below this for every quantity are one group
GROUP_THRESHOLD = 1.1
#: the largest R-hat within a group, and the fewest effective draws per chain, without a
#: warning (Vehtari, Gelman, Simpson, Carpenter and Burkner 2021)
MAX_R_HAT = 1.01
MIN_ESS_PER_CHAIN = 100
#: the fewest draws of a group PSIS smooths (its Pareto tail needs at least 5)
MIN_PSIS_DRAWS = 25


class GoldMixingWarning(UserWarning):
    """A group of chains of the gold standard did not mix: its draws are not yet a reliable
    picture of its mode. Run longer chains (``num_samples``, ``warmup_steps``)."""


@dataclass
class ChainGroups:
    """Chains grouped by agreement, weighed by stacking.

    :ivar groups: the chains of each group (indices into the chains), ``G`` groups.
    :ivar weights: ``(G,)`` stacking weights of the groups, on the simplex.
    :ivar r_hat: per group, the largest rank-normalised split-R-hat over the quantities.
    :ivar ess_per_chain: per group, the smallest bulk ESS over the quantities over its chains.
    :ivar khat: per group, the largest Pareto ``k`` of its leave-one-out weights (above 0.7
        the group's LOO value of a point is unreliable).
    :ivar elpd_loo: ``(N, G)`` each group's ``log p(y_n | y_-n)``, the stacking's input.
    """

    groups: list[list[int]]
    weights: torch.Tensor
    r_hat: list[float]
    ess_per_chain: list[float]
    khat: list[float]
    elpd_loo: torch.Tensor


def _split_r_hat(draws: np.ndarray) -> np.ndarray:
    """``(T,)`` rank-normalised split-R-hat of ``draws`` ``(C, S, T)``; one chain is split
    into its halves first (``arviz_stats`` needs two chains)."""
    if draws.shape[0] == 1:
        half = draws.shape[1] // 2
        draws = np.stack([draws[0, :half], draws[0, half:2 * half]])
    return np.asarray(array_stats.rhat(draws, chain_axis=0, draw_axis=1))


def group_chains(draws: torch.Tensor, threshold: float = GROUP_THRESHOLD) -> list[list[int]]:
    """Groups of chains that agree (module docstring, step 1).

    :param draws: ``(C, S, T)``: ``S`` draws of ``T`` quantities per chain, ``S >= 4``.
    :returns: the groups, each a sorted list of chain indices, ordered by their first chain.
    """
    x = draws.detach().cpu().double().numpy()
    C = x.shape[0]
    parent = list(range(C))

    def root(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    for a in range(C):
        for b in range(a + 1, C):
            r = _split_r_hat(x[[a, b]])
            if np.all(r < threshold):
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for c in range(C):
        groups.setdefault(root(c), []).append(c)
    return sorted(groups.values())


def _psis_loo(loo_log_lik: np.ndarray) -> tuple[np.ndarray, float]:
    """``(N,)`` PSIS-LOO ``log p(y_n | y_-n)`` from ``(S, N)`` draws of
    ``log p(y_n | y_-n, theta_s)``, and the largest Pareto ``k``. Under
    :data:`MIN_PSIS_DRAWS` draws (too few to fit the Pareto tail) the raw importance weights
    are used and ``k`` is NaN; a point whose values are the same in every draw has equal
    weights (and no ``k``)."""
    log_w = -loo_log_lik.T  # (N, S): the importance ratios 1 / p(y_n | y_-n, theta_s)
    varies = np.ptp(log_w, axis=-1) > 0
    khat = np.full(log_w.shape[0], np.nan)
    if loo_log_lik.shape[0] >= MIN_PSIS_DRAWS and varies.any():
        log_w[varies], khat[varies] = array_stats.psislw(log_w[varies], axis=-1)
    log_w = log_w - np.logaddexp.reduce(log_w, axis=-1, keepdims=True)
    smoothed = khat[~np.isnan(khat)]
    worst = float(np.max(smoothed)) if smoothed.size else float("nan")
    return np.logaddexp.reduce(log_w + loo_log_lik.T, axis=-1), worst


def combine_chains(draws: torch.Tensor, loo_log_lik: torch.Tensor,
                   threshold: float = GROUP_THRESHOLD, warn: bool = True) -> ChainGroups:
    """Group the chains, weigh the groups by stacking, diagnose each (module docstring).

    :param draws: ``(C, S, T)``: the chains' draws of ``T`` quantities (the sampled sites,
        flattened).
    :param loo_log_lik: ``(C, S, N)``: per draw, ``log p(y_n | y_-n, theta)`` at each training
        point (``log p(y_n | theta)`` where the points are independent given a draw).
    :param warn: raise :class:`GoldMixingWarning` for each group that did not mix.
    """
    if draws.dim() != 3 or loo_log_lik.dim() != 3 or draws.shape[:2] != loo_log_lik.shape[:2]:
        raise ValueError(f"draws must be (C, S, T) and loo_log_lik (C, S, N) with the same C "
                         f"and S, got {tuple(draws.shape)} and {tuple(loo_log_lik.shape)}")
    if draws.shape[1] < 4:
        raise ValueError(f"combining chains needs at least 4 draws per chain (split-R-hat), "
                         f"got {draws.shape[1]}")
    groups = group_chains(draws, threshold)
    x = draws.detach().cpu().double().numpy()
    ll = loo_log_lik.detach().cpu().double().numpy()
    r_hat, ess, khat, elpd = [], [], [], []
    for group in groups:
        r_hat.append(float(np.max(_split_r_hat(x[group]))))
        bulk = np.asarray(array_stats.ess(x[group], chain_axis=0, draw_axis=1))
        ess.append(float(np.min(bulk)) / len(group))
        lpd, k = _psis_loo(ll[group].reshape(-1, ll.shape[-1]))
        elpd.append(lpd)
        khat.append(k)
    elpd_loo = torch.as_tensor(np.stack(elpd, -1), dtype=loo_log_lik.dtype,
                               device=loo_log_lik.device)
    out = ChainGroups(groups, stacking_weights(elpd_loo), r_hat, ess, khat, elpd_loo)
    if warn:
        for g, group in enumerate(groups):
            if not (out.r_hat[g] <= MAX_R_HAT and out.ess_per_chain[g] >= MIN_ESS_PER_CHAIN):
                warnings.warn(
                    f"gold standard: the group of chains {group} did not mix (R-hat "
                    f"{out.r_hat[g]:.3f}, above {MAX_R_HAT} is poor; bulk ESS "
                    f"{out.ess_per_chain[g]:.0f} per chain, below {MIN_ESS_PER_CHAIN} is too "
                    "few): run longer chains (num_samples, warmup_steps)",
                    GoldMixingWarning, stacklevel=3)
    return out
