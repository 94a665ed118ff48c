"""Objectives and training: the analytic-KL ELBO, importance weights, ``fit``, checkpoints."""

from .checkpoint import load_fit, save_fit
from .elbo import AnalyticKL_ELBO
from .importance import RenyiELBO, importance_weights
from .training import FitResult, TrainingDivergedError, fit

__all__ = [
    "AnalyticKL_ELBO",
    "FitResult",
    "RenyiELBO",
    "TrainingDivergedError",
    "fit",
    "importance_weights",
    "load_fit",
    "save_fit",
]
