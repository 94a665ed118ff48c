"""Scores of a predictive distribution against test targets: NLL, RMSE, CRPS, coverage,
accuracy and AUC for binary labels, the Brier score and the expected calibration error for
class labels, and one report per kind of target: :func:`regression_report`,
:func:`classification_report`, :func:`count_report`.

Each takes a :class:`~pyro_dgp.prediction.MixturePredictive` or a
:class:`~pyro_dgp.prediction.DrawMixturePredictive` (both from :func:`~pyro_dgp.predict`).

Against a binary (classification) predictive every score takes labels coded 0/1 or -1/1,
floating-point, integer or boolean, and refuses any other value
(:meth:`MixturePredictive.check_targets`); :func:`regression_report` refuses such a
predictive outright: its RMSE, CRPS and coverage would score probabilities as if they were
predicted values (use :func:`classification_report`, or :func:`nll`, :func:`accuracy`,
:func:`auc` and :func:`crps`, the Brier score)."""

from __future__ import annotations

import torch
from scipy.stats import rankdata

from ..validation import binary_labels, check_positive_int
from .draw_mixture import DrawMixturePredictive
from .mixture import MixturePredictive

__all__ = ["nll", "rmse", "crps", "coverage", "accuracy", "auc", "brier",
           "expected_calibration_error", "regression_report", "classification_report",
           "count_report", "ECE_BINS"]

#: what every score takes: :func:`~pyro_dgp.predict`'s result
Predictive = MixturePredictive | DrawMixturePredictive

#: equal-width confidence bins of :func:`expected_calibration_error` (Guo et al. 2017's 15)
ECE_BINS = 15


def _targets(pred: Predictive, y: torch.Tensor) -> torch.Tensor:
    """``y`` checked against the predictive's ``(N,)`` points (see
    :meth:`MixturePredictive.check_targets`)."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    return pred.check_targets(y)


def _labels(pred: Predictive, y: torch.Tensor) -> torch.Tensor:
    """Boolean class-1 indicator of labels coded 0/1 or -1/1 (as the probit scores them)."""
    return binary_labels(_targets(pred, y))


def nll(pred: Predictive, y: torch.Tensor) -> float:
    """Mean negative mixture log-density at ``y (N,)`` (test log-likelihood is ``-nll``)."""
    return float(-pred.log_prob(y).mean())  # it checks y's shape


def rmse(pred: Predictive, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean."""
    return float(((pred.mean - _targets(pred, y)) ** 2).mean().sqrt())


def crps(pred: Predictive, y: torch.Tensor) -> float:
    """Mean CRPS (:meth:`MixturePredictive.crps`): closed form for a Gaussian or binary
    likelihood, else an unbiased estimate from the predictive's seeded draws."""
    return float(pred.crps(y).mean())  # it checks y's shape


