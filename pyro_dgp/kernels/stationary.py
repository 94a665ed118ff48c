"""Stationary kernels ``variance * g(r)``: squared exponential and the Matern family."""

from __future__ import annotations

import math

import torch

from .base import Stationary

__all__ = ["RBF", "Matern12", "Matern32", "Matern52"]


class RBF(Stationary):
    """Squared exponential: ``variance * exp(-r^2 / 2)``."""

    def profile(self, r2):
        return torch.exp(-0.5 * r2)

    def _cross_covariance(self, Zs, Xs, var):
        # a scalar variance, or one per output (outputs=P: var (P, 1), Zs (P, M, D))
        per_output = self.outputs is not None and var.shape == (self.outputs, 1)
        if (var.dim() and not per_output) or self.exact_distance:
            return super()._cross_covariance(Zs, Xs, var)
        log_var = var.log().unsqueeze(-1) if per_output else var.log()
        # var exp(-|z - x|^2 / 2) = exp(z~ . x~) with z~ = [z, log var - |z|^2 / 2, 1] and
        # x~ = [x, 1, -|x|^2 / 2]: one thin GEMM and one exp over the (M, N) matrix, and in
        # the backward pass one product and two thin GEMMs, instead of about ten elementwise
        # passes (scale, exp, clamp, adds) each way. Same rounding as |z|^2 + |x|^2 - 2 z.x,
        # which enters exp(-r^2 / 2) at second order only.
        ones_z = Zs.new_ones(Zs.shape[:-1] + (1,))
        ones_x = Xs.new_ones(Xs.shape[:-1] + (1,))
        z_aug = torch.cat([Zs, log_var - 0.5 * Zs.square().sum(-1, keepdim=True), ones_z], -1)
        x_aug = torch.cat([Xs, ones_x, -0.5 * Xs.square().sum(-1, keepdim=True)], -1)
        # in place: the product is not needed by the GEMM's backward, and exp's backward reads
        # its result; one fewer (M, N) allocation
        return (z_aug @ x_aug.mT).exp_()


def _dist(r2: torch.Tensor) -> torch.Tensor:
    # sqrt has an infinite derivative at 0; the tiny floor keeps gradients finite on the diagonal.
    return torch.sqrt(r2 + torch.finfo(r2.dtype).tiny ** 0.5)


class Matern12(Stationary):
    """Exponential kernel: ``variance * exp(-r)``."""

    exact_distance = True

    def profile(self, r2):
        return torch.exp(-_dist(r2))


class Matern32(Stationary):
    """``variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``."""

    def profile(self, r2):
        s = math.sqrt(3.0) * _dist(r2)
        return (1 + s) * torch.exp(-s)


class Matern52(Stationary):
    """``variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``."""

    def profile(self, r2):
        s = math.sqrt(5.0) * _dist(r2)
        return (1 + s + s * s / 3) * torch.exp(-s)
