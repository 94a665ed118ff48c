"""Gaussians of the inducing outputs: a layer's ``q(vec u^l)`` by a factor of its covariance,
the initial covariance, and a multivariate normal that scores its own draws from their noise."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch

from ..gp.distributions import CholeskyMVN
from ..gp.kl import triangular_of_rows
from .prototype import LayerSite

__all__ = ["LayerGaussian", "check_size", "gaussian_parameters", "initial_scale_tril",
           "log_density_of_noise", "mvn_site", "tril_matvec", "unit_tril_solve"]


@dataclass(frozen=True)
class LayerGaussian:
    """A Gaussian ``q(vec u^l) = N(loc, Cov)`` of one layer's inducing outputs, ``vec``
    row-major over ``(D_out, M)``, with ``Cov`` given by a factor (never formed and
    refactorised, which would square the factor's condition number):

    :ivar loc: ``(D_out M,)``.
    :ivar row_trils: ``(D_out, M, M)`` lower Cholesky factors of independent rows, or
    :ivar rows: ``(D_out M, K)`` the rows of any factor, ``Cov = rows rows^T``.
    """

    loc: torch.Tensor
    row_trils: torch.Tensor | None = None
    rows: torch.Tensor | None = None

    def scale_tril(self) -> torch.Tensor:
        """``(D_out M, D_out M)`` lower Cholesky factor of ``Cov`` (positive diagonal)."""
        if self.row_trils is not None:
            return torch.block_diag(*self.row_trils)
        L = triangular_of_rows(self.rows)  # from a QR decomposition: diagonal of either sign
        return L * torch.sign(L.diagonal()).where(L.diagonal() != 0, 1.0)

    def distribution(self) -> dist.MultivariateNormal:
        """``N(loc, Cov)`` with detached parameters."""
        with torch.no_grad():
            return dist.MultivariateNormal(self.loc.detach().clone(),
                                           scale_tril=self.scale_tril().detach().clone())


def gaussian_parameters(q) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loc (n,), scale_tril (n, n))`` of a Gaussian ``q`` over a vector: a
    ``MultivariateNormal`` (or ``LowRankMultivariateNormal``), or an ``Independent`` of
    multivariate normals over rows (flattened row-major, block diagonal)."""
    base, rows = q, None
    if isinstance(q, torch.distributions.Independent):
        base = q.base_dist
        rows = base.batch_shape
    if not isinstance(base, torch.distributions.MultivariateNormal |
                      torch.distributions.LowRankMultivariateNormal):
        raise TypeError(f"set_q: q must be a (Independent) MultivariateNormal, got "
                        f"{type(q).__name__}")
    with torch.no_grad():
        loc, tril = base.loc, base.scale_tril
        if rows is not None and len(rows):
            loc = loc.reshape(-1)
            tril = torch.block_diag(*tril.expand(rows + tril.shape[-2:]).reshape(
                (-1,) + tril.shape[-2:]))
        elif len(base.batch_shape):
            raise ValueError(f"set_q: q must be one distribution over a vector, got batch "
                             f"shape {tuple(base.batch_shape)}")
        return loc.detach().clone(), tril.detach().clone()


def check_size(loc: torch.Tensor, size: int, what: str) -> None:
    if loc.shape[-1] != size:
        raise ValueError(f"set_q: {what} has {size} entries (D_out x M per layer), got a "
                         f"distribution over {loc.shape[-1]}")


def initial_scale_tril(site: LayerSite, inner_variance: float) -> torch.Tensor:
    """``(M, M)`` Cholesky factor of the initial ``Cov q(u)`` of ``site`` (``(D_out, M, M)`` for
    an unwhitened layer with a kernel per output; Salimbeni and Deisenroth 2017):
    ``c I`` in whitened coordinates, ``c = inner_variance`` for inner layers and ``1`` (the
    prior) for the last; mapped to an unwhitened layer's ``u`` as ``c K_ZZ``, not ``c I``,
    which against a near-singular ``K_ZZ`` would start the KL at ~``c tr(K_ZZ^-1)``."""
    layer = site.layer
    Z = layer.inducing_points.detach()
    scale = 1.0 if site.is_last else math.sqrt(inner_variance)
    if layer.whiten:
        return scale * torch.eye(Z.shape[-2], dtype=Z.dtype, device=Z.device)
    with torch.no_grad():
        return scale * layer.kzz_cholesky()


def log_density_of_noise(eps: torch.Tensor, log_det_cov: torch.Tensor) -> torch.Tensor:
    """``(*batch,)`` log-density of the Gaussian draw ``x = loc + L eps`` (``eps (*batch, n)``
    standard normal, ``log_det_cov = log det L L^T``), from its noise: ``-(n log 2 pi +
    log det + |eps|^2) / 2``, the general formula without its triangular solve."""
    return -0.5 * (eps.shape[-1] * math.log(2 * math.pi) + log_det_cov + eps.square().sum(-1))


def _apply_folded(op, L: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``op(L, V)`` column by column for ``L (*b, M, M)`` and vectors ``v (*s, *b, M)``:
    ``(*s, *b, M)``. The dims ``*s`` left of ``L``'s are folded into the columns of one
    ``V (*b, M, prod(s))``; broadcasting ``L`` over them instead copies it once per vector."""
    n = v.dim() - L.dim() + 1  # the batch dims of v left of L's
    if n <= 0 or v.shape[n:-1] != L.shape[:-2]:
        return op(L, v.unsqueeze(-1)).squeeze(-1)
    cols = v.reshape((-1,) + v.shape[n:]).movedim(0, -1)  # (*b, M, prod(s))
    return op(L, cols).movedim(-1, 0).reshape(v.shape)


def tril_matvec(L: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``L e`` for ``L (*b, M, M)`` and ``eps (*s, *b, M)``: ``(*s, *b, M)``.

    Where ``eps`` has batch dims left of ``L``'s (Pyro's particles or paths, a sample shape),
    those are folded into the columns of one product with ``L``: ``L @ eps[..., None]``
    would broadcast ``L`` over them, copying it once per draw (for ``S = 32`` particles of a
    layer with 16 outputs and ``M = 256``, 268 MB per step, most of a DS-DGP step's time)."""
    return _apply_folded(torch.matmul, L, eps)


def unit_tril_solve(T: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``T^-1 v`` for unit lower-triangular ``T (*b, M, M)`` (its diagonal is not read) and
    ``v (*s, *b, M)``: ``(*s, *b, M)``, the dims ``*s`` folded into one solve as in
    :func:`tril_matvec`."""
    def solve(L, B):
        return torch.linalg.solve_triangular(L, B, upper=False, unitriangular=True)
    return _apply_folded(solve, T, v)


class _OwnDrawMVN(CholeskyMVN):
    """A multivariate normal that scores its latest draw ``x = loc + L e`` from ``e``.

    ``log q(x) = -|e|^2 / 2 - sum log diag L - M log(2 pi) / 2``, the same function of the
    parameters as the general formula (``L^-1 (x - loc) = e``), but without the triangular
    solve: a factor trained by Adam with off-diagonal entries above its diagonal (an inner
    layer's ``S = 1e-5 I`` after a few steps at lr 0.01, M = 100) can have ``cond(L)`` far
    beyond 1e15, and the solve then returns a meaningless ``log q`` at the guide's own draws,
    breaking Trace_ELBO, RenyiELBO and the importance weights of
    :func:`~pyro_dgp.variational_pareto_k`. Any other value is scored by the general formula.
    """

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(_OwnDrawMVN, _instance)
        return super().expand(batch_shape, _instance=new)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        value = self.loc + tril_matvec(self._unbroadcasted_scale_tril, eps)
        self._own_draw = (value, eps)
        return value

    def log_prob(self, value):
        own = self.__dict__.get("_own_draw")
        if own is None or value is not own[0]:
            return super().log_prob(value)
        return log_density_of_noise(own[1], 2 * self.half_log_det())


def mvn_site(loc: torch.Tensor, scale_tril: torch.Tensor,
             log_det_cov: torch.Tensor | None = None) -> dist.Distribution:
    """``q(u)`` with event shape ``(D, M)``: independent MVNs per output row; ``loc (D, M)``,
    ``scale_tril (D, M, M)``, ``log_det_cov (D,)`` each row's ``log det L L^T`` if known."""
    return _OwnDrawMVN(loc, scale_tril, log_det_cov).to_event(1)
