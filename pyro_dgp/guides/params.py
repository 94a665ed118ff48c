"""Storage of variational parameters: nested ``PyroParam``\\ s by site name, writes into them,
and the block preconditioner of a joint Cholesky factor."""

from __future__ import annotations

import functools

import torch

__all__ = ["CROSS_POWER", "block_preconditioner", "copy_into", "cross_scale", "deep_getattr",
           "holder_and_leaf", "preconditioned_cholesky", "unconstrained_tril"]


def deep_getattr(obj, key: str):
    """Inverse of Pyro's ``deep_setattr``: ``obj.a.b.c`` for ``key = "a.b.c"``."""
    return functools.reduce(getattr, key.split("."), obj)


def holder_and_leaf(obj, key: str):
    """``(obj.a.b, "c")`` for ``key = "a.b.c"``: the module that holds a nested ``PyroParam``
    and its attribute name. Every step on the path is a ``PyroModule.__getattr__`` call, so
    code that reads the parameter at every step looks the holder up once."""
    path, _, leaf = key.rpartition(".")
    return (deep_getattr(obj, path) if path else obj), leaf


def copy_into(param_holder, name: str, value: torch.Tensor, constraint=None) -> None:
    """Write the constrained ``value`` into the ``PyroParam`` ``name`` (a dotted path) of
    ``param_holder``, under ``constraint`` (default: the one the parameter was declared with).
    Works in both of Pyro's parameter modes (global store or module-local)."""
    *path, leaf = name.split(".")
    module = deep_getattr(param_holder, ".".join(path)) if path else param_holder
    declared = getattr(module, "_pyro_params", {}).get(leaf)
    if declared is None:  # a plain nn.Parameter (e.g. an autoguide's loc): no constraint
        with torch.no_grad():
            getattr(module, leaf).copy_(value)
        return
    if constraint is None:
        constraint = declared[0]
    with torch.no_grad():
        getattr(module, leaf + "_unconstrained").copy_(
            torch.distributions.transform_to(constraint).inv(value))


#: cross-block entries of a joint factor are scaled by ``n ** -CROSS_POWER`` (see below)
CROSS_POWER = 1.0


def cross_scale(n: int) -> float:
    """The scale ``n ** -CROSS_POWER`` of a joint factor's cross-block entries, for ``n``
    columns (:func:`block_preconditioner`; Chain's couplings, ``n`` the layer below's size)."""
    return float(n) ** -CROSS_POWER


def block_preconditioner(sizes: list[int], like: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` scales of a lower-triangular factor's entries over blocks of the given sizes
    (one block per layer output): 1 within a block (and on the diagonal),
    :func:`cross_scale` ``(n) = 1/n`` between blocks.

    Adam moves every coordinate by about ``lr`` per step, whatever the size of its gradient,
    and early in training the cross-block entries' gradients are mostly Monte Carlo noise.
    Within a block the scales keep MeanField's rate: a joint guide's per-layer blocks are
    parameterised as MeanField's. Across blocks, the hundreds of entries of a row moving at
    that rate inflate the layers' covariance and stall training: on yacht, Coupled's training
    ELBO rose steadily as the cross scale fell from ``1/sqrt(n)`` to ``1/n`` and below, and
    with the entries frozen at zero it trained as MeanField
    (``benchmarks/results/history.md``, "Why Coupled trails MeanField: the cross-layer
    entries"). With ``1/n`` a row's cross part still moves by about ``lr / sqrt(n)`` per
    step where the gradients keep their signs.
    """
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(like.device)
    same = ids[:, None] == ids[None, :]
    cross = torch.full(same.shape, cross_scale(sum(sizes)), dtype=like.dtype,
                       device=like.device)
    return torch.where(same, torch.ones_like(cross), cross)


class _PreconditionedCholesky(torch.autograd.Function):
    """``(L, log det L L^T)`` of :func:`preconditioned_cholesky`, one pass over ``n^2``
    entries each way.

    Written by hand because the composition of torch's ``LowerCholeskyTransform``, the
    preconditioner's product and a log-determinant through ``L.diagonal()`` allocates about
    five ``n x n`` temporaries forward and as many backward (``tril``, ``diag_embed``, the sum,
    the product, the zero-filled gradient of each ``diagonal``); on Coupled's ``T x T`` joint
    factor those passes outweighed the step's matrix products
    (``benchmarks/results/history.md``, "The joint guides' factor in one pass")."""

    @staticmethod
    def forward(ctx, raw, strict):
        diag = raw.diagonal(dim1=-2, dim2=-1).exp()
        L = raw.tril(-1) if strict is None else raw * strict
        L.diagonal(dim1=-2, dim2=-1).copy_(diag)
        ctx.save_for_backward(strict, diag)
        return L, 2 * raw.diagonal(dim1=-2, dim2=-1).sum(-1)

    @staticmethod
    def backward(ctx, grad_L, grad_logdet):
        strict, diag = ctx.saved_tensors
        grad = grad_L.tril(-1) if strict is None else grad_L * strict
        grad.diagonal(dim1=-2, dim2=-1).copy_(
            grad_L.diagonal(dim1=-2, dim2=-1) * diag + 2 * grad_logdet.unsqueeze(-1))
        return grad, None


def preconditioned_cholesky(raw: torch.Tensor, strict: torch.Tensor | None = None):
    """The lower Cholesky factor stored unconstrained in ``raw (..., n, n)`` and its
    ``log det L L^T (...)``: ``L = diag(exp(diag raw)) + tril(raw, -1) * scale``, with
    ``strict = tril(scale, -1)`` the strictly lower part of :func:`block_preconditioner`'s
    scales (the diagonal's scale is 1), or ``None`` for unit scales (then ``L`` is torch's
    ``LowerCholeskyTransform`` of ``raw``). Entries of ``raw`` above the diagonal are unused."""
    return _PreconditionedCholesky.apply(raw, strict)


def unconstrained_tril(L: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of :func:`preconditioned_cholesky`: the ``raw`` that gives the lower-triangular
    ``L`` (positive diagonal) under the preconditioner's ``scale`` (full, not strict; ``None``
    for unit scales)."""
    raw = L.tril(-1) if scale is None else L.tril(-1) / scale
    raw.diagonal(dim1=-2, dim2=-1).copy_(L.diagonal(dim1=-2, dim2=-1).log())
    return raw
