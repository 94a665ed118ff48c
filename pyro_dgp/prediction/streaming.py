"""Predictions over data that need not fit in memory: the predictive mixture chunk by chunk,
and regression scores summed over the chunks."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ..datasets.stream import RowStream
from ..rng import step_seed
from ..validation import check_positive_int, model_dtype_device
from . import metrics
from .mixture import MixturePredictive
from .predictive import predict

__all__ = ["predict_chunks", "stream_report"]


def predict_chunks(model, guide, data, num_samples: int = 100, chunk_rows: int = 4096,
                   seed: int = 0) -> Iterator[tuple[MixturePredictive, torch.Tensor | None]]:
    """``(predictive, y)`` per chunk of ``chunk_rows`` rows of ``data``, in order.

    :param data: test inputs ``X (N, D)`` (``y`` is then ``None``), or a
        :class:`~pyro_dgp.datasets.stream.RowStream` (standardised with the training
        statistics: ``ArrayStream(X, y, standardization=train.standardization)``), whose
        predictives and targets come back in the original units of ``y``.
    :param seed: chunk ``c`` draws from ``(seed, c)``; the global random state is untouched.

    Memory holds one chunk's ``S x chunk_rows`` mixture at a time.
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    chunk_rows = check_positive_int(chunk_rows, "chunk_rows")
    if isinstance(data, torch.Tensor):
        for c, X in enumerate(data.split(chunk_rows, dim=-2)):
            yield predict(model, guide, X, num_samples, chunk_rows=chunk_rows,
                          seed=step_seed(seed, c, 0)), None
        return
    if not isinstance(data, RowStream):
        raise TypeError(f"data must be a tensor X or a RowStream, got {type(data).__name__}")
    dtype, device = model_dtype_device(model)
    units = data.standardization
    y_mean, y_std = (0.0, 1.0) if units is None else (units.y_mean, units.y_std)
    for c, (X_raw, y_raw) in enumerate(data.iterate(chunk_rows=chunk_rows)):
        X, _ = data.to_tensors(X_raw, y_raw, dtype, device)
        pred = predict(model, guide, X, num_samples, chunk_rows=chunk_rows, y_mean=y_mean,
                       y_std=y_std, seed=step_seed(seed, c, 0))
        yield pred, torch.as_tensor(y_raw, dtype=dtype, device=device).reshape(-1)


def stream_report(model, guide, data: RowStream, num_samples: int = 100,
                  chunk_rows: int = 4096, seed: int = 0) -> dict[str, float]:
    """:func:`~pyro_dgp.metrics.regression_report` over a stream's rows, chunk by chunk, in
    the original units: ``nll``, ``crps`` and ``coverage95`` are means over all rows (each
    chunk's mean weighted by its rows), ``rmse`` the root of the mean of all squared
    errors."""
    n, sums = 0, {"nll": 0.0, "rmse": 0.0, "crps": 0.0, "coverage95": 0.0}
    for pred, y in predict_chunks(model, guide, data, num_samples, chunk_rows, seed):
        m = y.shape[0]
        report = metrics.regression_report(pred, y)
        report["rmse"] **= 2  # summed as squared errors
        for key in sums:
            sums[key] += m * report[key]
        n += m
    means = {key: total / n for key, total in sums.items()}
    means["rmse"] = math.sqrt(means["rmse"])
    return means