def coverage(pred: Predictive, y: torch.Tensor, level: float = 0.95) -> float:
    """Fraction of ``y`` inside the central ``level`` predictive interval (its ends from
    :meth:`MixturePredictive.quantiles`: exact for a Gaussian or binary likelihood, else
    quantiles of the predictive's seeded draws)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    y = _targets(pred, y)
    lo, hi = pred.quantiles([(1 - level) / 2, (1 + level) / 2])
    return float(((y >= lo) & (y <= hi)).double().mean())


def accuracy(pred: Predictive, y: torch.Tensor) -> float:
    """Binary accuracy of ``p(y = 1) > 0.5`` against labels coded 0/1 or -1/1."""
    return float(((pred.mean > 0.5) == _labels(pred, y)).double().mean())


def auc(pred: Predictive, y: torch.Tensor) -> float:
    """Area under the ROC curve of ``p(y = 1)`` (Mann-Whitney, ties counted half); labels
    coded 0/1 or -1/1."""
    score = pred.mean.detach().cpu().numpy()
    labels = _labels(pred, y).cpu().numpy()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auc needs both classes among the labels")
    ranks = rankdata(score)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def regression_report(pred: Predictive, y: torch.Tensor) -> dict[str, float]:
    """``{"nll", "rmse", "crps", "coverage95"}`` in the predictive's units, for ``y (N,)``.

    :raises ValueError: ``pred`` is a classifier's (binary or categorical): score it with
        :func:`classification_report`.
    """
    if pred.binary or getattr(pred, "categorical", False):
        raise ValueError(
            f"regression_report scores a regression predictive, but this one is "
            f"{_class_kind(pred)}: score a classifier with metrics.classification_report, or "
            "metrics.nll, metrics.accuracy, metrics.auc and metrics.crps (the Brier score)")
    return {
        "nll": nll(pred, y),
        "rmse": rmse(pred, y),
        "crps": crps(pred, y),
        "coverage95": coverage(pred, y, 0.95),
    }




def _class_kind(pred: Predictive) -> str:
    """``"binary (<likelihood or distribution>)"`` or ``"categorical (...)"``."""
    source = (pred.likelihood if isinstance(pred, MixturePredictive) else pred.components[0])
    kind = "binary" if pred.binary else "categorical"
    return f"{kind} ({type(source).__name__})"


def _class_labels(pred: Predictive, y: torch.Tensor) -> torch.Tensor:
    """``(N,)`` integer class of each label: 0/1 of binary labels (coded 0/1 or -1/1), or the
    label itself (``0 ... C-1``) of a categorical predictive."""
    y = _targets(pred, y)
    return binary_labels(y).long() if pred.binary else y.long()


def _class_probabilities(pred: Predictive, where: str) -> torch.Tensor:
    """``(N, C)`` class probabilities of a binary or categorical predictive."""
    if not (pred.binary or getattr(pred, "categorical", False)):
        raise ValueError(f"{where} scores class labels, but this predictive is not of a "
                         "binary likelihood (e.g. BernoulliProbit) or Bernoulli or Categorical "
                         "observations: score it with metrics.regression_report or "
                         "metrics.count_report")
    return pred.class_probabilities()


def brier(pred: Predictive, y: torch.Tensor) -> float:
    """Mean Brier score (lower is better; Brier 1950). Binary: ``(p(y = 1) - 1{y = 1})^2``,
    the form of :func:`crps` and scikit-learn's ``brier_score_loss``, in ``[0, 1]``;
    categorical: ``sum_c (p_c - 1{y = c})^2``, Brier's multi-category score, in ``[0, 2]``
    (for two classes twice the binary form)."""
    probs = _class_probabilities(pred, "brier")
    labels = _class_labels(pred, y)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[-1]).to(probs.dtype)
    score = (probs - onehot).square().sum(-1)
    return float((score / 2 if pred.binary else score).mean())


def expected_calibration_error(pred: Predictive, y: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the predicted class (Naeini et al. 2015; Guo et al.
    2017): with the confidence ``c_i = max_k p_k(x_i)`` and ``bins`` equal-width bins
    ``B_b = ((b - 1)/bins, b/bins]`` (``b = 1, ..., bins``; a confidence of 0 falls in the
    first), ``ECE = sum_b |B_b| / N |acc(B_b) - conf(B_b)|``, ``acc`` the fraction of
    ``argmax_k p_k = y`` and ``conf`` the mean confidence of the bin. 0 for a calibrated
    predictive (in the limit of many points per bin), at most 1.

    :param bins: a positive int (default :data:`ECE_BINS`, 15).
    """
    bins = check_positive_int(bins, "expected_calibration_error: bins")
    probs = _class_probabilities(pred, "expected_calibration_error")
    labels = _class_labels(pred, y)
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).to(probs.dtype)
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)
    gap = torch.zeros(bins, dtype=probs.dtype, device=probs.device)
    gap.index_add_(0, index, correct - confidence)  # per bin: |B_b| (acc - conf)
    return float(gap.abs().sum() / labels.shape[0])


def classification_report(pred: Predictive, y: torch.Tensor,
                          bins: int = ECE_BINS) -> dict[str, float]:
    """``{"accuracy", "nll", "brier", "ece"}`` of a classifier's predictive at labels ``y
    (N,)``: the accuracy of the most probable class, the mean negative log-probability of
    the labels, :func:`brier` and :func:`expected_calibration_error` with ``bins`` bins.

    Labels: 0/1 or -1/1 for a binary predictive (a ``binary`` likelihood, Bernoulli
    observations), ``0 ... C-1`` for a categorical one (softmax observations).

    :raises ValueError: ``pred`` is not of class labels: use :func:`regression_report` or
        :func:`count_report`.
    """
    probs = _class_probabilities(pred, "classification_report")
    labels = _class_labels(pred, y)
    return {
        "accuracy": float((probs.argmax(-1) == labels).double().mean()),
        "nll": nll(pred, y),
        "brier": brier(pred, y),
        "ece": expected_calibration_error(pred, y, bins),
    }


def count_report(pred: Predictive, y: torch.Tensor) -> dict[str, float]:
    """``{"nll", "rmse", "coverage95"}`` of a predictive of counts at ``y (N,)`` (whole numbers
    >= 0): the mean negative log-probability, the RMSE of the predictive mean, and the
    fraction of ``y`` inside the central 95% interval. A discrete predictive's interval ends
    are values of its support (the 2.5% and 97.5% quantiles, :func:`coverage`) and the
    interval holds them, so it holds at least 95% of the predictive's mass: the coverage of
    a calibrated count predictive is 0.95 or more.

    :raises ValueError: ``y`` holds other than counts, or ``pred`` is of class labels.
    """
    if pred.binary or getattr(pred, "categorical", False):
        raise ValueError(f"count_report scores counts, but this predictive is "
                         f"{_class_kind(pred)}: score it with metrics.classification_report")
    counts = _targets(pred, y)
    if not bool(((counts >= 0) & (counts == counts.round())).all()):
        bad = counts[(counts < 0) | (counts != counts.round())]
        raise ValueError(f"count_report: y must hold counts (whole numbers >= 0), got "
                         f"{bad[:5].tolist()}")
    return {"nll": nll(pred, y), "rmse": rmse(pred, y), "coverage95": coverage(pred, y, 0.95)}
