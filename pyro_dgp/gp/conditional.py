"""The one GP conditional used by the model and by every guide.

For inducing outputs ``u ~ N(m, S)`` (``S = 0``: ``u`` is a sample) at inducing inputs ``Z``
with ``L = chol(K_ZZ)`` and ``A = L^{-1} K_ZX``, the per-point marginals of ``f(x)`` are

    whitened   (u = L v):  mean = A^T m_v            var = k(x,x) - |A|^2 + |S_v^{1/2 T} A|^2
    unwhitened:            mean = A^T L^{-1} m       var = ... with S_v^{1/2} = L^{-1} S^{1/2}

(DSVI eq. 7-8). ``S = 0`` gives the model's conditional ``p(f | u)``; a Gaussian ``q(u)`` gives
DSVI's collapsed marginal.

Two evaluations of the same formulas:

- the *projected* form above: a triangular solve ``A = L^{-1} K_ZX`` over all N points
  (``M^2 N`` forward, and a second solve plus a GEMM in the backward pass), then a GEMM with
  ``S``. Stable: ``|A|^2 <= k(x, x)`` is computed without cancellation.
- the *quadratic* form, in float64 (:func:`conditional` picks it where it applies):
  ``var_d = k(x,x) - k_x^T C_d k_x`` with the ``M x M`` matrix
  ``C_d = L^{-T} (I - S_d S_d^T) L^{-1}`` built once in ``O(D M^3)``, and
  ``mean = K_XZ (L^{-T} m)``. Over the N points that is one GEMM forward and one in the
  backward pass (:class:`_QuadraticConditional`, using ``C_d = C_d^T``): fewer flops than the
  projected form and no triangular solve over N. It subtracts two terms of
  size ``k(x, x)``, losing about ``eps * cond(K_ZZ)`` relative accuracy: harmless in float64
  (the default jitter bounds ``cond(K_ZZ)`` near ``M / 1e-6``, so ~1e-8), not in float32,
  which keeps the projected form.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["conditional", "layer_parts", "per_output_conditional", "projection",
           "quadratic_conditional", "quadratic_form"]

_QUADRATIC = [True]


@contextlib.contextmanager
def quadratic_form(enabled: bool) -> Iterator[None]:
    """Allow (default) or forbid the quadratic form where :func:`conditional` would pick it,
    e.g. ``with quadratic_form(False): fit(...)`` for the stable projected form throughout."""
    previous, _QUADRATIC[0] = _QUADRATIC[0], bool(enabled)
    try:
        yield
    finally:
        _QUADRATIC[0] = previous


def conditional(
    Kzx: torch.Tensor,
    Lzz: torch.Tensor,
    kxx_diag: torch.Tensor,
    u_loc: torch.Tensor,
    u_scale_tril: torch.Tensor | None = None,
    whiten: bool = True,
    quadratic: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Marginal mean and variance of ``f`` at ``N`` inputs, for ``D`` outputs sharing ``Z``.

    :param Kzx: ``(..., M, N)`` cross-covariance ``k(Z, X)``.
    :param Lzz: ``(M, M)`` (or batched) lower Cholesky factor of ``K_ZZ``.
    :param kxx_diag: ``(..., N)`` prior variances ``k(x_i, x_i)``.
    :param u_loc: ``(..., D, M)`` inducing outputs (a sample, or the mean of ``q(u)``); in the
        whitened parameterisation these are ``v`` with ``u = L v``.
    :param u_scale_tril: ``(..., D, M, M)`` Cholesky factor of ``Cov q(u)``, or ``None``.
    :param whiten: whether ``u_loc``/``u_scale_tril`` are whitened.
    :param quadratic: force (``True``) or forbid (``False``) the quadratic form; default: where
        it applies (float64, one ``Z``, ``S`` shared by the batch) unless forbidden by
        :func:`quadratic_form`.
    :returns: ``(mean, var)``, both ``(..., N, D)``, without the mean function.
    """
    if not whiten:  # L's batch dims (random Z) sit before D
        u_loc, u_scale_tril = _whitened(Lzz if Lzz.dim() == 2 else Lzz.unsqueeze(-3), u_loc,
                                        u_scale_tril)
    applies = (
        Lzz.dim() == 2
        and Kzx.dtype == torch.float64
        and (u_scale_tril is None or u_scale_tril.dim() == 3)
    )
    if quadratic is None:
        quadratic = applies and _QUADRATIC[0]
    elif quadratic and not applies:
        raise ValueError("the quadratic form needs float64, one Z and S shared by the batch")
    if quadratic:
        mean, var = _quadratic(Kzx, Lzz, kxx_diag, u_loc, u_scale_tril)
    else:
        mean, var = _projected(Kzx, Lzz, kxx_diag, u_loc, u_scale_tril)
    # Round-off can make the variance slightly negative where x sits on an inducing point.
    var = var.clamp_min(torch.finfo(var.dtype).tiny)
    return mean, var if var.shape == mean.shape else var.expand(mean.shape)


