"""Estimators of a layer's function values: how a family's ``q(u)`` reaches ``f``.

A family stores the parameters of ``q(u)``; one of these turns what it drew or holds into
the per-point Gaussian ``N(loc, var)`` of ``f`` at the layer's inputs ``x (..., N, D_in)``,
through the one conditional of :mod:`pyro_dgp.gp.conditional`. Each returns ``(loc, var)``,
both ``(..., N, D_out)``.
"""

from __future__ import annotations

import torch

from ..gp.conditional import solve_triangular
from ..linalg import cholesky
from .prototype import LayerSite

__all__ = ["collapsed", "path", "per_point", "sampled"]


def sampled(site: LayerSite, x: torch.Tensor, u: torch.Tensor):
    """The model's own ``p(f | u, x)`` at a drawn ``u (..., D_out, M)``: unbiased for any
    ``q(u)`` (the sampled-u estimator)."""
    return site.layer.conditional(x, u)


def path(site: LayerSite, x: torch.Tensor, u: torch.Tensor):
    """``(loc, var, scale_tril)``: :func:`sampled` and the lower Cholesky factor ``(..., N, N)``
    of the model's covariance of ``f`` over the ``N`` points given ``u``,
    ``K_XX - K_XZ K_ZZ^-1 K_ZX`` (shared by the outputs; ``(..., D_out, N, N)``, one per output,
    for a kernel per output), to draw ``f`` jointly over ``x`` as one function's values.
    ``O(N^3)`` per batch entry of ``x`` (and output)."""
    layer = site.layer
    loc, var = sampled(site, x, u)
    xs = x.unsqueeze(-3) if layer.kernel_outputs else x  # a kernel per output: its own dim
    A = solve_triangular(layer.kzz_cholesky(), layer.kernel(layer.current_inducing_inputs(), xs),
                         upper=False)  # (..., M, N), or (..., D, M, N) per output
    residual = layer.kernel(xs) - A.mT @ A
    # the residual is near-singular wherever u pins f down: jitter relative to its own scale
    scale_tril = cholesky(0.5 * (residual + residual.mT),
                          name=f"layer '{layer.name}' (sample path)")
    return loc, var, scale_tril


def collapsed(site: LayerSite, x: torch.Tensor, loc: torch.Tensor, scale_tril: torch.Tensor):
    """``u ~ N(loc (D_out, M), S)`` integrated out per point (Salimbeni and Deisenroth 2017):
    exact where that Gaussian is ``u``'s law given everything else drawn (``scale_tril``:
    ``(D_out, M, M)`` or a factor ``(D_out, M, K)`` of ``S``)."""
    return site.layer.conditional(x, loc, scale_tril)


def per_point(site: LayerSite, x: torch.Tensor, loc: torch.Tensor,
              scale_tril: torch.Tensor | None = None,
              inducing_inputs: torch.Tensor | None = None):
    """Each of the ``N`` points is its own batch entry: ``loc (..., N, D_out, M)`` (a draw of
    ``u`` per point, or per point the mean of a Gaussian ``u`` with factor ``scale_tril``),
    and ``inducing_inputs (..., N, M, D_in)`` where the layer below drew this layer's inducing
    inputs per point. Unbiased: the expected log-likelihood is a sum over points of
    expectations under the same ``q``, so each point may use its own draw."""
    with site.layer.given_inducing_inputs(inducing_inputs):
        loc, var = site.layer.conditional(x.unsqueeze(-2), loc, scale_tril)
    return loc.squeeze(-2), var.squeeze(-2)
