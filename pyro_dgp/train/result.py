"""What :func:`~pyro_dgp.fit` returns, and the error of a run whose loss became NaN or inf."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["FitResult", "TrainingDivergedError"]


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
