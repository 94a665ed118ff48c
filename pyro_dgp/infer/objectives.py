"""Objectives by name, their validity for a guide, and the ELBO of a fitted model."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from pyro.infer import ELBO, RenyiELBO, TraceMeanField_ELBO

from ..errors import user_errors_first
from ..guides.protocol import protocol_of
from ..rng import seeded
from ..validation import check_inputs, check_positive_int, check_targets
from .alpha import LocalAlpha
from .amortized import AmortizedELBO
from .elbo import AnalyticKL_ELBO, ReparamTrace_ELBO
from .importance import RenyiELBO as ImportanceRenyiELBO
from .importance import check_importance_weights

__all__ = ["ELBOEstimate", "evaluate_elbo", "make_objective"]


_OBJECTIVES = {
    # Trace_ELBO's estimator without its read-backs to the host (a CUDA graph can hold it)
    "elbo": lambda p, v: ReparamTrace_ELBO(num_particles=p, vectorize_particles=v,
                                           max_plate_nesting=1),
    "meanfield": lambda p, v: AnalyticKL_ELBO(
        num_particles=p, vectorize_particles=v, max_plate_nesting=1
    ),
    "renyi": lambda p, v: ImportanceRenyiELBO(alpha=0.5, num_particles=max(p, 2),
                                              vectorize_particles=v, max_plate_nesting=1),
}


def make_objective(objective, guide, num_particles: int = 1, alpha: float = 0.5,
                   num_samples: int = 10) -> ELBO:
    """An objective from a name (``"auto"``, ``"elbo"``, ``"meanfield"``, ``"renyi"``,
    ``"alpha"``: :class:`~pyro_dgp.infer.alpha.LocalAlpha` with ``alpha`` and ``num_samples``
    draws per point, not an ELBO) or
    an instance (returned as is, except that Pyro's ``RenyiELBO`` becomes
    :class:`~pyro_dgp.infer.importance.RenyiELBO` with the same settings: exact per-draw weights).
    ``"auto"`` is the guide's ``default_objective`` (the guide protocol):
    :class:`~pyro_dgp.infer.amortized.AmortizedELBO` for an :class:`~pyro_dgp.guides.Amortized`
    guide (its rule's objective, with the paths' weights), ``"meanfield"`` for other guides
    that factorise like the prior, else ``"elbo"`` (Trace_ELBO). ``"meanfield"`` is
    :class:`~pyro_dgp.infer.elbo.AnalyticKL_ELBO`:
    TraceMeanField_ELBO's estimator (analytic KL), without the log-densities it discards.
    ``"renyi"`` is :class:`~pyro_dgp.infer.importance.RenyiELBO` (alpha 0.5).

    Each name is a shorthand for an instance, the same one the name builds: with ``P =
    num_particles``, ``"elbo"`` is ``ReparamTrace_ELBO(num_particles=P,
    vectorize_particles=P > 1, max_plate_nesting=1)``, ``"meanfield"`` the same settings of
    ``AnalyticKL_ELBO``, ``"renyi"`` ``RenyiELBO(alpha=0.5, num_particles=max(P, 2), ...)``
    and ``"alpha"`` ``LocalAlpha(alpha, num_samples)``; ``fit`` trains the same with either."""
    if isinstance(objective, ELBO):
        if isinstance(objective, TraceMeanField_ELBO):
            _warn_mean_field(guide)
        if isinstance(objective, RenyiELBO):
            check_importance_weights(guide)
            if not isinstance(objective, ImportanceRenyiELBO):
                # the same settings, evaluated with exact per-draw weights (infer/importance.py)
                objective = ImportanceRenyiELBO(
                    alpha=objective.alpha, num_particles=objective.num_particles,
                    max_plate_nesting=objective.max_plate_nesting,
                    vectorize_particles=objective.vectorize_particles)
        return objective
    num_particles = check_positive_int(num_particles, "num_particles")
    if objective == "alpha":
        return LocalAlpha(alpha, num_samples)
    if objective == "auto":
        objective = protocol_of(guide).default_objective
        if objective == "amortized":
            return AmortizedELBO()
    if objective not in _OBJECTIVES:
        raise ValueError(
            f"objective must be a pyro ELBO or one of {['auto', 'alpha', *_OBJECTIVES]}, got "
            f"{objective!r}"
        )
    if objective == "meanfield":
        _warn_mean_field(guide)
    if objective == "renyi":
        check_importance_weights(guide)
    return _OBJECTIVES[objective](num_particles, num_particles > 1)


def _warn_mean_field(guide) -> None:
    if not protocol_of(guide).mean_field:
        warnings.warn(
            f"TraceMeanField_ELBO assumes a guide that factorises like the model; "
            f"{type(guide).__name__} does not declare that (its analytic KL terms may be "
            "wrong); use Trace_ELBO",
            UserWarning,
            stacklevel=3,
        )


@dataclass(frozen=True)
class ELBOEstimate:
    """A Monte Carlo estimate of the ELBO: ``value`` the mean over ``num_particles``
    independent draws, ``stderr`` its standard error (``nan`` for one draw)."""

    value: float
    stderr: float
    num_particles: int

    def __float__(self) -> float:
        return self.value

    @classmethod
    def from_values(cls, values: list[float]) -> ELBOEstimate:
        """The mean of independent draws ``values`` and its standard error."""
        n = len(values)
        mean = math.fsum(values) / n
        if n == 1:
            return cls(mean, math.nan, 1)
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        return cls(mean, math.sqrt(var / n), n)


@user_errors_first
def evaluate_elbo(model, guide, X: torch.Tensor, y: torch.Tensor, num_particles: int = 16,
                  objective="auto", seed: int | None = 0) -> ELBOEstimate:
    """The ELBO of ``guide`` on the data ``(X (N, D), y (N,))`` at the current parameters.

    Each particle is one evaluation of the objective (``"auto"``: the estimator ``fit`` trains
    with, see :func:`make_objective`) on all of ``X``; for a model with ``num_data`` larger
    than ``N`` the likelihood is scaled by ``num_data / N``. With ``seed`` the draws leave the
    global random state untouched.
    """
    check_inputs(X)
    check_targets(y, X.shape[-2])
    num_particles = check_positive_int(num_particles, "num_particles")
    elbo = make_objective(objective, guide)
    values = []
    with torch.no_grad(), seeded(seed, X.device):
        for _ in range(num_particles):
            values.append(-float(elbo.loss(model, guide, X, y)))
    return ELBOEstimate.from_values(values)
