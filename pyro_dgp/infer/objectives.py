"""Objectives by name, their validity for a guide, and the ELBO of a fitted model."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from pyro.infer import ELBO, RenyiELBO, TraceMeanField_ELBO

from ..deprecation import renamed_keywords, renamed_value, user_stacklevel
from ..errors import user_errors_first
from ..guides.protocol import protocol_of
from ..rng import seeded
from ..validation import check_inputs, check_positive_int, check_targets
from .alpha import LocalAlpha
from .amortized import AmortizedELBO
from .elbo import AnalyticKL_ELBO, ReparamTrace_ELBO
from .importance import RenyiELBO as ImportanceRenyiELBO
from .importance import check_importance_weights
from .mixture import SIWAE, StratifiedELBO

__all__ = ["ELBOEstimate", "OBJECTIVE_NAMES", "default_num_particles", "evaluate_elbo",
           "make_objective", "objective_and_particles", "objective_name",
           "one_particle_objective"]

#: the per-point draws ``K`` of ``"alpha"`` when ``num_particles`` is not given
ALPHA_PARTICLES = 10
#: the draws per step of ``"elbo"`` and ``"analytic-kl"`` when ``num_particles`` is not given
#: (vectorised; GPyTorch's Deep GP trains with as many likelihood samples): BENCHMARKS.md,
#: "Which objective should be the default?"
ELBO_PARTICLES = 10
#: the ELBOs whose default draws are :data:`ELBO_PARTICLES`
_MANY_DRAWS = ("elbo", "analytic-kl")

#: the old spellings of objective names, and their new ones
_OLD_NAMES = {"meanfield": "analytic-kl"}


_OBJECTIVES = {
    # Trace_ELBO's estimator without its read-backs to the host (a CUDA graph can hold it)
    "elbo": lambda p, v: ReparamTrace_ELBO(num_particles=p, vectorize_particles=v,
                                           max_plate_nesting=1),
    "analytic-kl": lambda p, v: AnalyticKL_ELBO(
        num_particles=p, vectorize_particles=v, max_plate_nesting=1
    ),
    "renyi": lambda p, v: ImportanceRenyiELBO(alpha=0.5, num_particles=max(p, 2),
                                              vectorize_particles=v, max_plate_nesting=1),
    # a Mixture guide's: each component drawn from in turn (infer/mixture.py)
    "stratified": lambda p, v: StratifiedELBO(num_particles=p),
    "siwae": lambda p, v: SIWAE(num_particles=p),
}


#: the names :func:`make_objective` takes
OBJECTIVE_NAMES = ("auto", "alpha", *_OBJECTIVES)


def objective_name(objective, where: str = "fit"):
    """``objective`` with an old name (``"meanfield"``) replaced by its new one
    (``"analytic-kl"``), warned; anything else as is."""
    return renamed_value(objective, _OLD_NAMES, "objective", where)


def objective_and_particles(objective, num_particles: int | None, where: str = "fit",
                            guide=None):
    """``(objective, num_particles)``: the objective's new name (:func:`objective_name`) and
    ``num_particles``, or where ``None`` its :func:`default_num_particles` (for ``guide``)."""
    objective = objective_name(objective, where)
    return objective, (default_num_particles(objective, guide) if num_particles is None
                       else num_particles)


def default_num_particles(objective, guide=None) -> int:
    """``num_particles`` of ``objective`` (a name) when not given: ``K = 10`` per-point draws
    of ``"alpha"``; 10 draws per step of ``"elbo"`` and ``"analytic-kl"`` (``"auto"`` where it
    is one of them for ``guide``: every family but the amortized and mixture guides); one of
    any other (an amortized guide's objective and a mixture's, which draws every component
    in turn; ``"renyi"`` takes at least 2). An objective instance keeps its own."""
    if objective == "alpha":
        return ALPHA_PARTICLES
    if objective == "auto" and guide is not None:
        objective = protocol_of(guide).default_objective
    return ELBO_PARTICLES if objective in _MANY_DRAWS else 1


@renamed_keywords("make_objective", num_samples="num_particles")
def make_objective(objective, guide, num_particles: int | None = None,
                   alpha: float = 0.5) -> ELBO:
    """An objective from a name (``"auto"``, ``"elbo"``, ``"analytic-kl"``, ``"renyi"``,
    ``"alpha"``: :class:`~pyro_dgp.infer.alpha.LocalAlpha` with ``alpha`` and
    ``num_particles`` draws per point, not an ELBO) or
    an instance (returned as is, except that Pyro's ``RenyiELBO`` becomes
    :class:`~pyro_dgp.infer.importance.RenyiELBO` with the same settings: exact per-draw weights).
    ``"auto"`` is the guide's ``default_objective`` (the guide protocol):
    :class:`~pyro_dgp.infer.amortized.AmortizedELBO` for an :class:`~pyro_dgp.guides.Amortized`
    guide (its rule's objective, with the paths' weights),
    ``"analytic-kl"`` for other guides that factorise like the prior, else ``"elbo"``
    (Trace_ELBO). ``"analytic-kl"`` (formerly ``"meanfield"``) is
    :class:`~pyro_dgp.infer.elbo.AnalyticKL_ELBO`: TraceMeanField_ELBO's estimator (analytic
    KL), without the log-densities it discards.
    ``"renyi"`` is :class:`~pyro_dgp.infer.importance.RenyiELBO` (alpha 0.5).
    ``"stratified"`` and ``"siwae"`` train a :class:`~pyro_dgp.guides.Mixture`
    (:mod:`pyro_dgp.infer.mixture`, ``num_particles`` draws of each component), and
    ``"auto"`` is ``"stratified"`` for it.

    Each name is a shorthand for the instance it builds (``_OBJECTIVES`` below); ``fit``
    trains the same with either.

    :param num_particles: draws of the guide per evaluation (Pyro's word): of each point's
        ``log (1/K) sum_k`` in ``"alpha"`` and ``"renyi"``, else averaged; ``None``:
        :func:`default_num_particles`."""

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
    objective, num_particles = objective_and_particles(objective, num_particles,
                                                       "make_objective", guide)
    num_particles = check_positive_int(num_particles, "num_particles")
    if objective == "alpha":
        return LocalAlpha(alpha, num_particles)
    if objective == "auto":
        objective = protocol_of(guide).default_objective
        if objective == "amortized":
            return AmortizedELBO()
    if objective not in _OBJECTIVES:
        raise ValueError(
            f"objective must be a pyro ELBO or one of {list(OBJECTIVE_NAMES)}, got "
            f"{objective!r}"
        )
    if protocol_of(guide).only_its_objective and objective != protocol_of(guide).default_objective:
        _warn_own_objective(guide, objective)
    if objective == "analytic-kl":
        _warn_mean_field(guide)
    if objective == "renyi":
        check_importance_weights(guide)
    return _OBJECTIVES[objective](num_particles, num_particles > 1)


def _warn_own_objective(guide, objective: str) -> None:
    """A guide whose draws choose something without a reparameterisation (a Mixture's
    component) gets a biased gradient for that choice under objectives other than its own."""
    own = protocol_of(guide).default_objective
    warnings.warn(
        f"objective {objective!r} with a {type(guide).__name__} guide: part of its draw (a "
        "mixture's component) is chosen without a reparameterisation, so its parameters get a "
        f"biased gradient; use objective={own!r} (fit's default for it)"
        + (" or 'siwae'" if own == "stratified" else ""), UserWarning, stacklevel=3)


def _warn_mean_field(guide) -> None:
    if not protocol_of(guide).mean_field:
        warnings.warn(
            f"TraceMeanField_ELBO assumes a guide that factorises like the model; "
            f"{type(guide).__name__} does not declare that (its analytic KL terms may be "
            "wrong); use Trace_ELBO",
            UserWarning,
            stacklevel=user_stacklevel(),
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


def one_particle_objective(objective, guide) -> ELBO:
    """The objective of one particle of an ELBO estimate (:func:`evaluate_elbo`): a name's
    instance with one draw, except ``"alpha"``, whose ``K`` draws per point define it; an
    instance as is."""
    one = None if objective_name(objective, "evaluate_elbo") == "alpha" else 1
    return make_objective(objective, guide, one)


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
    elbo = one_particle_objective(objective, guide)
    values = []
    with torch.no_grad(), seeded(seed, X.device):
        for _ in range(num_particles):
            values.append(-float(elbo.loss(model, guide, X, y)))
    return ELBOEstimate.from_values(values)
