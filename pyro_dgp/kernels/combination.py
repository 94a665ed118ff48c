"""Sums and products of kernels over the same inputs."""

from __future__ import annotations

import torch
from pyro.nn import PyroModule

from .base import Kernel
from .white import White

__all__ = ["Product", "Sum"]


class _Combination(Kernel):
    """Two or more kernels of the same ``input_dim``, held in ``kernels``."""

    def __init__(self, *kernels: Kernel):
        if len(kernels) < 2:
            raise ValueError("a kernel combination needs at least two kernels")
        bad = [type(k).__name__ for k in kernels if not isinstance(k, Kernel)]
        if bad:
            raise TypeError(f"{type(self).__name__}: kernels must be pyro_dgp kernels, got {bad}")
        dims = {k.input_dim for k in kernels}
        if len(dims) != 1:
            raise ValueError(f"combined kernels must share input_dim, got {sorted(dims)}")
        super().__init__(dims.pop())
        self.kernels = PyroModule[torch.nn.ModuleList](kernels)


class Sum(_Combination):
    """``k1 + k2 + ...``"""

    def forward(self, X1, X2=None, diag=False):
        kernels = self.kernels
        if X2 is not None and not diag:
            # White is zero between distinct point sets: skip its (N, M) zeros and their add
            # (the cross-covariance K_ZX of an inner DSVI layer is the hot path)
            kernels = [k for k in kernels if not isinstance(k, White)] or kernels[:1]
        out = kernels[0](X1, X2, diag)
        for k in kernels[1:]:
            out = out + k(X1, X2, diag)
        return out

    def conditional_parts(self, Z, X):
        first, *rest = self.kernels  # iterated: a slice of a ModuleList builds a new one
        Kzz, Kzx, kxx = first.conditional_parts(Z, X)
        for k in rest:
            kzz, kzx, kd = k.conditional_parts(Z, X)
            Kzz, kxx = Kzz + kzz, kxx + kd
            if kzx is not None:
                Kzx = kzx if Kzx is None else Kzx + kzx
        return Kzz, Kzx, kxx


class Product(_Combination):
    """``k1 * k2 * ...`` (elementwise)."""

    def forward(self, X1, X2=None, diag=False):
        out = self.kernels[0](X1, X2, diag)
        for k in self.kernels[1:]:
            out = out * k(X1, X2, diag)
        return out
