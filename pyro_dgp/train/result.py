"""What :func:`~pyro_dgp.fit` returns (:class:`Restarts` with ``restarts=R``), and the error
of a run whose loss became NaN or inf."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["FitResult", "Restart", "Restarts", "TrainingDivergedError"]


class TrainingDivergedError(FloatingPointError):
    """The loss became NaN or inf; the parameters were restored to the last good step."""


@dataclass
class FitResult:
    """``losses[k]`` is the training loss at step k (the negative ELBO estimate, or the
    negative local alpha objective), full-data scale;
    ``final_elbo`` the ELBO at the final parameters (:func:`~pyro_dgp.evaluate_elbo`, the ELBO
    estimator of the guide whatever the training objective, averaged over
    ``final_elbo_particles`` draws on the training data; ``nan`` if not evaluated) and
    ``final_elbo_stderr`` its Monte Carlo standard error; ``seconds`` the wall time of the
    run's steps, those of the calls it resumed included; ``graph_steps`` how many steps of
    this call (not of those it resumed) were replays of a CUDA graph
    (``fit(cuda_graph=True)``).

    With early stopping or a callback's stop, ``stopped_at`` is the number of steps the run
    took (``None``: all ``num_steps``) and ``stop_reason`` says why. With validation data,
    ``validation`` holds ``(steps done, validation loss per point)`` of every evaluation,
    ``best_step`` the steps done at the best one, whose parameters the model and guide hold
    at the end, and ``best_validation`` its loss."""

    losses: list[float] = field(default_factory=list)
    num_steps: int = 0
    seconds: float = 0.0
    resumed_from: int | None = None
    final_elbo: float = math.nan
    final_elbo_stderr: float = math.nan
    graph_steps: int = 0
    stopped_at: int | None = None
    stop_reason: str | None = None
    validation: list[tuple[int, float]] = field(default_factory=list)
    best_step: int | None = None
    best_validation: float = math.nan

    def __repr__(self) -> str:
        last = f"{self.losses[-1]:.4g}" if self.losses else "none"
        extra = "" if self.stopped_at is None else (
            f", stopped_at={self.stopped_at} ({self.stop_reason})")
        if self.best_step is not None:
            extra += f", best_step={self.best_step} (validation {self.best_validation:.4g})"
        return (f"FitResult(num_steps={self.num_steps}, final_elbo={self.final_elbo:.6g} "
                f"(se {self.final_elbo_stderr:.2g}), last loss={last}, "
                f"seconds={self.seconds:.1f}, resumed_from={self.resumed_from}{extra})")


@dataclass(frozen=True)
class Restart:
    """One of :class:`Restarts`: its trained ``model`` and ``guide`` (the guide a guide of this
    very model), its :class:`FitResult` and the ``seed`` it ran from (``None``: its
    checkpoint's, on resume)."""

    model: object
    guide: object
    result: FitResult
    seed: int | None


@dataclass
class Restarts(Sequence):
    """What ``fit(..., restarts=R)`` returns: ``R`` independent fits, restart ``k`` from seed
    ``seed + k`` (:mod:`pyro_dgp.train.restarts`). A sequence of :class:`Restart`;
    ``restarts[0]`` holds the model and guide given to ``fit``, trained in place.

    Nothing is shared between the restarts: each has its own model (kernel, likelihood and
    inducing inputs, learned per restart) and guide, under parameter names of its own."""

    runs: list[Restart]

    def __getitem__(self, k):
        return self.runs[k]

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def pairs(self) -> list[tuple]:
        """``[(model, guide), ...]`` of every restart. :func:`pyro_dgp.stack` takes these, or
        the :class:`Restarts` itself: ``pyro_dgp.stack(restarts, X_val, y_val)``."""
        return [(run.model, run.guide) for run in self.runs]

    @property
    def final_elbos(self) -> list[float]:
        """Each restart's ``FitResult.final_elbo``, in order."""
        return [run.result.final_elbo for run in self.runs]

    @property
    def best(self) -> Restart:
        """The restart of the highest final ELBO (the first of equal ones; each estimate has
        its Monte Carlo error, ``FitResult.final_elbo_stderr``, which this does not weigh).

        :raises ValueError: no restart has a final ELBO (``final_elbo_particles=0``)."""
        scored = [(elbo, k) for k, elbo in enumerate(self.final_elbos) if not math.isnan(elbo)]
        if not scored:
            raise ValueError("Restarts.best compares the restarts' final ELBOs, which were not "
                             "evaluated: fit with final_elbo_particles > 0")
        return self.runs[max(scored, key=lambda pair: (pair[0], -pair[1]))[1]]

    def __repr__(self) -> str:
        elbos = ", ".join(f"{e:.6g}" for e in self.final_elbos)
        return f"Restarts({len(self)} fits, seeds={[r.seed for r in self.runs]}, " \
               f"final_elbos=[{elbos}])"
