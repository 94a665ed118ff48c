"""User CSV files: a header row of column names, split at random into train and test."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..validation import binary_labels
from .splits import Split, make_split

__all__ = ["load_csv"]


def load_csv(
    path: str | os.PathLike,
    target: str,
    features: Sequence[str] | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
    standardize: bool = True, labels: bool = False,
) -> Split:
    """Load a CSV file with a header row and split it at random into train and test.

    Args:
        path: the CSV file (comma-separated, first row = column names).
        target: name of the target column.
        features: names of the input columns (default: every column but ``target``). Only
            the used columns must be numeric.
        test_fraction: fraction of rows held out for testing, ``0 <= f < 1`` (rounded to a
            whole number of rows, at least one row stays in training).
        seed: seed of the random permutation (reported as ``Split.split``).
        dtype, device: of the returned tensors.
        standardize: standardise with the training part's statistics.
        labels: the target holds binary class labels, 0/1 (kept as they are, never
            standardised) or -1/1 (mapped to 0/1).

    Returns:
        A :class:`Split` with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (T, D)``,
        ``y_test (T,)``; ``N + T`` is the number of data rows.

    Raises:
        ValueError: unknown target or feature column (the available columns are listed),
            non-numeric, empty or NaN/infinite values (the column and row are named), no
            data rows, or a bad ``test_fraction``.
    """
    path = Path(path)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    header, body = _read_rows(path)
    features = _feature_columns(path, header, target, features)
    y = _numeric_column(path, header, body, target)
    if labels:
        y = binary_labels(torch.from_numpy(y), f"{path}, column {target!r}").numpy()
        y = y.astype(np.float64)
    X = np.stack([_numeric_column(path, header, body, f) for f in features], axis=1)
    train, test = _random_split(len(y), test_fraction, seed)
    return make_split(
        X[train], y[train], X[test], y[test], path.stem, seed, standardize, dtype, device,
        labels=labels,
    )


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The stripped header and the data rows of a CSV file, blank rows dropped."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path} is empty (a header row is required)")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise ValueError(f"{path} has a header but no data rows")
    return header, body


def _feature_columns(
    path: Path, header: list[str], target: str, features: Sequence[str] | None
) -> list[str]:
    """The input columns: ``features``, checked against the header, or every other column."""
    available = ", ".join(repr(h) for h in header)
    if target not in header:
        raise ValueError(f"target column {target!r} not in {path}; available columns: {available}")
    if features is None:
        features = [h for h in header if h != target]
    else:
        features = list(features)
        missing = [f for f in features if f not in header]
        if missing:
            raise ValueError(
                f"feature column(s) {missing} not in {path}; available columns: {available}"
            )
    if not features:
        raise ValueError(f"{path}: no feature columns besides the target {target!r}")
    return features


def _numeric_column(path: Path, header: list[str], body: list[list[str]], col: str) -> np.ndarray:
    """Column ``col`` as float64 ``(rows,)``; a missing, non-numeric or non-finite value is
    an error naming the column and the file line."""
    j = header.index(col)
    out = np.empty(len(body))
    for i, r in enumerate(body):
        line = i + 2  # 1-based file line, after the header
        if j >= len(r):
            raise ValueError(f"{path}: line {line} has no value for column {col!r}")
        cell = r[j].strip()
        try:
            v = float(cell)
        except ValueError:
            raise ValueError(
                f"{path}: non-numeric value {cell!r} in column {col!r} (line {line})"
            ) from None
        if not math.isfinite(v):
            raise ValueError(
                f"{path}: value {cell!r} (NaN/inf) in column {col!r} (line {line})"
            )
        out[i] = v
    return out


def _random_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(train, test)`` of a random permutation of ``n`` rows, at least one row
    kept for training."""
    n_test = min(int(round(test_fraction * n)), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return perm[n_test:], perm[:n_test]
