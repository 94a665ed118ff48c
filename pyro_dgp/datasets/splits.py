"""The :class:`Split` container shared by every loader, and its standardisation.

A split is standardised with statistics of its training part only, and predictions are
reported in the original units: the protocol of the UCI benchmarks in Salimbeni and
Deisenroth (2017), which standardise X and y on the training part and report test
log-likelihood and RMSE in original units.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Split", "make_split"]


@dataclass
class Split:
    """One train/test split, standardised with statistics of its training part.

    Attributes:
        X_train: ``(N, D)`` training inputs (standardised unless stated otherwise).
        y_train: ``(N,)`` training targets.
        X_test: ``(T, D)`` test inputs, standardised with the *training* statistics.
        y_test: ``(T,)`` test targets, standardised with the *training* statistics.
        X_mean: ``(D,)`` training mean of the raw inputs.
        X_std: ``(D,)`` training standard deviation of the raw inputs (0 replaced by 1).
        y_mean: training mean of the raw targets.
        y_std: training standard deviation of the raw targets (0 replaced by 1).
        name: data set name.
        split: split index (for synthetic and CSV sets: the seed).

    Raw values are recovered as ``X * X_std + X_mean`` and ``y * y_std + y_mean``; a
    Gaussian log-density of a standardised target converts to original units by adding
    ``-log(y_std)``.
    """

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    X_mean: torch.Tensor
    X_std: torch.Tensor
    y_mean: float
    y_std: float
    name: str
    split: int = 0

    _TENSOR_FIELDS = ("X_train", "y_train", "X_test", "y_test", "X_mean", "X_std")

    @property
    def num_train(self) -> int:
        """Number N of training points."""
        return int(self.X_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number T of test points."""
        return int(self.X_test.shape[0])

    @property
    def input_dim(self) -> int:
        """Input dimension D."""
        return int(self.X_train.shape[-1])

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Split:
        """A copy with every tensor moved to ``device`` and/or cast to ``dtype``."""
        moved = {f: getattr(self, f).to(device=device, dtype=dtype) for f in self._TENSOR_FIELDS}
        return dataclasses.replace(self, **moved)

    def unstandardize_y(self, y: torch.Tensor) -> torch.Tensor:
        """Map standardised targets ``(...,)`` back to original units, same shape."""
        return y * self.y_std + self.y_mean

    def unstandardize_X(self, X: torch.Tensor) -> torch.Tensor:
        """Map standardised inputs ``(..., D)`` back to original units, same shape."""
        return X * self.X_std.to(X) + self.X_mean.to(X)


def _train_stats(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Mean and (population, ddof=0) standard deviation of ``X (N, D)`` and ``y (N,)``.

    A constant column's standard deviation is replaced by 1. Constant means equal values, not
    a computed deviation of 0: the mean of 0.998 repeated is not exactly 0.998, so the
    computed deviation of such a column is about 2e-13, and dividing by it would send test
    values to about 1e12 wherever the test part differs.
    """
    X_mean = X.mean(axis=0)
    X_std = np.where(np.ptp(X, axis=0) > 0, X.std(axis=0), 1.0)
    y_mean = float(y.mean())
    y_std = float(y.std()) if np.ptp(y) > 0 else 1.0
    return X_mean, X_std, y_mean, y_std


def make_split(
    X_tr: np.ndarray,
    y_tr: np.ndarray,
    X_te: np.ndarray,
    y_te: np.ndarray,
    name: str,
    split: int,
    standardize: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
    labels: bool = False,
) -> Split:
    """Standardise float64 arrays with training statistics and wrap them in a :class:`Split`
    (``labels``: ``y`` holds class labels, left as they are)."""
    D = X_tr.shape[1]
    if standardize:
        X_mean, X_std, y_mean, y_std = _train_stats(X_tr, y_tr)
        X_tr = (X_tr - X_mean) / X_std
        X_te = (X_te - X_mean) / X_std
        if labels:
            y_mean, y_std = 0.0, 1.0
        else:
            y_tr = (y_tr - y_mean) / y_std
            y_te = (y_te - y_mean) / y_std
    else:
        X_mean, X_std, y_mean, y_std = np.zeros(D), np.ones(D), 0.0, 1.0

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    return Split(
        X_train=t(X_tr),
        y_train=t(y_tr),
        X_test=t(X_te),
        y_test=t(y_te),
        X_mean=t(X_mean),
        X_std=t(X_std),
        y_mean=y_mean,
        y_std=y_std,
        name=name,
        split=split,
    )
