"""Encoders of amortized guides: maps from a layer's (summarised) input to ``q(u_n)``.

An encoder of a layer with ``D_in`` inputs, ``D_out`` outputs and ``M`` inducing points is any
``torch.nn.Module`` (or ``PyroModule``) called as ``encoder(p)`` with ``p`` of shape
``(..., N, D_in)`` that returns ``(loc, scale)``:

- ``loc``: ``(..., N, D_out, M)``, the mean of the whitened ``u_n`` of each output;
- ``scale``: ``(..., N, D_out, M)`` positive (a diagonal covariance, the default of Meng and
  Zhang 2024 for deep models), or ``(..., N, D_out, M, M)`` lower triangular with a positive
  diagonal (a full Cholesky factor per output).

The shapes are checked at every call; the values of the scale (lower triangular, positive
diagonal) at a guide's first call of each layer's encoder, and at every call while Pyro's
validation is on.
"""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_

__all__ = ["MLPEncoder", "as_pyro_module", "check_encoded"]


def _mlp(d_in: int, d_out: int, width: int, dtype=None, device=None) -> torch.nn.Sequential:
    """Two hidden layers of ``width`` units with LeakyReLU(0.2), as in Meng and Zhang 2024,
    created in ``dtype`` on ``device`` (``None``: torch's defaults): its initial weights are
    drawn in that dtype, so they do not depend on torch's default dtype."""
    like = {"dtype": dtype, "device": device}
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, width, **like), torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(width, width, **like), torch.nn.LeakyReLU(0.2),
        torch.nn.Linear(width, d_out, **like))


