"""Gaussian KL divergences of the inducing outputs to a layer's prior.

``torch.distributions.kl`` serves where a closed form is registered; what it lacks is written
here: ``KL(N(m, L L^T) || N(0, I))`` without a solve against ``I`` (registered for
:class:`~pyro_dgp.gp.distributions.WhitenedPrior`).
"""

from __future__ import annotations

import torch
from pyro.distributions.kl import _kl_independent_independent
from torch.distributions import register_kl

from ..linalg import CholeskyError, capturing, nan_where_failed
from .distributions import CholeskyMVN, WhitenedPrior

__all__ = ["gaussian_kl_to_layer_prior", "layer_gaussian_kl", "logdet_low_rank",
           "standard_normal_kl", "triangular_of_rows"]


@register_kl(torch.distributions.Independent, WhitenedPrior)
def _kl_to_whitened_prior(p, q):
    """``KL(N(m, L L^T) || N(0, I))`` per row: ``0.5 (|L|_F^2 + |m|^2 - M) - sum log diag L``,
    summed over the ``D_out`` rows (the event dim of ``p``)."""
    base = p.base_dist
    if (
        p.reinterpreted_batch_ndims != 1
        or not isinstance(base, torch.distributions.MultivariateNormal)
        or p.event_shape != q.event_shape
    ):
        return _kl_independent_independent(p, q)
    kl = standard_normal_kl(base.loc, base._unbroadcasted_scale_tril,
                            base.half_log_det() if isinstance(base, CholeskyMVN) else None)
    kl = _expanded(kl, base.batch_shape).sum(-1)
    if p.batch_shape == q.batch_shape:
        return _expanded(kl, p.batch_shape)
    return kl.expand(torch.broadcast_shapes(p.batch_shape, q.batch_shape))


