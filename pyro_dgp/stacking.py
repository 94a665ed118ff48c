"""Stacking weights: the mixture of K predictive distributions that scores best on held-out
points (Yao, Vehtari, Simpson and Gelman 2018; Yao, Vehtari and Gelman 2022 for combining
chains or fits that do not mix).

Given ``log p_k(y_n)`` for ``K`` candidates at ``N`` held-out (or leave-one-out) points, the
weights solve

    max_w  sum_n log sum_k w_k p_k(y_n)    over the simplex  w_k >= 0, sum_k w_k = 1,

a concave problem. It is solved with ``w = softmax(z)`` by scipy's L-BFGS (``z_K = 0`` fixed,
so the map is one to one); nothing in torch or scipy offers the simplex-constrained problem
directly.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax

__all__ = ["stacking_weights"]


def stacking_weights(log_densities) -> torch.Tensor:
    """Stacking weights of ``K`` candidates from their pointwise log predictive densities.

    :param log_densities: ``(N, K)`` tensor or array: ``log p_k(y_n)`` of candidate ``k`` at
        held-out point ``n`` (PSIS-LOO or a validation set). Finite, ``N >= 1``, ``K >= 1``.
    :returns: ``(K,)`` weights on the simplex, in the input's dtype and device (float64 for
        arrays). Candidates with identical columns receive equal weight.
    """
    lp = torch.as_tensor(log_densities)
    if lp.dim() != 2 or lp.shape[0] < 1 or lp.shape[1] < 1:
        raise ValueError(f"log_densities must have shape (N, K) with N, K >= 1, got "
                         f"{tuple(lp.shape)}")
    if not torch.isfinite(lp).all():
        bad = sorted({int(k) for k in torch.nonzero(~torch.isfinite(lp))[:, 1]})
        raise ValueError(f"log_densities has non-finite entries in candidate column(s) {bad}: "
                         "stacking needs each candidate's finite log density at every point")
    K = lp.shape[1]
    out = dict(dtype=lp.dtype if lp.is_floating_point() else torch.float64, device=lp.device)
    if K == 1:
        return torch.ones(1, **out)
    L = lp.detach().cpu().double().numpy()

    def objective(z_free: np.ndarray) -> tuple[float, np.ndarray]:
        z = np.append(z_free, 0.0)
        log_w = z - logsumexp(z)
        mix = logsumexp(L + log_w, axis=1)  # (N,) log sum_k w_k p_k(y_n)
        resp = np.exp(L + log_w - mix[:, None])  # (N, K) posterior share of each candidate
        grad_z = resp.sum(0) - L.shape[0] * np.exp(log_w)  # d/dz of sum_n mix_n
        return -float(mix.sum()), -grad_z[:-1]

    fit = minimize(objective, np.zeros(K - 1), jac=True, method="L-BFGS-B")
    w = softmax(np.append(fit.x, 0.0))
    return torch.as_tensor(w, **out)
