"""What :func:`~pyro_dgp.fit` watches while it trains: the smoothed loss and the warning when it
rises far above its best, the user's callbacks, and early stopping on a validation set.

**Smoothed loss.** With ``x_t = loss_t / N`` the per-point loss of step ``t``, an exponential
moving average started at the first step's loss (``beta = 0.98``, a memory of about 50
steps: a few steps that go up from a poor start move it little)::

    ema_1 = x_1,        ema_t = beta ema_{t-1} + (1 - beta) x_t,

and, as the noise of the per-step loss about it, the same average of the squared residuals
``(x_t - ema_{t-1})^2`` with the bias correction of Kingma and Ba 2015 (divided by
``1 - beta^(t-1)``), whose root is ``sd_t``. The *best* is the lowest ``ema_t``. The loss has
risen *far* above it when::

    ema_t - best > max(RISE_PER_POINT, RISE_IN_NOISE * sd_best)

``sd_best`` the noise where the best was reached: a rise of one nat per point is a model
whose data fit is worse by a factor ``e`` on average, and one of ten times the step-to-step
noise is no minibatch's chance (the average of 50 steps varies by a tenth of that noise).
(On the demo's step function a constant ``lr = 0.02`` rises past it late in the run and the
default cosine schedule does not: ``benchmarks/results/history.md``, "The instability warning
on the demo".)
It is warned once per run, as :class:`TrainingInstabilityWarning`, when the smoothed loss has
stayed that far above its best for ``RISE_STEPS`` (10) steps in a row: the first steps from a
poor start may go up and come down again.

**Early stopping.** :class:`EarlyStopping` scores the fit every ``validate_every`` steps with
a function of no arguments (lower is better), keeps a copy of the model's and guide's state at
the best score, stops after ``patience`` evaluations without improvement, and restores the best
state at the end; its state goes into the checkpoint, so a resumed run stops where the
uninterrupted one would.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pyro
import torch

from ..rng import seeded

__all__ = ["EarlyStopping", "LossMonitor", "StepInfo", "TrainingInstabilityWarning", "Watchers",
           "validation_loss"]


class TrainingInstabilityWarning(UserWarning):
    """The smoothed training loss rose far above its best (:class:`LossMonitor`): the steps
    are too large for the problem, and the fit at the end is worse than one it passed."""


#: smoothing of the per-point loss (a memory of 1 / (1 - BETA) = 50 steps)
BETA = 0.98
#: a rise of the smoothed loss above its best, per point, that is far whatever the noise
RISE_PER_POINT = 1.0
#: a rise, in units of the per-step loss noise at the best, that is far
RISE_IN_NOISE = 10.0
#: steps in a row the smoothed loss must stay far above its best to be warned about (a start
#: whose first steps go up and come down again is not unstable training)
RISE_STEPS = 10


class LossMonitor:
    """The smoothed per-point loss of a run and its best (module docstring)."""

    def __init__(self, num_data: int):
        self.num_data = num_data
        self.steps, self.mean, self.square = 0, 0.0, 0.0
        self.best, self.best_step, self.best_noise = math.inf, 0, 0.0
        self.far_since: int | None = None  # the first step of the current far rise
        self.warned = False

    @property
    def smoothed(self) -> float:
        """``ema_t``, the smoothed per-point loss (``nan`` before any step)."""
        return self.mean if self.steps else math.nan

    @property
    def noise(self) -> float:
        """``sd_t``, the smoothed root mean square of the per-step residuals."""
        residuals = self.steps - 1
        return math.sqrt(self.square / (1 - BETA ** residuals)) if residuals else 0.0

    def update(self, loss: float) -> None:
        """Take in one step's loss (full-data scale)."""
        x = loss / self.num_data
        if self.steps:
            residual = x - self.mean  # r * r, not r ** 2: a float past 1e154 gives inf, which
            # the rise check then reports, where ** raises OverflowError out of fit
            self.square = BETA * self.square + (1 - BETA) * residual * residual
            self.mean = BETA * self.mean + (1 - BETA) * x
        else:
            self.mean = x
        self.steps += 1
        if self.mean < self.best:
            self.best, self.best_step, self.best_noise = self.mean, self.steps, self.noise
        if self.rise() <= self.far_rise():
            self.far_since = None
        elif self.far_since is None:
            self.far_since = self.steps

    def rise(self) -> float:
        """How far the smoothed loss is above its best, per point."""
        return self.smoothed - self.best if self.steps else 0.0

    def far_rise(self) -> float:
        """The rise above the best that counts as far (module docstring)."""
        return max(RISE_PER_POINT, RISE_IN_NOISE * self.best_noise)

    def check(self, lr: float, stacklevel: int) -> None:
        """Warn (once) when the smoothed loss has stayed far above its best for
        :data:`RISE_STEPS` steps in a row."""
        if (self.warned or self.far_since is None
                or self.steps - self.far_since + 1 < RISE_STEPS):
            return
        self.warned = True
        warnings.warn(
            f"the smoothed training loss rose from {self.best:.4g} per point (its best, at step "
            f"{self.best_step}) to {self.smoothed:.4g} at step {self.steps}, more than "
            f"{self.far_rise():.3g} per point above it: training is unstable at this learning "
            f"rate (now {lr:.3g}). Try a smaller lr, a decaying lr_schedule, or early stopping "
            "on a validation set (validation=(X_val, y_val)) to keep the best iterate.",
            TrainingInstabilityWarning, stacklevel=stacklevel)


