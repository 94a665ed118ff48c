"""Input checks that fail early with a message naming the problem."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

__all__ = [
    "FLOAT_DTYPES",
    "as_tensor_input",
    "binary_labels",
    "check_bool",
    "check_dtype",
    "check_inputs",
    "check_targets",
    "check_positive_finite",
    "pyro_name",
    "rename_pyro_module",
    "check_positive_int",
    "labels_like",
    "model_dtype_device",
    "positive_tensor",
    "unique_name",
]

#: dtypes a deep GP computes in: its Cholesky factorisations need at least single precision
#: (torch has none for float16 or bfloat16, whose 3 significant digits would make any kernel
#: matrix of close inputs numerically singular anyway)
FLOAT_DTYPES = (torch.float32, torch.float64)

_counters: dict[str, itertools.count] = {}


def unique_name(base: str) -> str:
    """``base`` the first time, then ``base_1``, ``base_2``...

    PyroModule parameters live in Pyro's global param store under their module's name, so two
    models, guides, or top-level layers, kernels or likelihoods with the same name would
    silently share parameters there. (A module assigned to a parent PyroModule is renamed
    after its attribute path, e.g. ``<model>.layers.0.kernel``.)
    """
    n = next(_counters.setdefault(base, itertools.count()))
    return base if n == 0 else f"{base}_{n}"


def pyro_name(module) -> str:
    """The prefix of ``module``'s parameters in Pyro's store (a ``PyroModule``'s name, its
    attribute path once assigned to a parent), ``""`` for any other object. Pyro keeps it in
    the private ``_pyro_name`` and offers no public accessor: this is the one place that
    reads it."""
    return getattr(module, "_pyro_name", "") or ""


def rename_pyro_module(module, name: str) -> None:
    """Give the ``PyroModule`` ``module`` the parameter prefix ``name`` (its own, not its
    children's: rename each module of a tree). Pyro sets the prefix only at construction and
    when a module is assigned to a parent, with no public way to give a copy its own: this is
    the one place that writes it, beside :func:`pyro_name`."""
    module._pyro_name = name


def check_dtype(t: torch.Tensor, label: str) -> None:
    """``t`` must be float32 or float64 (:data:`FLOAT_DTYPES`), else a ``TypeError`` naming
    ``label`` and its dtype."""
    if not torch.is_floating_point(t):
        raise TypeError(f"{label} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{label} has dtype {t.dtype}, but a deep GP needs float32 or float64 (its Cholesky "
            "factorisations are not available in lower precision): convert it with .float() "
            "or .double()")


def check_finite(t: torch.Tensor, label: str) -> None:
    """``t`` float32 or float64 (:func:`check_dtype`) without NaN or inf."""
    check_dtype(t, label)
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        n = int(bad.sum())
        raise ValueError(f"{label} contains {n} NaN or inf value(s)")


def as_tensor_input(a, device=None):
    """A NumPy array as a tensor of its own dtype (float64 stays float64) on ``device``;
    anything else unchanged (for the checks that follow to name)."""
    if isinstance(a, np.ndarray):
        return torch.as_tensor(a, device=device)
    return a


def check_inputs(X, input_dim: int | None = None, label: str = "X", finite: bool = True) -> None:
    """``X`` must be a float32 or float64 tensor of shape ``(..., N, D)`` with ``N >= 1``, and
    finite unless ``finite=False`` (the finiteness check is a pass over ``X`` and a host
    sync)."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{label} must be a torch.Tensor, got {type(X).__name__}: convert "
                        f"it with torch.as_tensor({label.split()[-1]}) (float64 stays float64)")
    if X.dim() < 2:
        raise ValueError(
            f"{label} must have shape (N, D) (one row per data point), got shape "
            f"{tuple(X.shape)}; use X.unsqueeze(-1) for a single input dimension"
        )
    if X.shape[-2] == 0:
        raise ValueError(f"{label} has no rows (shape {tuple(X.shape)}): at least one data "
                         "point is needed")
    if input_dim is not None and X.shape[-1] != input_dim:
        raise ValueError(f"{label} has {X.shape[-1]} columns, expected {input_dim}")
    if finite:
        check_finite(X, label)
    else:
        check_dtype(X, label)


