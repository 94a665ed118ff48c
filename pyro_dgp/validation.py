"""Input checks that fail early with a message naming the problem."""

from __future__ import annotations

import torch

__all__ = ["binary_labels", "check_inputs", "check_targets", "check_positive_int"]


def _finite(t: torch.Tensor, label: str) -> None:
    if not torch.is_floating_point(t):
        raise TypeError(f"{label} must be a floating-point tensor, got dtype {t.dtype}")
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        n = int(bad.sum())
        raise ValueError(f"{label} contains {n} NaN or inf value(s)")


def check_inputs(X, input_dim: int | None = None, label: str = "X", finite: bool = True) -> None:
    """``X`` must be a float tensor of shape ``(..., N, D)``, and finite unless
    ``finite=False`` (the finiteness check is a pass over ``X`` and a host sync)."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{label} must be a torch.Tensor, got {type(X).__name__}")
    if X.dim() < 2:
        raise ValueError(
            f"{label} must have shape (N, D) (one row per data point), got shape "
            f"{tuple(X.shape)}; use X.unsqueeze(-1) for a single input dimension"
        )
    if input_dim is not None and X.shape[-1] != input_dim:
        raise ValueError(f"{label} has {X.shape[-1]} columns, expected {input_dim}")
    if finite:
        _finite(X, label)
    elif not torch.is_floating_point(X):
        raise TypeError(f"{label} must be a floating-point tensor, got dtype {X.dtype}")


def check_targets(y, num_data: int, label: str = "y", binary: bool = False) -> None:
    """``y`` must be finite, with ``num_data`` rows; ``binary``: values in {0, 1}."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{label} must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() == 0 or y.shape[0] != num_data:
        raise ValueError(
            f"{label} has {y.shape[0] if y.dim() else 0} rows but X has {num_data}: "
            "X and y must have the same number of data points"
        )
    _finite(y, label)
    if binary and not bool(((y == 0) | (y == 1)).all()):
        bad = torch.unique(y[(y != 0) & (y != 1)])[:5].tolist()
        raise ValueError(f"{label}: binary labels must be 0 or 1, found {bad}")


def check_positive_int(value, label: str, upper: int | None = None) -> int:
    """An integer ``>= 1`` (and ``<= upper``), returned as ``int``.

    :raises TypeError: ``value`` is not a number (``None``, a string, a bool, ...); the
        message names ``label`` and the value.
    :raises ValueError: a number but not a whole number ``>= 1`` (``0``, ``-1``, ``2.5``,
        ``nan``, ``inf``), or above ``upper``; the message names ``label``.
    """
    message = f"{label} must be a positive integer, got {value!r}"
    if value is None or isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{message} (of type {type(value).__name__})")
    try:
        as_int = int(value)
        whole = bool(as_int == value)
    except TypeError:
        raise TypeError(f"{message} (of type {type(value).__name__})") from None
    except (ValueError, OverflowError, RuntimeError):  # nan, inf, tensors of several values
        raise ValueError(message) from None
    if not whole or as_int <= 0:
        raise ValueError(message)
    if upper is not None and as_int > upper:
        raise ValueError(f"{label} must be at most {upper}, got {value!r}")
    return as_int


def binary_labels(y: torch.Tensor, label: str = "y") -> torch.Tensor:
    """Boolean class-1 indicator of labels coded 0/1 or -1/1, else ``ValueError`` naming
    ``label`` and the values found."""
    values = set(torch.unique(y).tolist())
    if not (values <= {0.0, 1.0} or values <= {-1.0, 1.0}):
        raise ValueError(f"{label}: binary labels must be 0/1 or -1/1, got the values "
                         f"{sorted(values)[:10]}")
    return y > 0.5
