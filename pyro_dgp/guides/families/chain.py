"""``Chain``: ``q(u^1) prod_l q(u^l | u^{l-1})`` with Gaussian conditionals (Ustyuzhaninov et
al. 2020, eq. 14-17)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam

from ...gp.conditional import solve_triangular
from ..joint import JointGaussian
from ..params import (
    copy_into,
    cross_scale,
    deep_getattr,
    preconditioned_cholesky,
    unconstrained_tril,
)
from ..prototype import LayerSite
from ..registry import register_guide

__all__ = ["Chain"]


@register_guide("chain-per-point", "chain, always drawing the inducing outputs per data point",
                per_point=True)
@register_guide("chain", "chain-structured Gaussian q(u1) prod q(ul | ul-1), last layer "
                "collapsed; per-point draws while N T^2 <= 1e9")
class Chain(JointGaussian):
    """``q(u^1) prod_{l>1} q(u^l | u^{l-1})`` with Gaussian conditionals (Ustyuzhaninov et al.
    2020, eq. 14-17):

        v_1 = m_1 + L_1 e_1,   v_l = m_l + B_l (v_{l-1} - m_{l-1}) + L_l e_l,

    a joint Gaussian with block-tridiagonal precision and parameters linear in depth.

    Estimator (module docstring): ``u^1..u^{L-1}`` are drawn (ancestrally) and
    ``f^1..f^{L-1}`` come from the model's conditionals; the last layer's ``u^L`` is integrated
    out through ``q(u^L | u^{L-1})`` (Gaussian, independent of everything else given
    ``u^{L-1}``), so ``f^L`` is drawn from the collapsed marginal: exact, and of lower variance
    than sampling ``u^L``. ``per_point`` and ``estimator`` as for :class:`Coupled`.

    Initialisation: the inner layers at ``inner_variance = 0.01`` times the prior's covariance
    (as :class:`Coupled`), the last at its prior, couplings zero. A near-deterministic inner
    start (``inner_variance=1e-5``, DSVI's) is unstable here with three layers or more: the
    whitened residual passed up the chain, ``w_l = L_l^-1 C_l w_{l-1} + e_l``, grows like
    ``|C_l| / sqrt(inner_variance)`` as soon as a step moves ``C_l``. From the prior, Chain
    ended in the noise-only fit on the compositional toy of Ustyuzhaninov et al. 2020
    (``benchmarks/results/history.md``, "Why Coupled trails MeanField: the cross-layer
    entries").
    """

    def __init__(self, model, inner_variance: float = 0.01, per_point: bool | None = None,
                 estimator: str = "sampled", name=None):
        super().__init__(model, inner_variance, per_point, estimator, name=name)
        self.locs = PyroModule()
        self.scale_trils = PyroModule()
        self.couplings = PyroModule()

    def _setup_sites(self, sites):
        for site, blk in zip(sites, self._init_blocks(), strict=True):
            n = site.shape.numel()
            deep_setattr(self.locs, site.name, PyroParam(site.layer.initial_u_loc().reshape(n)))
            tril = torch.block_diag(*blk)
            deep_setattr(self.scale_trils, site.name,
                         PyroParam(unconstrained_tril(tril, self._preconditioner(tril, site)),
                                   constraints.real))  # _scale maps it to L_l
            if site.index > 0:
                prev = sites[site.index - 1].shape.numel()
                deep_setattr(self.couplings, site.name, PyroParam(blk.new_zeros(n, prev)))

    def _scale(self, site: LayerSite) -> torch.Tensor:
        """``L_l (n_l, n_l)``, the Cholesky factor of ``Cov q(u^l | u^{l-1})``."""
        return self._scale_and_logdet(site)[0]

    def _scale_and_logdet(self, site: LayerSite) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L_l (n_l, n_l), log det L_l L_l^T ())``."""
        raw = deep_getattr(self.scale_trils, site.name)
        return preconditioned_cholesky(raw, self._preconditioner(raw, site, strict=True))

    def _coupling(self, site: LayerSite) -> torch.Tensor:
        """``C_l = B_l L_{l-1}`` ``(n_l, n_{l-1})``, the stored coupling (see
        :meth:`block_params`)."""
        # C holds cross-layer entries only (see block_preconditioner)
        return deep_getattr(self.couplings, site.name) / self._coupling_divisor(site)

    def block_params(self, site: LayerSite):
        """``(m_l (n_l,), L_l (n_l, n_l), B_l (n_l, n_{l-1}) or None)``.

        The parameter is ``C_l = B_l L_{l-1}``, the coupling to the layer below's whitened
        residual ``w_{l-1} = L_{l-1}^{-1} (v_{l-1} - m_{l-1})``, not ``B_l``: the same family,
        but a gradient step on ``B_l`` changes the cross covariance ``B_l L_{l-1} L_{l-1}^T``
        in proportion to the small inner-layer scale (``L_{l-1} ~ sqrt(inner_variance) I`` at
        the start), so the coupling hardly moved: on the compositional toy of Ustyuzhaninov
        et al. 2020 Chain kept far less of Coupled's ``Var[f1(0)]`` and trailed its ELBO,
        though with two layers the two families are the same (``benchmarks/results/history.md``,
        "Chain's coupling parameter"). ``C_l`` is in the units of
        Coupled's cross-layer factor entries (with two layers it is that block). Draws and
        :meth:`factor` use ``C_l`` and ``w`` directly (``v_l = m_l + C_l w_{l-1} + L_l e_l``),
        never ``L_{l-1}^{-1}`` applied to a difference of draws, whose gradient for
        ``L_{l-1}`` would be two large terms that cancel.
        """
        L = self._scale(site)
        B = None
        if site.index > 0:  # B = C L_{l-1}^{-1}, i.e. B^T = L_{l-1}^{-T} C^T
            below = self._scale(self.layer_sites[site.index - 1])
            B = torch.linalg.solve_triangular(below.mT, self._coupling(site).mT, upper=True).mT
        return deep_getattr(self.locs, site.name), L, B

    def _set_blocks(self, blocks):
        sizes = [s.shape.numel() for s in self.layer_sites]
        for site, (loc, tril) in zip(self.layer_sites, blocks, strict=True):
            coupling = None if site.index == 0 else loc.new_zeros(loc.shape[-1],
                                                                  sizes[site.index - 1])
            self.set_block(site, loc, tril, coupling)

    def set_block(self, site: LayerSite, loc, scale_tril, coupling=None) -> None:
        """Set ``q(u^l | u^{l-1}) = N(loc + coupling (v_{l-1} - m_{l-1}), scale_tril ...)``.

        :param loc: ``(n_l,)``; :param scale_tril: ``(n_l, n_l)``;
        :param coupling: ``(n_l, n_{l-1})`` (not for the first layer). It is stored relative to
            the layer below's ``scale_tril`` (see :meth:`block_params`): set that layer first.
        """
        copy_into(self.locs, site.name, loc, constraints.real)
        copy_into(self.scale_trils, site.name,
                   unconstrained_tril(scale_tril, self._preconditioner(scale_tril, site)),
                   constraints.real)
        if coupling is not None:
            with torch.no_grad():  # stored as C = B L_{l-1} (see block_params)
                below = self._scale(self.layer_sites[site.index - 1])
            copy_into(self.couplings, site.name, coupling @ below * self._coupling_divisor(site),
                       constraints.real)

    def _set_layer(self, site, loc, scale_tril):
        """``q(u^l) = N(loc, scale_tril scale_tril^T)``, independent of the other layers: the
        couplings into and out of the layer are set to zero; the other layers keep their
        conditional parameters."""
        zeros = loc.new_zeros
        below = self.layer_sites[site.index - 1] if site.index > 0 else None
        self.set_block(site, loc, scale_tril,
                       None if below is None else zeros(loc.shape[-1], below.shape.numel()))
        if not site.is_last:
            above = self.layer_sites[site.index + 1]
            copy_into(self.couplings, above.name, zeros(above.shape.numel(), loc.shape[-1]),
                      constraints.real)

    def _set_joint(self, loc, scale_tril):
        """The chain of conditionals of ``N(loc, L L^T)``: ``B_l = S_{l,l-1} S_{l-1,l-1}^-1``
        and ``Cov(u^l | u^{l-1}) = S_ll - B_l S_{l-1,l}``. Exact where the joint's precision is
        block tridiagonal over layers; otherwise no chain represents it (``ValueError``)."""
        cov = scale_tril @ scale_tril.mT
        offsets = self._offsets()
        blocks = [slice(o, o + s.shape.numel()) for o, s in zip(offsets, self.layer_sites,
                                                                 strict=True)]
        for site, block in zip(self.layer_sites, blocks, strict=True):
            if site.index == 0:
                self.set_block(site, loc[block], torch.linalg.cholesky(cov[block, block]))
                continue
            prev = blocks[site.index - 1]
            B = torch.linalg.solve(cov[prev, prev], cov[prev, block]).mT
            cond = cov[block, block] - B @ cov[prev, block]
            self.set_block(site, loc[block],
                           torch.linalg.cholesky(0.5 * (cond + cond.mT)), B)
        _, R, _, _ = self.factor()
        if not torch.allclose(R @ R.mT, cov, rtol=1e-6, atol=1e-8 * cov.diagonal().max()):
            raise ValueError("set_q: the joint q is not chain-structured (its precision is not "
                             "block tridiagonal over layers); Chain cannot represent it")

    def _coupling_divisor(self, site: LayerSite) -> float:
        """``1 / cross_scale(n_{l-1})``: the couplings are cross-layer entries of the joint
        factor, scaled as Coupled's (:func:`~pyro_dgp.guides.params.block_preconditioner`)."""
        return 1.0 / cross_scale(self.layer_sites[site.index - 1].shape.numel())

    def factor(self):
        """The joint as ``v = mean + R e`` with block lower-triangular ``R`` (T x T)."""
        means, rows, logdet = [], [], 0.0
        T = self.dim
        offset, W = 0, None  # W (n_{l-1}, T): w_{l-1} = W e
        for site in self.layer_sites:
            m, (L, logdet_l) = deep_getattr(self.locs, site.name), self._scale_and_logdet(site)
            n = m.shape[-1]
            block = slice(offset, offset + n)
            # out of place throughout: the triangular solve's output is saved for backward
            place = (block.start, T - block.stop)  # pad (n, n) to (n, T) at this block
            coupled = None if W is None else self._coupling(site) @ W  # C_l w_{l-1}
            W_next = None
            if not site.is_last:  # w_l = L_l^{-1} C_l w_{l-1} + e_l
                W_next = F.pad(torch.eye(n, dtype=L.dtype, device=L.device), place)
                if coupled is not None:
                    W_next = W_next + torch.linalg.solve_triangular(L, coupled, upper=False)
            row = F.pad(L, place) if coupled is None else coupled + F.pad(L, place)
            means.append(m)
            rows.append(row)
            logdet = logdet + logdet_l
            offset, W = offset + n, W_next
        return torch.cat(means), torch.cat(rows), None, logdet

    def joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean (T,), covariance (T, T))`` of ``q(v)``."""
        mean, R, _, _ = self.factor()
        return mean, R @ R.mT

    def _draw_with_last_loc(self, batch_shape):
        # ancestral sampling: O(sum_l n_l (n_l + n_{l-1})) per draw, not the dense T^2. The
        # noises e_l of the conditionals are the joint draw's eps: q(v) = prod_l N(e_l; 0, I)
        # / prod_l det L_l, which is log_q's formula with log det Cov = 2 sum_l log diag L_l
        parts, noises, w, loc = [], [], None, None
        for site in self.layer_sites:
            m, L = deep_getattr(self.locs, site.name), self._scale(site)
            shift = None if w is None else w @ self._coupling(site).mT  # C_l w_{l-1}
            loc = m if shift is None else m + shift
            eps = torch.randn(batch_shape + m.shape, dtype=m.dtype, device=m.device)
            parts.append(loc + eps @ L.mT)
            noises.append(eps)
            if not site.is_last:  # w_l = L_l^{-1} C_l w_{l-1} + e_l
                # one triangular solve for all draws (the batch folded into its columns)
                w = eps if shift is None else eps + solve_triangular(L, shift.unsqueeze(-1),
                                                           upper=False).squeeze(-1)
        return torch.cat(parts, -1), loc, torch.cat(noises, -1)

    def last_scale(self):
        return self._scale(self.layer_sites[-1])
