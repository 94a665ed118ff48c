"""Objectives and training: the analytic-KL ELBO, importance weights, ``fit``, checkpoints."""

from .checkpoint import load_fit, save_fit
from .elbo import AnalyticKL_ELBO
from .importance import RenyiELBO, importance_weights
from .mixture import SIWAE, StratifiedELBO
from .objectives import ELBOEstimate, evaluate_elbo, make_objective
from .training import FitResult, StepInfo, TrainingDivergedError, TrainingInstabilityWarning, fit

__all__ = [
    "AnalyticKL_ELBO",
    "ELBOEstimate",
    "FitResult",
    "RenyiELBO",
    "SIWAE",
    "StepInfo",
    "StratifiedELBO",
    "TrainingDivergedError",
    "TrainingInstabilityWarning",
    "evaluate_elbo",
    "fit",
    "importance_weights",
    "load_fit",
    "make_objective",
    "save_fit",
]
