"""pyro_dgp: deep Gaussian processes as Pyro models, with interchangeable guides.

>>> model = DeepGP.regression(X, y, num_layers=2)
>>> guide = guides.MeanField(model)
>>> fit(model, guide, X, y, num_steps=2000)
>>> pred = predict(model, guide, X_test, num_samples=100)
"""

from . import arviz, datasets, diagnostics, guides, importance, kernels, likelihoods, metrics
from .arviz import compare_guides, load_datatree, save_datatree, to_datatree, variational_pareto_k
from .diagnostics import layer_summary, plot_diagnostics
from .guides import complete, inducing_only
from .importance import importance_weights
from .layer import GPLayer
from .linalg import CholeskyError, NumericalWarning
from .model import DeepGP
from .prediction import MixturePredictive, predict
from .training import FitResult, TrainingDivergedError, fit

__version__ = "0.1.0"

__all__ = [
    "arviz",
    "compare_guides",
    "diagnostics",
    "layer_summary",
    "load_datatree",
    "plot_diagnostics",
    "save_datatree",
    "to_datatree",
    "variational_pareto_k",
    "CholeskyError",
    "DeepGP",
    "FitResult",
    "GPLayer",
    "MixturePredictive",
    "NumericalWarning",
    "TrainingDivergedError",
    "complete",
    "datasets",
    "fit",
    "guides",
    "importance",
    "importance_weights",
    "inducing_only",
    "kernels",
    "likelihoods",
    "metrics",
    "predict",
]