class MLPEncoder(PyroModule):
    """The encoder of Meng and Zhang 2024: two MLPs, ``g`` for the mean and ``h`` for the
    scale (softplus), each with two hidden layers as wide as the smaller of their input and
    output sizes. Initially the outputs are equal over the ``M`` inducing outputs of each
    unit, as in their App. C.1: the mean's output layer has one random row per unit, shared
    by its ``M`` outputs (and no bias), so each point starts at its own mean; the scale's
    has zero weight, so every point starts at scale ``init_scale``. (A mean of zero at every
    point would be a saddle: with zero means and ``W = I``, a layer's inducing inputs move
    with its input, so every point then sees the same numbers and no gradient tells them
    apart.)

    :param input_dim: D_in; :param output_dim: D_out; :param num_inducing: M.
    :param init_scale: the initial scale of ``q(u_n)`` (whitened: 1 is the prior).
    """

    def __init__(self, input_dim: int, output_dim: int, num_inducing: int,
                 init_scale: float = 1.0, dtype=None, device=None):
        super().__init__()
        self.output_dim, self.num_inducing = output_dim, num_inducing
        n = output_dim * num_inducing
        width = max(1, min(input_dim, n))
        self.mean_net = _mlp(input_dim, n, width, dtype, device)
        self.scale_net = _mlp(input_dim, n, width, dtype, device)
        with torch.no_grad():
            out = self.mean_net[-1]
            out.weight.copy_(out.weight[::num_inducing].repeat_interleave(num_inducing, 0))
            out.bias.zero_()
            self.scale_net[-1].weight.zero_()
            self.scale_net[-1].bias.fill_(math.log(math.expm1(init_scale)))
        to_pyro_module_(self)

    def forward(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``p (..., N, D_in) -> (loc, scale)``, each ``(..., N, D_out, M)``."""
        shape = p.shape[:-1] + (self.output_dim, self.num_inducing)
        loc = self.mean_net(p).reshape(shape)
        scale = torch.nn.functional.softplus(self.scale_net(p)).reshape(shape)
        return loc, scale


def as_pyro_module(encoder, label: str) -> PyroModule:
    """``encoder`` as a ``PyroModule`` (converted in place: its parameters then go through
    Pyro's parameter store, so ``SVI`` trains them)."""
    if not isinstance(encoder, torch.nn.Module):
        raise TypeError(f"{label}: an encoder must be a torch.nn.Module, got "
                        f"{type(encoder).__name__}")
    if not isinstance(encoder, PyroModule):
        to_pyro_module_(encoder)
    return encoder


def _describe(out) -> str:
    """What an encoder returned, for an error message."""
    if isinstance(out, tuple | list):
        inner = ", ".join(f"tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                          else type(t).__name__ for t in out)
        return f"a {type(out).__name__} of {len(out)} ({inner})"
    if isinstance(out, torch.Tensor):
        return f"one tensor of shape {tuple(out.shape)}"
    return type(out).__name__


def check_encoded(out, p: torch.Tensor, D: int, M: int, layer: str, validate: bool = True,
                  keep_diagonal: bool = False):
    """The ``(loc, scale_tril)`` of an encoder's output at ``p (..., N, D_in)``.

    The shapes are always checked; with ``validate`` also the values of the scale. ``q(u_n)``
    is ``N(loc, L L^T)`` and its KL to ``N(0, I)`` uses ``log det(L L^T) = 2 sum_m log L_mm``,
    which holds for a lower triangular ``L`` with a positive diagonal only. So a Cholesky
    factor must have exact zeros above its diagonal (dropping nonzero entries there would
    silently change the covariance the encoder meant) and a positive diagonal, and a
    diagonal scale must be positive.

    :returns: ``loc (..., N, D, M)`` and ``scale_tril (..., N, D, M, M)``; with
        ``keep_diagonal`` a diagonal scale is returned as it is, ``(..., N, D, M)``.
    :raises ValueError: naming the layer and the expected shapes where they differ, a dtype
        or device other than the inputs', or the problem with the scale's values.
    """
    expected = tuple(p.shape[:-1]) + (D, M)
    shapes = (f"loc {expected} and scale {expected} (diagonal) or {expected + (M,)} (a "
              "Cholesky factor)")
    if not (isinstance(out, tuple | list) and len(out) == 2
            and all(isinstance(t, torch.Tensor) for t in out)):
        raise ValueError(f"Amortized: the encoder of layer '{layer}' must return a pair of "
                         f"tensors (loc, scale) with {shapes}, got {_describe(out)}")
    loc, scale = out
    for name, t in (("loc", loc), ("scale", scale)):
        if t.dtype != p.dtype or t.device != p.device:
            raise ValueError(f"Amortized: the encoder of layer '{layer}' returned {name} as "
                             f"{t.dtype} on {t.device} for inputs {p.dtype} on {p.device}; it "
                             "must follow its inputs' dtype and device")
    if tuple(loc.shape) != expected:
        raise ValueError(f"Amortized: the encoder of layer '{layer}' returned loc of shape "
                         f"{tuple(loc.shape)} for inputs {tuple(p.shape)}; expected (..., N, "
                         f"D_out, M) = {expected}")
    if tuple(scale.shape) == expected:
        diagonal, tril = scale, None
    elif tuple(scale.shape) == expected + (M,):
        diagonal, tril = scale.diagonal(dim1=-2, dim2=-1), scale
        if validate:
            upper = scale.triu(1)
            if bool((upper != 0).any()):
                raise ValueError(f"Amortized: the encoder of layer '{layer}' returned a scale "
                                 f"of shape {tuple(scale.shape)} (a Cholesky factor) that is not "
                                 f"lower triangular: entries above the diagonal up to "
                                 f"{float(upper.abs().max()):.3g} in absolute value")
    else:
        raise ValueError(f"Amortized: the encoder of layer '{layer}' returned scale of shape "
                         f"{tuple(scale.shape)}; expected {expected} (diagonal) or "
                         f"{expected + (M,)} (a Cholesky factor)")
    if validate and not bool((diagonal > 0).all()):
        what = "a diagonal scale" if tril is None else "a Cholesky factor whose diagonal"
        raise ValueError(f"Amortized: the encoder of layer '{layer}' returned {what} that is "
                         f"not positive everywhere (smallest {float(diagonal.min()):.3g}; NaN "
                         "counts as not positive)")
    if tril is None and not keep_diagonal:
        return loc, torch.diag_embed(scale)
    return loc, scale