def _expanded(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t.expand(shape)``, without the view (and its autograd node) where ``t`` has that
    shape already (a layer's q(u) and prior, per step)."""
    return t if t.shape == shape else t.expand(shape)


def standard_normal_kl(loc: torch.Tensor, scale_tril: torch.Tensor,
                       half_log_det: torch.Tensor | None = None) -> torch.Tensor:
    """``KL(N(m, L L^T) || N(0, I))`` of each row ``m``: ``0.5 (|L|_F^2 + |m|^2 - M) -
    sum log diag L``, for ``loc (..., M)`` and ``scale_tril (..., M, M)`` (batch dims
    broadcast), with ``half_log_det = sum log diag L (...)`` if known; returns ``(...)``."""
    kl = 0.5 * (scale_tril.square().sum((-2, -1)) + loc.square().sum(-1) - loc.shape[-1])
    if half_log_det is None:
        half_log_det = scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return kl - half_log_det


def gaussian_kl_to_layer_prior(layers, mean, R, d=None, logdet_S=None) -> torch.Tensor:
    """``KL(N(mean, R R^T + diag d) || prod_l prod_d p(u^l_d))`` in closed form.

    :param layers: the :class:`~pyro_dgp.GPLayer`\\ s in the order of ``mean``'s blocks.
    :param mean: ``(T,)``; :param R: ``(T, K)``; :param d: ``(T,)`` or ``None``.
    :param logdet_S: ``log det Cov q`` if known (e.g. from a triangular ``R``).

    With block prior covariances ``P_b`` (``I`` whitened, ``K_ZZ`` unwhitened; one block per
    layer and output) and prior means ``mu_b`` (``m(Z)`` where ``u`` holds function values,
    else 0): ``KL = 1/2 [sum_b tr(P_b^-1 S_bb) + (m_b - mu_b)^T P_b^-1 (m_b - mu_b)
    + log det P_b - T - log det S]``; only the diagonal blocks ``S_bb`` of ``S`` are needed.
    """
    T = mean.shape[-1]
    total = -T - (logdet_S if logdet_S is not None else logdet_low_rank(R, d))
    # every block whitened: sum_b tr(S_bb) = |R|_F^2 (+ sum d) in one pass, where per-block
    # row slices of a T x T factor would each cost a T x T zero-filled gradient
    all_whitened = all(layer.whiten for layer in layers)
    if all_whitened:
        total = total + (R * R).sum() + (0.0 if d is None else d.sum())
    offset = 0
    for layer in layers:
        D, M = layer.output_dim, layer.num_inducing
        n = D * M
        m = mean[offset : offset + n].reshape(D, M)
        if layer.function_values:  # u holds f(Z): the prior mean is m(Z), not 0
            m = m - layer.mean_function(layer.current_inducing_inputs()).mT
        Rb = R[offset : offset + n].reshape(D, M, R.shape[-1])
        db = None if d is None else d[offset : offset + n].reshape(D, M)
        if layer.whiten:
            total = total + (m * m).sum()
            if not all_whitened:
                total = total + (Rb * Rb).sum() + (0.0 if db is None else db.sum())
        else:
            Lk = layer.kzz_cholesky()  # (M, M) shared by the outputs, or (D, M, M) one each
            LiR = torch.linalg.solve_triangular(Lk, Rb, upper=False)
            Lim = torch.linalg.solve_triangular(Lk, m.unsqueeze(-1), upper=False)
            total = total + (LiR * LiR).sum() + (Lim * Lim).sum()
            log_diag = Lk.diagonal(dim1=-2, dim2=-1).log().sum()
            total = total + 2 * (log_diag if layer.kernel_outputs else D * log_diag)
            if db is not None:
                Kinv_diag = torch.cholesky_inverse(Lk).diagonal(dim1=-2, dim2=-1)
                total = total + (db * Kinv_diag).sum()
        offset += n
    return 0.5 * total


def logdet_low_rank(R, d):
    if d is None:
        raise ValueError("log det S needs d or an explicit value for a non-square factor")
    # matrix determinant lemma: det(D + R R^T) = det(D) det(I + R^T D^-1 R)
    inner = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device) + R.mT @ (R / d.unsqueeze(-1))
    # I + R^T D^-1 R >= I: it fails only on NaN/inf parameters
    L, info = torch.linalg.cholesky_ex(inner)
    if capturing(inner):  # no read-back inside a CUDA graph: NaN reaches the loss instead
        L = nan_where_failed(L, info)
    elif bool(info.any()):
        raise CholeskyError("Coupled (low rank): the covariance factor or diagonal holds "
                            "NaN or inf values")
    return d.log().sum() + L.diagonal().log().sum() * 2


def layer_gaussian_kl(loc: torch.Tensor, layer, rows=None, tril=None,
                 random_Z: bool = False) -> torch.Tensor:
    """``KL(q || p(u))`` for the flattened ``(D * M,)`` inducing outputs of ``layer``
    (row-major ``(D, M)``; the prior is block diagonal over the D rows), with ``Cov q`` given
    by per-row Cholesky factors ``tril (D, M, M)`` (a block-diagonal ``q``) or by any factor's
    rows ``rows (D M, K)``, ``Cov q = rows rows^T``.

    ``Cov q`` itself is never formed and refactorised: that squares the factor's condition
    number and fails (or loses the small eigenvalues' digits) once training has made the
    factor ill-conditioned. Where a triangular factor of a block is needed it comes from a QR
    decomposition of the block's rows, ``rows_b rows_b^T = r^T r``.

    With ``random_Z`` the layer's prior is batched over draws of its inducing inputs (set by
    ``layer.given_inducing_inputs``) and the KL is averaged over them."""
    with torch.no_grad():
        if tril is not None:
            blocks = tril
            logdet = 2 * tril.diagonal(dim1=-2, dim2=-1).abs().log().sum()
            rows = torch.block_diag(*tril)
        else:
            logdet = 2 * triangular_of_rows(rows).diagonal().abs().log().sum()
            blocks = None
        if not random_Z:
            return gaussian_kl_to_layer_prior([layer], loc.reshape(-1), rows, logdet_S=logdet)
        prior = layer.prior().base_dist  # batch (S, 1, D), event M
        D, M = prior.loc.shape[-2:]
        p_loc = prior.loc.reshape(-1, D, M)
        p_tril = prior.scale_tril.reshape(-1, D, M, M)
        if blocks is None:  # triangular factors of the diagonal blocks S_dd of S
            blocks = triangular_of_rows(rows.reshape(D, M, -1))
        # gaussian_kl_to_layer_prior's formula, batched over the draws of Z: that function
        # takes a (DM, T) factor, which over S draws would cost S D M T memory (1.3 GB for
        # S = 256, D = 8, M = 100) where the per-row blocks cost S D M^2.
        # 0.5 [tr(K^-1 S) + (mu - m)^T K^-1 (mu - m) - DM + log|K| - log|S|], K block diagonal
        A = torch.linalg.solve_triangular(p_tril, blocks, upper=False)
        diff = torch.linalg.solve_triangular(
            p_tril, (loc.reshape(D, M) - p_loc).unsqueeze(-1), upper=False)
        logdet_K = 2 * p_tril.diagonal(dim1=-2, dim2=-1).log().sum((-2, -1))
        kl = 0.5 * (A.square().sum((-3, -2, -1)) + diff.square().sum((-3, -2, -1)) - D * M
                    + logdet_K - logdet)
        return kl.mean()


def triangular_of_rows(rows: torch.Tensor) -> torch.Tensor:
    """``(..., n, n)`` lower-triangular ``L`` with ``L L^T = rows rows^T`` for ``rows
    (..., n, K)``, ``K >= n``, from the QR decomposition ``rows^T = Q r`` (``L = r^T``, its
    diagonal of either sign); singular (a zero on the diagonal) where ``K < n``."""
    n, K = rows.shape[-2:]
    if K < n:  # rank-deficient: pad to a square factor, whose log det is -inf
        rows = torch.cat([rows, rows.new_zeros(rows.shape[:-1] + (n - K,))], -1)
    return torch.linalg.qr(rows.mT, mode="r")[1].mT
