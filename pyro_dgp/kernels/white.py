"""White noise, the between-layer noise of doubly stochastic variational inference."""

from __future__ import annotations

import torch
from pyro.nn import PyroParam

from ..constraints import positive
from .base import Kernel, matrix_scale, pointwise, positive_hyperparameter

__all__ = ["White"]


class White(Kernel):
    """White noise ``variance * [x == x']``, counted only when ``X2`` is omitted.

    Added to an inner layer's kernel it is the between-layer noise of DSVI (Salimbeni and
    Deisenroth 2017): it enters ``K_ZZ`` and ``k(x, x)`` but not the cross-covariance ``K_ZX``.
    """

    def __init__(self, input_dim: int, variance=1e-5):
        super().__init__(input_dim)
        self.variance = PyroParam(positive_hyperparameter(self, "variance", variance),
                                  positive)

    def forward(self, X1, X2=None, diag=False):
        self._check(X1)
        if diag:
            return pointwise(self.variance, X1)
        if X2 is not None:
            self._check(X2)
            shape = torch.broadcast_shapes(X1.shape[:-2], X2.shape[:-2])
            return X1.new_zeros(shape + (X1.shape[-2], X2.shape[-2]))
        eye = torch.eye(X1.shape[-2], dtype=X1.dtype, device=X1.device)
        return matrix_scale(self.variance) * eye.expand(X1.shape[:-2] + eye.shape)

    def conditional_parts(self, Z, X):
        self._check(Z)
        self._check(X)
        var = self.variance
        eye = torch.eye(Z.shape[-2], dtype=Z.dtype, device=Z.device)
        Kzz = matrix_scale(var) * eye.expand(Z.shape[:-2] + eye.shape)
        return Kzz, None, pointwise(var, X)
