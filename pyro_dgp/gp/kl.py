"""Gaussian KL divergences of the inducing outputs to a layer's prior.

``torch.distributions.kl`` serves where a closed form is registered; what it lacks is written
here: ``KL(N(m, L L^T) || N(0, I))`` without a solve against ``I`` (registered for
:class:`~pyro_dgp.gp.distributions.WhitenedPrior`).
"""

from __future__ import annotations

import torch
from pyro.distributions.kl import _kl_independent_independent
from torch.distributions import register_kl

from ..linalg import CholeskyError
from .distributions import WhitenedPrior

__all__ = ["gaussian_kl_to_layer_prior", "logdet_low_rank"]


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
    L, m = base._unbroadcasted_scale_tril, base.loc
    kl_rows = 0.5 * (L.square().sum((-2, -1)) + m.square().sum(-1) - m.shape[-1])
    kl_rows = kl_rows - L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    kl = kl_rows.expand(base.batch_shape).sum(-1)
    if p.batch_shape == q.batch_shape:
        return kl.expand(p.batch_shape)
    return kl.expand(torch.broadcast_shapes(p.batch_shape, q.batch_shape))


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
            total = total + (Rb * Rb).sum() + (m * m).sum()
            if db is not None:
                total = total + db.sum()
        else:
            Lk = layer.kzz_cholesky()
            LiR = torch.linalg.solve_triangular(Lk, Rb, upper=False)
            Lim = torch.linalg.solve_triangular(Lk, m.unsqueeze(-1), upper=False)
            total = total + (LiR * LiR).sum() + (Lim * Lim).sum()
            total = total + 2 * D * Lk.diagonal().log().sum()
            if db is not None:
                Kinv_diag = torch.cholesky_inverse(Lk).diagonal()
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
    if bool(info.any()):
        raise CholeskyError("Coupled (low rank): the covariance factor or diagonal holds "
                            "NaN or inf values")
    return d.log().sum() + L.diagonal().log().sum() * 2
