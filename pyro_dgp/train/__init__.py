"""The training engine: ``fit`` (its arguments, loop, batches, optimiser, monitors,
checkpoints, CUDA graphs and data-parallel steps), restarts from several seeds and saved
fits.

The objectives it optimises are in :mod:`pyro_dgp.infer`; this package sits above them.
"""

from .restarts import independent_copy
from .result import Restart, Restarts
from .saved import load_fit, register_model, save_fit
from .training import FitResult, StepInfo, TrainingDivergedError, TrainingInstabilityWarning, fit

__all__ = [
    "FitResult",
    "Restart",
    "Restarts",
    "StepInfo",
    "TrainingDivergedError",
    "TrainingInstabilityWarning",
    "fit",
    "independent_copy",
    "load_fit",
    "register_model",
    "save_fit",
]
