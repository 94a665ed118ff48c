"""The checks of :func:`~pyro_dgp.fit`'s arguments, each error naming its argument, and the
validation data it is given."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ..datasets.stream import RowStream, as_stream
from ..infer.minibatch import FULL_SIZE_PLATE, misscaled_observations
from ..infer.objectives import objective_and_particles
from ..likelihoods import Gaussian, StudentT
from ..rng import MAX_SEED
from ..validation import (
    as_tensor_input,
    check_inputs,
    check_positive_finite,
    check_positive_int,
    check_targets,
    labels_like,
    model_dtype_device,
)
from .batches import check_stream
from .monitor import VALIDATION_CHUNK_ROWS

__all__ = ["DISCRETE_TARGET_VALUES", "VALIDATIONS_PER_RUN", "check_arguments", "check_options",
           "check_progress", "check_validation_scale", "check_watchers", "validation_data",
           "warn_discrete_targets"]

#: at most this many distinct values (among more than twice as many points) make targets
#: discrete for :func:`warn_discrete_targets`
DISCRETE_TARGET_VALUES = 20

#: evaluations of the validation loss over a run, when ``validate_every`` is not given
VALIDATIONS_PER_RUN = 50


def check_options(objective, lr, lr_decay, num_particles, seed, optimizer,
                  final_elbo_particles, threads, guide=None) -> tuple:
    """Validate ``fit``'s settings, each error naming its argument, before anything is
    derived from them (the thread count from ``num_particles``); returns ``(objective,
    num_particles)``, an old objective name spelled anew, ``num_particles=None`` the
    objective's default for ``guide``
    (:func:`~pyro_dgp.infer.objectives.objective_and_particles`)."""
    objective, num_particles = objective_and_particles(objective, num_particles, guide=guide)
    check_positive_finite(lr, "lr")
    if lr_decay is not None:
        if isinstance(lr_decay, bool | str | bytes):
            raise TypeError(f"lr_decay must be a number in (0, 1], got {lr_decay!r} (of type "
                            f"{type(lr_decay).__name__})")
        if not 0 < float(lr_decay) <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
    check_positive_int(num_particles, "num_particles")
    if seed is not None:
        check_positive_int(seed, "seed", upper=MAX_SEED, allow_zero=True)
    check_positive_int(final_elbo_particles, "final_elbo_particles", allow_zero=True)
    if threads is not None:
        check_positive_int(threads, "threads")
    if isinstance(optimizer, str | bytes) or not callable(optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer class such as torch.optim.Adam (or a "
            f"callable (params, lr=...) -> optimizer), got {optimizer!r} (of type "
            f"{type(optimizer).__name__})")
    return objective, num_particles


def check_arguments(model, X, y, num_steps, batch_size, checkpoint_every, objective=None):
    """Validate ``fit``'s data and sizes (and warn where ``objective`` meets targets it does
    not suit, :func:`warn_discrete_targets`); returns ``(X, y, N, B)``, ``X`` a tensor or a stream
    (:func:`~pyro_dgp.datasets.stream.as_stream`), integer or boolean labels of a binary
    likelihood in ``X``'s dtype. Sets the model's ``num_data``. NumPy arrays in memory become
    tensors of their own dtype on the model's device (a memory map stays a stream)."""
    device = model_dtype_device(model)[1]
    if _in_memory_array(X):
        X = as_tensor_input(X, device)
    if isinstance(X, torch.Tensor) and _in_memory_array(y):
        y = as_tensor_input(y, device)
    if not isinstance(X, torch.Tensor):
        X = as_stream(X, y)
    if isinstance(X, RowStream):
        N = check_stream(model, X)
    else:
        check_inputs(X)
        N = X.shape[-2]
        if y is None:
            raise ValueError("y is required when X is a tensor (y may be omitted only for a "
                             "stream or dataset, which holds the targets)")
        if getattr(getattr(model, "likelihood", None), "binary", False):
            y = labels_like(y, X)
        check_targets(y, N)
    check_positive_int(num_steps, "num_steps")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    check_positive_int(checkpoint_every, "checkpoint_every")
    if batch_size is not None and batch_size > N:
        # stacklevel 4: check_arguments, fit, its error-unwrapping wrapper, the user's call
        warnings.warn(f"batch_size={batch_size} is more than the {N} training points: "
                      "training is full-batch (every step on all N points)", UserWarning,
                      stacklevel=4)
    B = N if batch_size is None else min(batch_size, N)
    if hasattr(model, "num_data"):
        model.num_data = N
    if isinstance(X, RowStream):  # its rows are converted to the model's dtype and device
        return X, y, N, B
    if y.dtype != X.dtype or y.device != X.device:
        raise ValueError(f"y is {y.dtype} on {y.device} but X is {X.dtype} on {X.device}: give "
                         "both in the model's dtype and device")
    warn_discrete_targets(objective, y, getattr(model, "likelihood", None))
    other = [(name, p) for name, p in model.named_parameters()
             if p.dtype != X.dtype or p.device != X.device]
    if other:
        listed = ", ".join(f"{name.removesuffix('_unconstrained')} ({p.dtype} on {p.device})"
                           for name, p in other[:4])
        raise ValueError(
            f"X is {X.dtype} on {X.device} but {len(other)} model parameter(s) are not: "
            f"{listed}; build the model from the same data or call model.to(...)"
        )
    return X, y, N, B


