"""Scores of a predictive distribution against test targets: NLL, RMSE, CRPS, coverage, and
accuracy and AUC for binary labels.

Against a binary (classification) predictive every score takes labels coded 0/1 or -1/1,
floating-point, integer or boolean, and refuses any other value
(:meth:`MixturePredictive.check_targets`); :func:`regression_report` refuses such a
predictive outright: its RMSE, CRPS and coverage would score probabilities as if they were
predicted values (use :func:`nll`, :func:`accuracy`, :func:`auc` and :func:`crps`, the Brier
score)."""

from __future__ import annotations

import torch
from scipy.stats import rankdata

from ..validation import binary_labels
from .mixture import MixturePredictive

__all__ = ["nll", "rmse", "crps", "coverage", "accuracy", "auc", "regression_report"]


def _targets(pred: MixturePredictive, y: torch.Tensor) -> torch.Tensor:
    """``y`` checked against the predictive's ``(N,)`` points (see
    :meth:`MixturePredictive.check_targets`)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    return pred.check_targets(y)


def _labels(pred: MixturePredictive, y: torch.Tensor) -> torch.Tensor:
    """Boolean class-1 indicator of labels coded 0/1 or -1/1 (as the probit scores them)."""
    return binary_labels(_targets(pred, y))


def nll(pred: MixturePredictive, y: torch.Tensor) -> float:
    """Mean negative mixture log-density at ``y (N,)`` (test log-likelihood is ``-nll``)."""
    return float(-pred.log_prob(y).mean())  # it checks y's shape


def rmse(pred: MixturePredictive, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean."""
    return float(((pred.mean - _targets(pred, y)) ** 2).mean().sqrt())


def crps(pred: MixturePredictive, y: torch.Tensor) -> float:
    """Mean CRPS (:meth:`MixturePredictive.crps`): closed form for a Gaussian or binary
    likelihood, else an unbiased estimate from the predictive's seeded draws."""
    return float(pred.crps(y).mean())  # it checks y's shape


def coverage(pred: MixturePredictive, y: torch.Tensor, level: float = 0.95) -> float:
    """Fraction of ``y`` inside the central ``level`` predictive interval (its ends from
    :meth:`MixturePredictive.quantiles`: exact for a Gaussian or binary likelihood, else
    quantiles of the predictive's seeded draws)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    y = _targets(pred, y)
    lo, hi = pred.quantiles([(1 - level) / 2, (1 + level) / 2])
    return float(((y >= lo) & (y <= hi)).double().mean())


def accuracy(pred: MixturePredictive, y: torch.Tensor) -> float:
    """Binary accuracy of ``p(y = 1) > 0.5`` against labels coded 0/1 or -1/1."""
    return float(((pred.mean > 0.5) == _labels(pred, y)).double().mean())


def auc(pred: MixturePredictive, y: torch.Tensor) -> float:
    """Area under the ROC curve of ``p(y = 1)`` (Mann-Whitney, ties counted half); labels
    coded 0/1 or -1/1."""
    score = pred.mean.detach().cpu().numpy()
    labels = _labels(pred, y).cpu().numpy()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auc needs both classes among the labels")
    ranks = rankdata(score)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def regression_report(pred: MixturePredictive, y: torch.Tensor) -> dict[str, float]:
    """``{"nll", "rmse", "crps", "coverage95"}`` in the predictive's units, for ``y (N,)``.

    :raises ValueError: ``pred`` is a classifier's (a binary likelihood): score it with
        :func:`nll`, :func:`accuracy`, :func:`auc` and :func:`crps` (the Brier score).
    """
    if pred.likelihood.binary:
        raise ValueError(
            f"regression_report scores a regression predictive, but this one is binary "
            f"({type(pred.likelihood).__name__}): score a classifier with metrics.nll, "
            "metrics.accuracy, metrics.auc and metrics.crps (the Brier score)")
    return {
        "nll": nll(pred, y),
        "rmse": rmse(pred, y),
        "crps": crps(pred, y),
        "coverage95": coverage(pred, y, 0.95),
    }


