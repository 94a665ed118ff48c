"""The one GP conditional used by the model and by every guide.

For inducing outputs ``u ~ N(m, S)`` (``S = 0``: ``u`` is a sample) at inducing inputs ``Z``
with ``L = chol(K_ZZ)`` and ``A = L^{-1} K_ZX``, the per-point marginals of ``f(x)`` are

    whitened   (u = L v):  mean = A^T m_v            var = k(x,x) - |A|^2 + |S_v^{1/2 T} A|^2
    unwhitened:            mean = A^T L^{-1} m       var = ... with S_v^{1/2} = L^{-1} S^{1/2}

(DSVI eq. 7-8). ``S = 0`` gives the model's conditional ``p(f | u)``; a Gaussian ``q(u)`` gives
DSVI's collapsed marginal.
"""

from __future__ import annotations

import torch

__all__ = ["conditional"]


def conditional(
    Kzx: torch.Tensor,
    Lzz: torch.Tensor,
    kxx_diag: torch.Tensor,
    u_loc: torch.Tensor,
    u_scale_tril: torch.Tensor | None = None,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Marginal mean and variance of ``f`` at ``N`` inputs, for ``D`` outputs sharing ``Z``.

    :param Kzx: ``(..., M, N)`` cross-covariance ``k(Z, X)``.
    :param Lzz: ``(M, M)`` (or batched) lower Cholesky factor of ``K_ZZ``.
    :param kxx_diag: ``(..., N)`` prior variances ``k(x_i, x_i)``.
    :param u_loc: ``(..., D, M)`` inducing outputs (a sample, or the mean of ``q(u)``); in the
        whitened parameterisation these are ``v`` with ``u = L v``.
    :param u_scale_tril: ``(..., D, M, M)`` Cholesky factor of ``Cov q(u)``, or ``None``.
    :param whiten: whether ``u_loc``/``u_scale_tril`` are whitened.
    :returns: ``(mean, var)``, both ``(..., N, D)``, without the mean function.
    """
    A = torch.linalg.solve_triangular(Lzz, Kzx, upper=False)  # (..., M, N)
    if not whiten:
        # v = L^{-1} u, S_v^{1/2} = L^{-1} S^{1/2}; L's batch dims (random Z) sit before D
        L_d = Lzz.unsqueeze(-3)
        u_loc = torch.linalg.solve_triangular(L_d, u_loc.unsqueeze(-1), upper=False).squeeze(-1)
        if u_scale_tril is not None:
            u_scale_tril = torch.linalg.solve_triangular(L_d, u_scale_tril, upper=False)
    At = A.mT  # (..., N, M)
    var = (kxx_diag - (A * A).sum(-2)).unsqueeze(-1)  # (..., N, 1)
    if u_loc.dim() == 2:
        mean = At @ u_loc.mT  # (..., N, D): batch dims of A fold into the rows of one GEMM
    else:
        mean = (u_loc @ A).mT  # (..., D, N) -> (..., N, D)
    if u_scale_tril is not None and u_scale_tril.dim() == 3:
        # |S_d^T a_i|^2 for all d at once: one (..., N, M) x (M, D K) GEMM with
        # S_cat = [S_1 | ... | S_D] (M, D K), instead of a batched (D, M, N) product with A
        # broadcast over D (whose backward also sums a (D, M, N) gradient back onto A).
        D, M, K = u_scale_tril.shape
        R = At @ u_scale_tril.permute(1, 0, 2).reshape(M, D * K)  # (..., N, D K)
        var = var + R.square().unflatten(-1, (D, K)).sum(-1)
    elif u_scale_tril is not None:
        B = u_scale_tril.mT @ A.unsqueeze(-3)  # (..., D, K, N)
        var = var + (B * B).sum(-2).mT
    # Round-off can make k(x,x) - |A|^2 slightly negative where x sits on an inducing point.
    return mean, var.clamp_min(torch.finfo(var.dtype).tiny).expand(mean.shape)
