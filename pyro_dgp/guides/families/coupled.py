"""``Coupled``: one Gaussian over the inducing outputs of all layers (Ustyuzhaninov et al.
2020, §4.1), full rank or low rank plus diagonal."""

from __future__ import annotations

import math

import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from ...constraints import positive
from ...validation import check_positive_int
from ..blocks import GaussianBlocks
from ..joint import JointGaussian
from ..params import copy_into, preconditioned_cholesky, unconstrained_tril
from ..registry import register_guide

__all__ = ["Coupled"]


@register_guide("coupled-lowrank", "one Gaussian over all layers, low-rank-plus-diagonal "
                "covariance", rank=10)
@register_guide("coupled-per-point", "coupled, always drawing the inducing outputs per data "
                "point", per_point=True)
@register_guide("coupled", "one Gaussian over all layers' inducing outputs (full covariance), "
                "last layer collapsed; per-point draws while N T^2 <= 1e9")
class Coupled(GaussianBlocks, JointGaussian):
    """One Gaussian over the inducing outputs of all layers (Ustyuzhaninov et al. 2020, §4.1).

    :param rank: ``None`` for a full ``T x T`` Cholesky factor, or the rank ``r`` of a
        low-rank-plus-diagonal covariance ``W W^T + diag(d)``.
    :param per_point: draw ``U`` per data point (see the module docstring; ``None``: while
        ``N T K <= per_point_budget``).
    :param estimator: ``"sampled"`` (below) or ``"collapsed"``: with per-point draws, every
        layer's ``u`` integrated out per point (:mod:`~pyro_dgp.guides.joint`'s docstring).

    Initialisation: the inner layers' ``q(u)`` at ``inner_variance = 0.01`` times the prior's
    covariance, the last layer at its prior, no cross-block terms. From the prior Coupled
    ended in the noise-only fit on the compositional toy of Ustyuzhaninov et al. 2020; from
    DSVI's ``1e-5`` it trained least far on yacht, energy and concrete
    (``benchmarks/results/history.md``, "Why Coupled trails MeanField: the cross-layer
    entries").

    Estimator (module docstring): ``u^1..u^{L-1}`` drawn jointly (the sampled-u
    estimator of Ustyuzhaninov et al. 2020, unbiased for any q), each ``f^l`` from the model's
    conditional given ``u^l`` and
    ``f^{l-1}``; ``u^L`` collapsed given the other noise of the draw. Cost per step, with
    T = sum_l D_l M_l: full rank O(T^2) for the factor and the KL plus O(T^2) per draw (no
    T x T factorisation: the Cholesky factor is the parameter); low rank O(T r^2) plus
    O(T r) per draw. Per-point draws take N draws a step.
    """

    def __init__(self, model, rank: int | None = None, inner_variance: float = 0.01,
                 per_point: bool | None = None, estimator: str = "sampled", name=None):
        super().__init__(model, inner_variance, per_point, estimator, name=name)
        self.rank = None if rank is None else check_positive_int(rank, "Coupled: rank")

    def _setup_sites(self, sites):
        blocks = self._init_blocks()
        ref = blocks[0]
        T = self.dim
        self.loc = PyroParam(torch.cat([s.layer.initial_u_loc().reshape(-1) for s in sites]))
        if self.rank is None:
            # stored unconstrained: factor() maps it to the factor (preconditioned_cholesky)
            self.scale_tril = PyroParam(
                unconstrained_tril(torch.block_diag(*[b for blk in blocks for b in blk]),
                                   self._preconditioner(ref)),
                constraints.real)
        else:
            var = torch.cat([(blk * blk).sum(-1).reshape(-1) for blk in blocks])
            g = torch.Generator(device="cpu").manual_seed(0)
            W = 1e-3 * math.sqrt(T) * torch.randn(T, self.rank, generator=g, dtype=ref.dtype)
            W = W.to(ref.device)  # the factor used is W / sqrt(T): 1e-3 N(0, 1) entries
            self.cov_factor = PyroParam(W)
            self.cov_diag = PyroParam(var, positive)

    def factor(self):
        block = self.substituted_block("joint")
        if block is not None:
            loc, L = block
            return loc, L, None, 2 * L.diagonal().log().sum()
        if self.rank is None:
            raw = self.scale_tril
            L, logdet = preconditioned_cholesky(raw, self._preconditioner(raw, strict=True))
            return self.loc, L, None, logdet
        W = self.cov_factor / math.sqrt(self.cov_factor.shape[0])  # a row of W moves ~lr
        return self.loc, W, self.cov_diag, None

    def _set_blocks(self, blocks):
        self.set_joint(torch.cat([loc for loc, _ in blocks]),
                       torch.block_diag(*[tril for _, tril in blocks]))

    def _set_joint(self, loc, scale_tril):
        if self.rank is not None:
            raise ValueError(f"set_q: a low-rank Coupled guide (rank={self.rank}) cannot "
                             "represent a given full covariance; use Coupled(model, rank=None)")
        self.set_joint(loc, scale_tril)

    def _set_low_rank(self, site, q) -> bool:
        if self.rank is None:
            return False
        T = self.dim
        if site is not None and site.shape.numel() != T:
            raise ValueError("set_q: a low-rank Coupled guide sets q of all layers at once "
                             "(layer=None)")
        if q.cov_factor.shape[-1] != self.rank:
            raise ValueError(f"set_q: q has rank {q.cov_factor.shape[-1]}, the guide "
                             f"rank {self.rank}")
        with torch.no_grad():
            copy_into(self, "loc", q.loc, constraints.real)
            copy_into(self, "cov_factor", q.cov_factor * math.sqrt(T))  # factor() divides
            copy_into(self, "cov_diag", q.cov_diag, positive)
        return True

    def gaussian_blocks(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{"joint": (loc (T,), scale_tril (T, T))}``, full rank only
        (:class:`~pyro_dgp.guides.blocks.GaussianBlocks`)."""
        self._ensure_set_up()
        if self.rank is not None:
            raise TypeError(f"Coupled(rank={self.rank}) stores a low-rank-plus-diagonal "
                            "covariance, not a Gaussian block with a Cholesky factor: use "
                            "rank=None")
        with torch.no_grad():
            loc, L, _, _ = self.factor()
        return {"joint": (loc.detach(), L.detach())}

    def set_gaussian_blocks(self, blocks) -> None:
        self.set_joint(*blocks["joint"])

    def last_block(self) -> str:
        return "joint"

    def set_joint(self, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Set ``q = N(loc (T,), scale_tril scale_tril^T)`` (full-rank Coupled only)."""
        if self.rank is not None:
            raise ValueError("set_joint needs a full-rank Coupled guide (rank=None)")
        copy_into(self, "loc", loc, constraints.real)
        copy_into(self, "scale_tril",
                  unconstrained_tril(scale_tril, self._preconditioner(scale_tril)),
                  constraints.real)