def _in_memory_array(a) -> bool:
    """A NumPy array held in memory (not a memory map, which a stream reads row by row)."""
    return isinstance(a, np.ndarray) and not isinstance(a, np.memmap)


def check_progress(progress) -> bool | int:
    """``progress`` as ``True``, ``False`` or a number of steps between lines."""
    if isinstance(progress, bool | np.bool_):
        return bool(progress)
    if not isinstance(progress, int | np.integer):
        raise TypeError(f"progress must be True, False or a number of steps between progress "
                        f"lines, got {progress!r} (of type {type(progress).__name__})")
    return check_positive_int(progress, "progress")


def check_watchers(model, X, validation, patience, validate_every, callbacks, callback_every,
                   progress, num_steps: int, distributed: bool):
    """Validate the validation data, callbacks and progress settings; returns
    ``(validation, patience, validate_every, callbacks, callback_every)`` with the
    validation data as tensors like ``X`` (or the model's parameters, for a stream)."""
    check_progress(progress)
    if callbacks is None:
        callbacks = []
    elif callable(callbacks):
        callbacks = [callbacks]
    if not isinstance(callbacks, Sequence) or not all(callable(c) for c in callbacks):
        raise TypeError(f"callbacks must be a list of functions StepInfo -> bool | None, got "
                        f"{callbacks!r}")
    callback_every = check_positive_int(callback_every, "callback_every")
    if validation is None:
        for name, value in (("patience", patience), ("validate_every", validate_every)):
            if value is not None:
                raise ValueError(f"{name} applies to early stopping on validation data: pass "
                                 "validation=(X_val, y_val) too")
    if distributed and (validation is not None or callbacks):
        raise ValueError("validation and callbacks are not available with distributed=True "
                         "(each process would decide alone when to stop)")
    if validation is None:
        return None, None, None, list(callbacks), callback_every
    if patience is not None:
        patience = check_positive_int(patience, "patience")
    validate_every = (max(num_steps // VALIDATIONS_PER_RUN, 1) if validate_every is None
                      else check_positive_int(validate_every, "validate_every"))
    if not callable(validation):
        validation = validation_data(model, X, validation)
    return validation, patience, validate_every, list(callbacks), callback_every


def validation_data(model, X, validation):
    """``(X_val (V, D), y_val (V,))`` checked, as tensors of the training data's dtype and
    device."""
    if not (isinstance(validation, tuple | list) and len(validation) == 2):
        raise TypeError(f"validation must be a pair (X_val, y_val) or a function (model, "
                        f"guide) -> loss, got {type(validation).__name__}")
    dtype, device = ((X.dtype, X.device) if isinstance(X, torch.Tensor)
                     else model_dtype_device(model))
    X_val, y_val = (as_tensor_input(a, device) for a in validation)
    check_inputs(X_val, getattr(model, "input_dim", None), label="validation X_val")
    if getattr(getattr(model, "likelihood", None), "binary", False):
        y_val = labels_like(y_val, X_val)
    check_targets(y_val, X_val.shape[-2], label="validation y_val")
    for name, t in (("X_val", X_val), ("y_val", y_val)):
        if t.dtype != dtype or t.device != device:
            raise ValueError(f"validation {name} is {t.dtype} on {t.device}, the training data "
                             f"{dtype} on {device}: give both alike")
    return X_val, y_val


def check_validation_scale(model, guide, X_val, y_val, num_data: int) -> None:
    """``validation=(X_val, y_val)`` scores its rows as a minibatch of the ``N`` training
    points, so the model must scale its observations ``N / B`` (as a minibatched fit needs)."""
    n = min(X_val.shape[-2], num_data, VALIDATION_CHUNK_ROWS)
    problems = misscaled_observations(model, guide, X_val[..., :n, :], y_val[:n], num_data)
    if problems:
        raise ValueError(
            f"validation=(X_val, y_val) scores {n} held-out rows as a minibatch of the "
            f"{num_data} training points, but {'; '.join(problems)}. To score it, "
            f"{FULL_SIZE_PLATE}, or pass validation=callable (model, guide) -> loss")


def warn_discrete_targets(objective, y, likelihood) -> None:
    """Warn where the local alpha objective with a continuous ``likelihood`` (Gaussian,
    Student-t; other models are left alone) meets targets ``y (N,)`` with at most
    :data:`DISCRETE_TARGET_VALUES` distinct values among ``N > 2 x`` that many points
    (ratings, counts, standardised or not). That objective is each point's log predictive
    density under the mixture of the draws; on such targets it can drive the Gaussian noise
    variance towards zero and put spikes of density on the values, so the fit's
    log-likelihood stops measuring it (``BENCHMARKS.md``, "Which objective should be the
    default?", wine_red)."""
    if (objective != "alpha" or not isinstance(y, torch.Tensor)
            or not isinstance(likelihood, Gaussian | StudentT)):
        return
    distinct = len(torch.unique(y.detach()))
    if distinct <= DISCRETE_TARGET_VALUES and len(y) > 2 * distinct:
        warnings.warn(
            f"y takes only {distinct} distinct values over {len(y)} points: the alpha objective "
            "can shrink the Gaussian noise towards zero and spike its predictive on those "
            "values, which makes its log-likelihood meaningless; prefer objective='auto' (the "
            "ELBO) or a likelihood for discrete targets", UserWarning,
            stacklevel=5)  # this, check_arguments, fit, its error-unwrapping wrapper, the user
