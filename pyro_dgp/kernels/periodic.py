"""The periodic kernel."""

from __future__ import annotations

import math

import torch
from pyro.nn import PyroParam

from ..constraints import positive
from .base import Kernel, matrix_scale, pointwise, positive_hyperparameter

__all__ = ["Periodic"]


def _per_dim(v: torch.Tensor) -> torch.Tensor:
    """An ARD hyperparameter ``(D,)`` or ``(..., 1, D)`` per sample, shaped to divide
    ``(..., N, M, D)`` pairwise differences."""
    return v.unsqueeze(-2) if v.dim() > 1 else v


class Periodic(Kernel):
    """``variance * exp(-2 sum_d sin^2(pi (x_d - x'_d) / period) / lengthscale_d^2)``."""

    def __init__(self, input_dim: int, variance=1.0, lengthscale=1.0, period=1.0, ard=True):
        super().__init__(input_dim)
        ard = bool(ard)
        self.variance = PyroParam(positive_hyperparameter(self, "variance", variance),
                                  positive)
        self.lengthscale = PyroParam(positive_hyperparameter(self, "lengthscale", lengthscale,
                                                             ard), positive)
        self.period = PyroParam(positive_hyperparameter(self, "period", period, ard),
                                positive)

    def forward(self, X1, X2=None, diag=False):
        self._check(X1)
        if diag:
            return pointwise(self.variance, X1)
        if X2 is None:
            X2 = X1
        else:
            self._check(X2)
        diff = X1.unsqueeze(-2) - X2.unsqueeze(-3)  # (..., N, M, D)
        s = torch.sin(math.pi * diff / _per_dim(self.period)) / _per_dim(self.lengthscale)
        return matrix_scale(self.variance) * torch.exp(-2 * (s * s).sum(-1))
