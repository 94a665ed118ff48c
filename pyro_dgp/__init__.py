"""pyro_dgp: deep Gaussian processes as Pyro models, with interchangeable guides.

>>> model = DeepGP.regression(X, y, num_layers=2)
>>> guide = guides.MeanField(model)
>>> fit(model, guide, X, y, num_steps=2000)
>>> pred = predict(model, guide, X_test, num_samples=100)
"""

from . import datasets, diagnostics, guides, kernels, likelihoods
from .deprecation import PyroDGPDeprecationWarning, warn_renamed
from .diagnostics import (
    GuideComparisonWarning,
    compare_guides,
    layer_summary,
    load_datatree,
    plot_diagnostics,
    save_datatree,
    stack,
    to_datatree,
    variational_pareto_k,
)
from .gp import AmortizedGPLayer, DeepGP, GPLayer
from .guides import complete, inducing_only
from .infer import evaluate_elbo, importance, importance_weights
from .infer.amortized import AmortizedELBO
from .linalg import CholeskyError, NumericalWarning
from .prediction import DrawMixturePredictive, MixturePredictive, metrics, predict
from .train import FitResult, StepInfo, TrainingDivergedError, TrainingInstabilityWarning, fit

__version__ = "0.1.0"

__all__ = [
    "AmortizedELBO",
    "AmortizedGPLayer",
    "GuideComparisonWarning",
    "compare_guides",
    "diagnostics",
    "evaluate_elbo",
    "layer_summary",
    "load_datatree",
    "plot_diagnostics",
    "save_datatree",
    "stack",
    "to_datatree",
    "variational_pareto_k",
    "CholeskyError",
    "DeepGP",
    "DrawMixturePredictive",
    "FitResult",
    "GPLayer",
    "MixturePredictive",
    "NumericalWarning",
    "PyroDGPDeprecationWarning",
    "StepInfo",
    "TrainingDivergedError",
    "TrainingInstabilityWarning",
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


def __getattr__(name: str):
    # ``pyro_dgp.elbo``, the old name of :func:`evaluate_elbo` (an ELBO's value, not one of the
    # ELBO classes of ``pyro_dgp.infer``)
    if name == "elbo":
        warn_renamed("pyro_dgp.elbo", "pyro_dgp.evaluate_elbo")
        return evaluate_elbo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