@dataclass(frozen=True)
class StepInfo:
    """What a callback of :func:`~pyro_dgp.fit` is given after a step.

    ``step``: the steps done so far (1 after the first); ``loss``: that step's training loss,
    full-data scale; ``loss_per_point``: ``loss / N``; ``smoothed``: the smoothed per-point
    loss (:class:`LossMonitor`); ``lr``: the step's learning rate; ``validation``: the latest
    validation score (``None`` without validation, or before the first); ``model``,
    ``guide``: the objects being trained (read them; a change is trained on from the next
    step)."""

    step: int
    loss: float
    loss_per_point: float
    smoothed: float
    lr: float
    validation: float | None
    model: object
    guide: object


def _copy_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class EarlyStopping:
    """Scores of the fit on validation data every ``every`` steps; the best state kept.

    :param score: ``() -> float``, the validation loss at the current parameters (lower is
        better).
    :param every: steps between evaluations. :param patience: evaluations without a better
        score after which the run stops. :param check: ``() -> None``, raises where the
        validation cannot be scored (called once the guide is set up, before the first step).
    """

    def __init__(self, score: Callable[[], float], every: int, patience: int, model, guide,
                 check: Callable[[], None] | None = None):
        self.score, self.every, self.patience = score, every, patience
        self._check = check
        self.model, self.guide = model, guide
        self.history: list[tuple[int, float]] = []
        self.best, self.best_step, self.since_best = math.inf, 0, 0
        self.best_state: dict | None = None
        self.stopped = False

    def check(self) -> None:
        """Refuse, before the run, a validation that cannot be scored (the guide set up)."""
        if self._check is not None:
            self._check()

    def due(self, steps_done: int, last: bool) -> bool:
        """Whether to evaluate after ``steps_done`` steps (every ``every``, and at the end)."""
        return steps_done % self.every == 0 or (
            last and (not self.history or self.history[-1][0] != steps_done))

    def evaluate(self, steps_done: int) -> bool:
        """Score the fit after ``steps_done`` steps; ``True`` when patience has run out."""
        value = _finite_score(self.score(), steps_done)
        self.history.append((steps_done, value))
        if value < self.best:
            self.best, self.best_step, self.since_best = value, steps_done, 0
            self.best_state = {"model": _copy_state(self.model), "guide": _copy_state(self.guide)}
        else:
            self.since_best += 1
        self.stopped = self.since_best >= self.patience
        return self.stopped

    @property
    def latest(self) -> float | None:
        return self.history[-1][1] if self.history else None

    def restore_best(self) -> None:
        """Load the best state into the model and guide (no-op before any evaluation)."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state["model"])
            self.guide.load_state_dict(self.best_state["guide"])

    def state_dict(self) -> dict:
        """Plain data and tensors, for the checkpoint."""
        return {"history": [list(h) for h in self.history], "best": self.best,
                "best_step": self.best_step, "since_best": self.since_best,
                "best_state": self.best_state, "stopped": self.stopped, "every": self.every,
                "patience": self.patience}

    def load_state_dict(self, state: dict) -> None:
        if int(state["every"]) != self.every:
            warnings.warn(
                f"resuming with validation every {self.every} steps; the checkpoint validated "
                f"every {state['every']} (validate_every, by default num_steps // 50): the "
                "evaluations fall on other steps than the run before would have scored",
                UserWarning, stacklevel=7)
        self.history = [(int(s), float(v)) for s, v in state["history"]]
        self.best, self.best_step = float(state["best"]), int(state["best_step"])
        self.since_best, self.best_state = int(state["since_best"]), state["best_state"]
        # a run resumed with another patience stops by its own
        self.stopped = self.since_best >= self.patience


@dataclass
class Watchers:
    """What a run calls besides its steps: ``callbacks`` (each ``StepInfo -> bool | None``,
    every ``callback_every`` steps and at the last; a true value stops the run),
    ``early_stopping`` (or ``None``), the ``progress`` setting
    (:class:`~pyro_dgp.train.progress.Progress`)."""

    callbacks: list = field(default_factory=list)
    callback_every: int = 1
    early_stopping: EarlyStopping | None = None
    progress: bool | int = False

    def after_step(self, done: int, last: bool,
                   step_info: Callable[[float | None], StepInfo]) -> str | None:
        """Validation and callbacks after ``done`` steps (``step_info(latest validation)``
        builds the callbacks' record); why the run stops, or ``None``."""
        reason, stopping = None, self.early_stopping
        if stopping is not None and stopping.due(done, last) and stopping.evaluate(done):
            reason = (f"early stopping: the validation loss has not improved on its best (at "
                      f"step {stopping.best_step}) in {stopping.patience} evaluations")
        if self.callbacks and (done % self.callback_every == 0 or last):
            info = step_info(None if stopping is None else stopping.latest)
            for callback in self.callbacks:
                request = callback(info)
                if request is not None and bool(request) and reason is None:
                    reason = f"stopped by the callback {_name_of(callback)}"
        return reason


def _finite_score(score, steps_done: int) -> float:
    """A validation score as a float; a score that is not one finite number is an error
    naming ``validation`` (a NaN would otherwise never be best, and stop the run silently)."""
    if isinstance(score, torch.Tensor):
        if score.numel() != 1:
            raise ValueError(f"validation: the score after step {steps_done} has shape "
                             f"{tuple(score.shape)}; it must be one number")
        score = score.item()
    try:
        value = float(score)
    except (TypeError, ValueError):
        raise TypeError(f"validation: the score after step {steps_done} must be a number, got "
                        f"{type(score).__name__}") from None
    if not math.isfinite(value):
        raise ValueError(f"validation: the score after step {steps_done} is {value}; it must "
                         "be finite (a diverged fit, or a validation function that failed)")
    return value


def _name_of(callback) -> str:
    return getattr(callback, "__qualname__", None) or type(callback).__name__


#: draws of each validation evaluation (the same draws each time: common random numbers, so
#: successive scores differ by the parameters only)
VALIDATION_PARTICLES = 8
#: rows of the validation data per evaluation of the objective
VALIDATION_CHUNK_ROWS = 4096


def validation_loss(model, guide, elbo, X: torch.Tensor, y: torch.Tensor, num_data: int,
                    seed: int, num_particles: int = VALIDATION_PARTICLES) -> float:
    """The training objective per point on validation data ``X (V, D)``, ``y (V,)``.

    Each chunk ``c`` of ``n_c <= N`` validation rows is evaluated as a minibatch of the ``N``
    training points (``model.num_data = N``: its likelihood scaled by ``N / n_c``), which gives
    ``-(N / n_c) sum_{i in c} E_i + KL`` with ``E_i = E_q[log p(y_i | f_i)]``; weighted by
    ``n_c / V``, summed and divided by ``N``::

        loss_val = -(1 / V) sum_i E_i + KL / N,

    the negative ELBO per point had the validation points been training points: its data term
    is the held-out expected log-likelihood, its KL the training run's. Averaged over
    ``num_particles`` draws from ``seed`` (the global random state is left as it was).
    """
    rows = X.shape[-2]
    chunk_rows = min(num_data, VALIDATION_CHUNK_ROWS)
    total = 0.0
    with torch.no_grad(), pyro.validation_enabled(False), seeded(seed, X.device):
        for lo in range(0, rows, chunk_rows):
            X_c, y_c = X[..., lo:lo + chunk_rows, :], y[lo:lo + chunk_rows]
            weight = X_c.shape[-2] / rows
            for _ in range(num_particles):
                total += weight * float(elbo.loss(model, guide, X_c, y_c))
    return total / num_particles / num_data