def check_targets(y, num_data: int, label: str = "y", binary: bool = False) -> None:
    """``y`` must be finite, with ``num_data`` rows; ``binary``: values in {0, 1}."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{label} must be a torch.Tensor, got {type(y).__name__}: convert "
                        f"it with torch.as_tensor({label.split()[-1]}) (float64 stays float64)")
    if y.dim() == 0 or y.shape[0] != num_data:
        raise ValueError(
            f"{label} has {y.shape[0] if y.dim() else 0} rows but X has {num_data}: "
            "X and y must have the same number of data points"
        )
    check_finite(y, label)
    if binary and not bool(((y == 0) | (y == 1)).all()):
        bad = torch.unique(y[(y != 0) & (y != 1)])[:5].tolist()
        raise ValueError(f"{label}: binary labels must be 0 or 1, found {bad}")


def check_positive_int(value, label: str, upper: int | None = None,
                       allow_zero: bool = False) -> int:
    """An integer ``>= 1`` (``>= 0`` with ``allow_zero``; and ``<= upper``), returned as
    ``int``.

    :raises TypeError: ``value`` is not a number (``None``, a string, a bool, ...); the
        message names ``label`` and the value.
    :raises ValueError: a number but not a whole number ``>= 1`` (``0``, ``-1``, ``2.5``,
        ``nan``, ``inf``), or above ``upper``; the message names ``label``.
    """
    kind = "non-negative" if allow_zero else "positive"
    message = f"{label} must be a {kind} integer, got {value!r}"
    if value is None or isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{message} (of type {type(value).__name__})")
    try:
        as_int = int(value)
        whole = bool(as_int == value)
    except TypeError:
        raise TypeError(f"{message} (of type {type(value).__name__})") from None
    except (ValueError, OverflowError, RuntimeError):  # nan, inf, tensors of several values
        raise ValueError(message) from None
    if not whole or as_int < (0 if allow_zero else 1):
        raise ValueError(message)
    if upper is not None and as_int > upper:
        raise ValueError(f"{label} must be at most {upper}, got {value!r}")
    return as_int


def _not_a_number(value, label: str) -> TypeError:
    return TypeError(f"{label} must be a positive finite number, got {value!r} "
                     f"(of type {type(value).__name__})")


def check_positive_finite(value, label: str) -> float:
    """A finite number ``> 0`` (a Python or NumPy number, or a one-element tensor), returned as
    ``float``.

    :raises TypeError: ``value`` is not a number (``None``, a string, a bool, ...).
    :raises ValueError: a tensor of several values, or ``<= 0``, ``nan`` or ``inf``; the message
        reads ``"<label> must be positive and finite, got <value>"``.
    """
    if value is None or isinstance(value, (bool, str, bytes)):
        raise _not_a_number(value, label)
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(f"{label} must be a scalar, got shape {tuple(value.shape)}")
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise _not_a_number(value, label) from None
    if not (math.isfinite(as_float) and as_float > 0):
        raise ValueError(f"{label} must be positive and finite, got {as_float}")
    return as_float


def positive_tensor(value, label: str, scalar: bool = False) -> torch.Tensor:
    """A hyperparameter's initial value as a tensor, checked positive and finite.

    A floating-point tensor keeps its dtype and device (a detached copy); a number, a sequence
    of numbers or an integer tensor becomes a tensor of torch's default dtype.

    :param scalar: ``value`` must hold one number; it is returned with shape ``()``.
    :raises TypeError: ``value`` is not numeric.
    :raises ValueError: not a scalar where ``scalar``, or an entry ``<= 0``, ``nan`` or ``inf``.
    """
    if isinstance(value, torch.Tensor) and torch.is_floating_point(value):
        t = value.detach().clone()
    else:
        if value is None or isinstance(value, (bool, str, bytes)):
            raise _not_a_number(value, label)
        try:
            t = torch.as_tensor(value, dtype=torch.get_default_dtype())
        except (TypeError, ValueError, RuntimeError):
            raise _not_a_number(value, label) from None
    if scalar:
        if t.numel() != 1 or t.dim() > 1:
            raise ValueError(f"{label} must be a scalar, got shape {tuple(t.shape)}")
        t = t.reshape(())
    bad = ~(torch.isfinite(t) & (t > 0))
    if bool(bad.any()):
        shown = t.item() if t.numel() == 1 else t.tolist()
        raise ValueError(f"{label} must be positive and finite, got {shown}")
    return t


def binary_labels(y: torch.Tensor, label: str = "y") -> torch.Tensor:
    """Boolean class-1 indicator of labels coded 0/1 or -1/1, else ``ValueError`` naming
    ``label`` and the values found."""
    values = set(torch.unique(y).tolist())
    if not (values <= {0.0, 1.0} or values <= {-1.0, 1.0}):
        raise ValueError(f"{label}: binary labels must be 0/1 or -1/1, got the values "
                         f"{sorted(values)[:10]}")
    return y > 0.5


def labels_like(y, like: torch.Tensor):
    """Integer or boolean class labels ``y`` as a tensor of ``like``'s dtype and device (the
    values are kept: a 0/1 check follows); anything else is returned unchanged."""
    if isinstance(y, torch.Tensor) and (y.dtype == torch.bool or not (
            y.is_floating_point() or y.is_complex())):
        return y.to(dtype=like.dtype, device=like.device)
    return y


def check_bool(value, label: str) -> bool:
    """A boolean option (``bool`` or NumPy's ``bool_``) as ``bool``.

    :raises TypeError: anything else (``"no"``, ``0``, ``None``...), naming ``label``: a
        string or number would otherwise be read by its truth value.
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"{label} must be True or False, got {value!r} (of type "
                    f"{type(value).__name__})")


def model_dtype_device(model) -> tuple[torch.dtype, torch.device]:
    """The dtype and device of a model's parameters (a stream's rows are converted to
    them); the default dtype on the CPU for a model without parameters."""
    p = next(iter(model.parameters()), None)
    if p is None:
        return torch.get_default_dtype(), torch.device("cpu")
    return p.dtype, p.device