def per_output_conditional(
    Kzx: torch.Tensor,
    Lzz: torch.Tensor,
    kxx_diag: torch.Tensor,
    v_loc: torch.Tensor,
    v_scale_tril: torch.Tensor | None = None,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`conditional`'s projected form for ``D`` outputs that each have their own
    kernel (one ``Z``): ``A_d = L_d^{-1} K_ZX^{(d)}``, mean ``A_d^T v_d``, variance
    ``k_d(x, x) - |A_d|^2 + |S_d^T A_d|^2`` per output.

    :param Kzx: ``(..., D, M, N)``; :param Lzz: ``(D, M, M)``; :param kxx_diag:
        ``(..., D, N)`` (or ``(..., 1, N)``); :param v_loc: ``(..., D, M)``;
    :param v_scale_tril: ``(..., D, M, K)`` or ``None``; :param whiten: whether they are
        whitened (else ``u_d``, mapped to ``v_d = L_d^{-1} u_d``, ``L_d^{-1} S_d``).
    :returns: ``(mean, var)``, both ``(..., N, D)``, without the mean function.

    In float64 (unless :func:`quadratic_form` forbids it) the quadratic form instead:
    ``mean = k_n^T L_d^{-T} v_d``, ``var = k_d(x, x) - k_n^T C_d k_n`` with
    ``C_d = L_d^{-T} (I - S_d S_d^T) L_d^{-1}``, no triangular solve over the ``N`` points.
    """
    if not whiten:  # each output's own factor L_d
        v_loc, v_scale_tril = _whitened(Lzz, v_loc, v_scale_tril)
    if Kzx.dtype == torch.float64 and _QUADRATIC[0]:
        Linv, C = _quadratic_matrix(Lzz, v_scale_tril)  # (D, M, M) each
        mean = ((Linv.mT @ v_loc.unsqueeze(-1)).mT @ Kzx).squeeze(-2)  # (..., D, N)
        var = kxx_diag - ((C @ Kzx) * Kzx).sum(-2)
    else:
        A, var = projection(Kzx, Lzz, kxx_diag, per_output=True)  # (..., D, M, N), (..., D, N)
        mean = (v_loc.unsqueeze(-2) @ A).squeeze(-2)  # (..., D, N)
        if v_scale_tril is not None:
            var = var + (v_scale_tril.mT @ A).square().sum(-2)  # |S_d^T a_n|^2
    var = var.clamp_min(torch.finfo(var.dtype).tiny)  # round-off on an inducing point
    return mean.mT, var.expand(mean.shape).mT


def _whitened(L: torch.Tensor, u_loc: torch.Tensor, u_scale_tril: torch.Tensor | None):
    """``(v, S_v^{1/2}) = (L^{-1} u, L^{-1} S^{1/2})``: an unwhitened ``q(u)`` in whitened
    coordinates, for ``L (..., M, M)`` aligned with ``u_loc (..., D, M)``'s leading dims."""
    v_loc = solve_triangular(L, u_loc.unsqueeze(-1), upper=False).squeeze(-1)
    if u_scale_tril is not None:
        u_scale_tril = solve_triangular(L, u_scale_tril, upper=False)
    return v_loc, u_scale_tril


def _quadratic_matrix(Lzz: torch.Tensor, v_scale_tril: torch.Tensor | None):
    """``(L^{-1}, C)`` of the quadratic form: ``C_d = L^{-T} (I - S_d S_d^T) L^{-1}``
    (``K_ZZ^{-1}`` without ``S``), exactly symmetric, as :class:`_QuadraticConditional`'s
    backward pass assumes. ``Lzz (M, M)`` or one per output ``(D, M, M)``; ``v_scale_tril``
    ``(D, M, K)``; ``C`` ``(D, M, M)``, or ``(M, M)`` for one ``L`` without ``S``."""
    eye = torch.eye(Lzz.shape[-1], dtype=Lzz.dtype, device=Lzz.device)
    Linv = torch.linalg.solve_triangular(Lzz, eye, upper=False)
    C = Linv.mT @ Linv
    if v_scale_tril is not None:
        W = v_scale_tril.mT @ Linv  # (D, K, M): S_d^T L^{-1}
        C = C - W.mT @ W
    return Linv, 0.5 * (C + C.mT)


def _solve_per_output(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``L_d^{-1} B_d`` for ``L (D, M, M)`` and ``B (..., D, M, n)``, the batch ``...`` folded
    into the columns of one solve per output (see :func:`solve_triangular`)."""
    if B.dim() == 3:
        return torch.linalg.solve_triangular(L, B, upper=False)
    batch, (D, M, n) = B.shape[:-3], B.shape[-3:]
    Bf = B.movedim((-3, -2), (0, 1)).reshape(D, M, -1)  # (D, M, prod(batch) n)
    X = torch.linalg.solve_triangular(L, Bf, upper=False)
    return X.reshape((D, M) + batch + (n,)).movedim((0, 1), (-3, -2))


def _fold(B: torch.Tensor) -> torch.Tensor:
    """``(..., M, n) -> (M, prod(...) n)``: a batch folded into the columns."""
    return B.movedim(-2, 0).reshape(B.shape[-2], -1)


def _unfold(X: torch.Tensor, batch: torch.Size, n: int) -> torch.Tensor:
    """Inverse of :func:`_fold` for ``X (p, prod(batch) n)``: ``(*batch, p, n)``."""
    return X.reshape((X.shape[0],) + batch + (n,)).movedim(0, -2)


def solve_triangular(L: torch.Tensor, B: torch.Tensor, upper: bool) -> torch.Tensor:
    """``L^{-1} B`` for triangular ``L`` (batched like ``B``, or one ``(M, M)`` matrix).

    With one ``L`` and a batched ``B (..., M, n)`` the batch is folded into the columns of one
    solve. Broadcasting ``L`` instead copies it per batch entry and, in the backward pass, forms
    and sums a gradient of ``L`` per entry: with per-point draws (N entries) that made the
    whole Chain step on energy several times slower (``benchmarks/results/history.md``,
    "One factor for a batch of triangular solves")."""
    if L.dim() == 2 and B.dim() > 2:
        X = torch.linalg.solve_triangular(L, _fold(B), upper=upper)
        return _unfold(X, B.shape[:-2], B.shape[-1])
    return torch.linalg.solve_triangular(L, B, upper=upper)


def layer_parts(layer, x: torch.Tensor, Lzz: torch.Tensor | None = None):
    """``(Z, K_ZX, L_ZZ, diag k(x, x))`` of ``layer`` (a :class:`~pyro_dgp.gp.layer.GPLayer`)
    at inputs ``x (..., N, D_in)``, ``Z`` and each kernel hyperparameter read once (a
    ``PyroParam`` read is a ``pyro.param`` call): ``(M, D_in)``, ``(..., M, N)``, ``(M, M)``,
    ``(..., N)``; with a kernel per output ``(..., D, M, N)``, ``(D, M, M)``, ``(..., D, N)``.
    A given ``Lzz`` is used as is. What :func:`conditional` and :func:`projection` take."""
    Z = layer.current_inducing_inputs()
    per_output = layer.kernel_outputs is not None
    Kzz, Kzx, kxx = layer.kernel.conditional_parts(Z, x.unsqueeze(-3) if per_output else x)
    if Kzx is None:  # a white-noise-only kernel
        batch = torch.broadcast_shapes(Z.shape[:-2], x.shape[:-2])
        Kzx = Z.new_zeros(batch + (Z.shape[-2], x.shape[-2]))
    return Z, Kzx, layer.cholesky_of(Kzz) if Lzz is None else Lzz, kxx


def projection(Kzx: torch.Tensor, Lzz: torch.Tensor, kxx_diag: torch.Tensor,
               per_output: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, residual)`` of the projected form: ``A = L^{-1} K_ZX`` ``(..., M, N)`` and
    ``k(x, x) - |A|^2`` ``(..., N)``, so that given whitened inducing outputs ``v (D, M)``
    each output is ``f_d(x_n) = a_n^T v_d + N(0, residual_n)`` (mean function aside). With
    ``per_output`` (``Lzz (D, M, M)``, ``Kzx (..., D, M, N)``, ``kxx_diag (..., D, N)``) one
    of each per output: ``(..., D, M, N)`` and ``(..., D, N)``. Not clamped: see
    :func:`conditional`."""
    A = _solve_per_output(Lzz, Kzx) if per_output else solve_triangular(Lzz, Kzx, upper=False)
    return A, kxx_diag - (A * A).sum(-2)


def _projected(Kzx, Lzz, kxx_diag, v_loc, v_scale_tril):
    A, var = projection(Kzx, Lzz, kxx_diag)  # (..., M, N), (..., N)
    At = A.mT  # (..., N, M)
    var = var.unsqueeze(-1)  # (..., N, 1)
    if v_loc.dim() == 2:
        mean = At @ v_loc.mT  # (..., N, D): batch dims of A fold into the rows of one GEMM
    else:
        mean = (v_loc @ A).mT  # (..., D, N) -> (..., N, D)
    if v_scale_tril is not None and v_scale_tril.dim() == 3:
        # |S_d^T a_i|^2 for all d at once: one (..., N, M) x (M, D K) GEMM with
        # S_cat = [S_1 | ... | S_D] (M, D K), instead of a batched (D, M, N) product with A
        # broadcast over D (whose backward also sums a (D, M, N) gradient back onto A).
        D, M, K = v_scale_tril.shape
        R = At @ v_scale_tril.permute(1, 0, 2).reshape(M, D * K)  # (..., N, D K)
        var = var + R.square().unflatten(-1, (D, K)).sum(-1)
    elif v_scale_tril is not None:
        B = v_scale_tril.mT @ A.unsqueeze(-3)  # (..., D, K, N)
        var = var + (B * B).sum(-2).mT
    return mean, var


def _quadratic(Kzx, Lzz, kxx_diag, v_loc, v_scale_tril):
    C = _quadratic_matrix(Lzz, v_scale_tril)[1]
    if C.dim() == 2:
        C = C.unsqueeze(0)  # (1, M, M): one C for every output
    alpha = solve_triangular(Lzz.mT, v_loc.mT, upper=True)  # (..., M, D)
    if alpha.dim() == 2:  # one q for the whole batch (training): mean and variance fused
        mean, quad = quadratic_conditional(Kzx, C, alpha)
        return mean, kxx_diag.unsqueeze(-1) - quad
    var = kxx_diag.unsqueeze(-1) - quadratic_conditional(Kzx, C)  # (..., N, D or 1)
    return Kzx.mT @ alpha, var


def quadratic_conditional(Kzx: torch.Tensor, C: torch.Tensor, alpha: torch.Tensor | None = None):
    """``k_n^T C_d k_n`` ``(..., N, D)`` for ``Kzx = [k_1 ... k_N]`` ``(..., M, N)`` and
    symmetric ``C`` ``(D, M, M)``; with ``alpha`` ``(M, D)`` also the mean ``K_XZ alpha``
    ``(..., N, D)``, returned first. One GEMM forward and one backward
    (:class:`_QuadraticConditional`)."""
    if alpha is None:
        return _QuadraticConditional.apply(Kzx, C, None)[1]
    return _QuadraticConditional.apply(Kzx, C, alpha)


class _QuadraticConditional(torch.autograd.Function):
    """``quad[..., n, d] = k_n^T C_d k_n`` and (given ``alpha``) ``mean = K_XZ alpha``.

    Autograd would spend two GEMMs on the quadratic's backward pass; with ``C_d`` symmetric the
    gradient for ``Kzx`` is ``2 sum_d g_d (C_d k_n)`` from the saved forward product (no GEMM),
    and the one for ``C_d`` is ``K diag(g_d) K^T`` (one GEMM). The mean's gradient
    ``alpha g_mean^T`` is added into the same ``(M, N)`` buffer, where autograd would
    materialise it and then add the two: two fewer passes over ``(M, N)`` per layer.
    """

    @staticmethod
    def forward(ctx, Kzx: torch.Tensor, C: torch.Tensor, alpha: torch.Tensor | None):
        D, M, _ = C.shape
        Kf = _fold(Kzx)  # (M, b N)
        P = _unfold(C.reshape(D * M, M) @ Kf, Kzx.shape[:-2], Kzx.shape[-1])
        P = P.unflatten(-2, (D, M))  # (..., D, M, N): C_d k_n, one GEMM whatever the batch
        ctx.save_for_backward(Kzx, P, alpha)
        if D == 1:  # without the size-1 dim: fewer (M, N) temporaries
            quad = (P.squeeze(-3) * Kzx).sum(-2).unsqueeze(-1)
        else:
            quad = (P * Kzx.unsqueeze(-3)).sum(-2).mT  # (..., N, D)
        if alpha is None:
            return None, quad
        mean = (Kf.mT @ alpha).reshape(quad.shape[:-1] + (alpha.shape[-1],))
        return mean, quad

    @staticmethod
    def backward(ctx, grad_mean: torch.Tensor | None, grad_quad: torch.Tensor | None):
        Kzx, P, alpha = ctx.saved_tensors
        d_Kzx = d_C = d_alpha = None
        if grad_quad is None:
            grad_quad = torch.zeros(P.shape[:-3] + (P.shape[-1], P.shape[-3]),
                                    dtype=P.dtype, device=P.device)
        g = grad_quad.mT.unsqueeze(-2)  # (..., D, 1, N)
        if ctx.needs_input_grad[0]:  # the factor 2 on the small (N, D) gradient
            if P.shape[-3] == 1:
                d_Kzx = P.squeeze(-3) * (2 * g.squeeze(-3))
            else:
                d_Kzx = (P * (2 * g)).sum(-3)
            if alpha is not None and grad_mean is not None:
                if d_Kzx.dim() == 2:
                    d_Kzx.addmm_(alpha, grad_mean.mT)
                else:
                    d_Kzx = d_Kzx + alpha @ grad_mean.mT
        want_alpha = alpha is not None and grad_mean is not None and ctx.needs_input_grad[2]
        Kf = _fold(Kzx) if ctx.needs_input_grad[1] or want_alpha else None  # a copy if batched
        if ctx.needs_input_grad[1]:
            D, M = P.shape[-3], P.shape[-2]
            gK = (Kzx.unsqueeze(-3) * g).flatten(-3, -2)  # (..., D M, N)
            # summed over the batch: one GEMM with the batch folded into the columns
            d_C = (_fold(gK) @ Kf.mT).unflatten(-2, (D, M))  # (D, M, M)
        if want_alpha:
            d_alpha = Kf @ grad_mean.reshape(-1, grad_mean.shape[-1])  # (M, D)
        return d_Kzx, d_C, d_alpha
