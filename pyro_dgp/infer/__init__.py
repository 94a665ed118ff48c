"""Objectives: the analytic-KL ELBO, importance weights, the local alpha-divergence, the
amortized ELBO, natural-gradient steps, the minibatch-scale check.

The training engine (``fit``, ``FitResult``, ``save_fit``/``load_fit``, ...) is in
:mod:`pyro_dgp.train`, a layer above this one. Its names are still reachable here, with a
``DeprecationWarning`` naming their new place.
"""

import importlib

from ..deprecation import warn_renamed
from .alpha import LocalAlpha
from .amortized import AmortizedELBO
from .elbo import AnalyticKL_ELBO, ReparamTrace_ELBO
from .importance import RenyiELBO, importance_weights
from .mixture import SIWAE, StratifiedELBO
from .objectives import ELBOEstimate, evaluate_elbo, make_objective

__all__ = [
    "AmortizedELBO",
    "AnalyticKL_ELBO",
    "ELBOEstimate",
    "LocalAlpha",
    "RenyiELBO",
    "ReparamTrace_ELBO",
    "SIWAE",
    "StratifiedELBO",
    "evaluate_elbo",
    "importance_weights",
    "make_objective",
]

#: names of the training engine that ``pyro_dgp.infer`` exported before it moved to
#: ``pyro_dgp.train``: each is looked up there on first use, with a warning
_MOVED_TO_TRAIN = frozenset({"FitResult", "StepInfo", "TrainingDivergedError",
                             "TrainingInstabilityWarning", "fit", "load_fit", "save_fit"})


def __getattr__(name: str):
    """``pyro_dgp.infer.fit`` and the other engine names, from :mod:`pyro_dgp.train`
    (imported here on demand: ``train`` is the layer above, so no import at load time)."""
    if name not in _MOVED_TO_TRAIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_renamed(f"pyro_dgp.infer.{name}", f"pyro_dgp.train.{name} (or pyro_dgp.{name})")
    return getattr(importlib.import_module("pyro_dgp.train"), name)
