"""The collapsed estimator of the cross-layer Gaussian guides: every layer's ``u`` integrated
out per point, as DSVI's collapsed estimator does for independent layers (Salimbeni and
Deisenroth 2017), for a ``q(U)`` that couples the layers.

The joint guides write ``q(v) = N(mean, R R^T)`` over ``v = [vec u^1; ...; vec u^L]`` as
``v = mean + R e`` with ``e ~ N(0, I_K)``. Given its input ``x_n``, layer ``l``'s value at one
point is linear in ``e`` plus noise independent of everything else (the projected form of
:mod:`pyro_dgp.gp.conditional`, in whitened coordinates):

    f^l_n = c_n + G_n e + r_n,    G_n = A_n^T R_l  (D_l, K),    r_n ~ N(0, diag k~_n),

with ``A_n`` the layer's projection at ``x_n``, ``R_l`` layer ``l``'s rows of ``R`` and
``c_n = m(x_n) + A_n^T mean_l``. Given the point's earlier values ``f^1_n .. f^{l-1}_n``,
``e`` is therefore Gaussian, ``N(mu_n, I - C_n^T C_n)``, and ``f^l_n`` is Gaussian over the
layer's outputs, with mean ``c_n + G_n mu_n`` and covariance

    V_n = G_n G_n^T - (C_n G_n^T)^T (C_n G_n^T) + diag k~_n.

An inner layer's ``f^l_n`` is drawn as ``loc + chol(V_n) xi`` and ``e`` conditioned on that draw
(a Kalman update): with ``B_n = (G_n^T - C_n^T C_n G_n^T) chol(V_n)^{-T}`` ``(K, D_l)``,
``mu_n <- mu_n + B_n xi`` and ``C_n`` gains the rows ``B_n^T``. The last layer's per-output
marginal goes to the likelihood. Each point's values so have exactly their law under the guide:
an unbiased estimate of the same ELBO as the sampled estimator's, with no ``u`` drawn. Per
step ``O(N T K)`` (``T = sum_l D_l M_l``), the order of the per-point sampled draws'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gp.conditional import layer_parts, projection, solve_triangular
from ..gp.distributions import CorrelatedOutputs
from ..linalg import cholesky
from .prototype import LayerSite

__all__ = ["PointPosterior", "collapsed_joint", "layer_projection"]


def layer_projection(site: LayerSite, x: torch.Tensor, mean: torch.Tensor, rows: torch.Tensor):
    """``(c (..., N, D), G (..., N, D, K), k~ (..., N, D) or (..., N, 1))`` of the module
    docstring for layer ``site`` at inputs ``x (..., N, D_in)``, given ``u = mean + rows e``
    (``mean (D, M)``, ``rows (D, M, K)``, in the layer's own parameterisation): one GEMM of the
    layer's projection with the rows."""
    layer = site.layer
    per_output = layer.kernel_outputs is not None
    _, Kzx, Lzz, kxx = layer_parts(layer, x)
    if not layer.whiten:  # v = L^-1 u
        mean = solve_triangular(Lzz, mean.unsqueeze(-1), upper=False).squeeze(-1)
        rows = solve_triangular(Lzz, rows, upper=False)
    A, residual = projection(Kzx, Lzz, kxx, per_output)
    if per_output:  # A (..., D, M, N)
        c = (mean.unsqueeze(-2) @ A).squeeze(-2).mT
        G = torch.einsum("...dmn,dmk->...ndk", A, rows)
        residual = residual.mT
    else:  # A (..., M, N): one (N, M) x (M, D K) product
        D, M, K = rows.shape
        c = A.mT @ mean.mT
        G = (A.mT @ rows.permute(1, 0, 2).reshape(M, D * K)).unflatten(-1, (D, K))
        residual = residual.unsqueeze(-1)
    return c + layer.mean_function(x), G, residual.clamp_min(torch.finfo(residual.dtype).tiny)


@dataclass
class PointPosterior:
    """``e``'s law given one guide run's draws so far, per point: ``N(mean, I - rows^T rows)``,
    ``mean (..., N, K)``, ``rows (..., N, r, K)`` (``None``: ``r = 0``); ``pending`` the last
    inner layer's ``(gain (..., N, K, D), draw)``, applied once its value is drawn;
    ``layers`` how many layers have been collapsed in this run."""

    mean: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    pending: tuple | None = None
    layers: int = 0

    def condition(self) -> None:
        """Apply the pending Kalman update with the noise its draw used."""
        if self.pending is None:
            return
        gain, draw = self.pending
        xi = draw.noise.get("xi")
        if xi is None:
            raise RuntimeError("collapsed joint estimator: the layer below was not drawn "
                               "before this layer was evaluated")
        self.mean = self.mean + (gain @ xi.unsqueeze(-1)).squeeze(-1)
        new = gain.mT  # (..., N, D, K)
        if self.rows is None:
            self.rows = new
        else:
            batch = torch.broadcast_shapes(self.rows.shape[:-2], new.shape[:-2])
            self.rows = torch.cat([self.rows.expand(batch + self.rows.shape[-2:]),
                                   new.expand(batch + new.shape[-2:])], dim=-2)
        self.pending = None


def collapsed_joint(site: LayerSite, x: torch.Tensor, mean: torch.Tensor, rows: torch.Tensor,
                    state: PointPosterior):
    """Layer ``site``'s ``f`` at ``x (..., N, D_in)`` with every ``u`` integrated out (module
    docstring), given layer ``site``'s block ``u = mean (D, M) + rows (D, M, K) e`` of the
    joint and the run's ``state``. The last layer: ``(loc, var)``, each ``(..., N, D)``; an
    inner layer: a :class:`~pyro_dgp.gp.distributions.CorrelatedOutputs` to draw from, whose
    draw conditions the next layer."""
    if site.index != state.layers:
        raise RuntimeError(
            f"collapsed joint estimator: layer '{site.name}' is evaluated as layer "
            f"{state.layers + 1} of this run; it needs each layer's f drawn once per run, in "
            "the guide's layer order (use estimator='sampled' for other models)")
    state.condition()
    c, G, residual = layer_projection(site, x, mean, rows)
    state.layers += 1
    if state.mean is None:
        state.mean = G.new_zeros(G.shape[:-2] + G.shape[-1:])
    loc = c + (G @ state.mean.unsqueeze(-1)).squeeze(-1)
    CG = None if state.rows is None else state.rows @ G.mT  # (..., N, r, D)
    if site.is_last:
        var = residual + G.square().sum(-1)
        if CG is not None:
            var = var - CG.square().sum(-2)
        return loc, var.clamp_min(torch.finfo(var.dtype).tiny)
    cov = G @ G.mT + torch.diag_embed(residual.expand(loc.shape))
    cross = G.mT  # Cov(e, f) = (I - C^T C) G^T, (..., N, K, D)
    if CG is not None:
        cov = cov - CG.mT @ CG
        cross = cross - state.rows.mT @ CG
    cov = 0.5 * (cov + cov.mT)
    # V's own factor where it has one (k~ > 0 makes V positive definite), so that the draw and
    # the Kalman gain use V itself; linalg.cholesky adds its jitter from the first try
    L, info = torch.linalg.cholesky_ex(cov)
    if bool(info.any()):  # round-off: jitter, escalated, then an error naming the layer
        L = cholesky(cov, name=f"layer '{site.layer.name}' (collapsed joint)")
    gain = torch.linalg.solve_triangular(L, cross.mT, upper=False).mT  # cross L^-T
    draw = CorrelatedOutputs(loc, L)
    state.pending = (gain, draw)
    return draw
