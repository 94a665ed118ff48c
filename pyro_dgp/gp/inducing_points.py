"""The initial inducing inputs of a GP layer, checked."""

from __future__ import annotations

import torch

from ..validation import check_positive_int

__all__ = ["initial_inducing_points"]


def initial_inducing_points(num_inducing, inducing_points, input_dim: int) -> torch.Tensor:
    """``(M, D_in)`` checked initial inducing inputs (standard normal draws where only ``M``
    is given); floating point, keeping a tensor's dtype and device."""
    if num_inducing is not None:
        num_inducing = check_positive_int(num_inducing, "GPLayer: num_inducing")
    if inducing_points is None:
        if num_inducing is None:
            raise ValueError(
                "GPLayer: num_inducing or inducing_points must be given, got neither"
            )
        inducing_points = torch.randn(num_inducing, input_dim)
    inducing_points = torch.as_tensor(inducing_points)
    if not torch.is_floating_point(inducing_points):
        inducing_points = inducing_points.to(torch.get_default_dtype())
    if inducing_points.dim() != 2 or inducing_points.shape[-1] != input_dim:
        raise ValueError(
            f"GPLayer: inducing_points must have shape (M, {input_dim}), "
            f"got {tuple(inducing_points.shape)}"
        )
    if inducing_points.shape[0] == 0:
        raise ValueError("GPLayer: inducing_points must have at least one row (M >= 1), "
                         f"got shape {tuple(inducing_points.shape)}")
    if num_inducing is not None and num_inducing != inducing_points.shape[0]:
        raise ValueError(
            f"GPLayer: num_inducing={num_inducing} but inducing_points has "
            f"{inducing_points.shape[0]} rows; give one of them"
        )
    if not torch.isfinite(inducing_points).all():
        raise ValueError("GPLayer: inducing_points contain NaN or inf")
    return inducing_points
