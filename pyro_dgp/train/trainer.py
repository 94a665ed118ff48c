"""The loop of :func:`~pyro_dgp.fit`: its steps (composed of the step strategies of
:mod:`pyro_dgp.train.steps`), the guard against divergence, checkpoints and resume, the
fallback from a CUDA graph, and what a fit returns."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path

import pyro
import torch
from pyro.infer.util import is_validation_enabled

from ..errors import unwrap_trace_error
from ..infer.alpha import LocalAlpha
from ..infer.natgrad import NaturalGradient, NaturalStepError
from ..linalg import CholeskyError
from .batches import Batches
from .checkpoint import atomic_save, read_checkpoint, rng_state, set_rng_state
from .cuda_graph import side_stream
from .distributed import DataParallel, PeerFailedError
from .monitor import LossMonitor, StepInfo, Watchers
from .optim import LRSchedule, drop_non_finite_moments
from .progress import Progress
from .result import FitResult, TrainingDivergedError
from .steps import DataParallelStep, GraphedStep, gradient_step

__all__ = ["Trainer", "resume_state"]


#: what a changed setting does to a resumed run (Trainer.check_resumable)
_CHANGED = {
    "lr": "the run continues from its state at the new rate, not exactly",
    "batch_size": "the run continues from its state with minibatches of the new size, not "
                  "exactly",
    "seed": "the random streams carry on from the checkpoint (those of its seed), so the run "
            "is not the one the new seed gives",
    "lr_schedule": "the run continues from its state at the new schedule's rates, not "
                   "exactly",
    "lr_decay": "the run continues from its state at the new schedule's rates, not exactly",
    "num_steps": "the learning-rate schedule, a function of the step and of num_steps, goes on "
                 "at the rates of the new length, not as the run before would have",
}


class Trainer:
    """The state of one call of :func:`~pyro_dgp.fit`: optimiser, random streams, checkpoint
    file, and its steps."""

    def __init__(self, model, guide, elbo, batches: Batches, opt, params, generator, lr,
                 schedule: LRSchedule, num_steps, path, natural: NaturalGradient | None = None,
                 parallel: DataParallel | None = None, seed: int = 0, cuda_graph: bool = False,
                 watchers: Watchers | None = None):
        self.model, self.guide, self.elbo, self.batches = model, guide, elbo, batches
        self.device = batches.device
        self.opt, self.params, self.generator = opt, params, generator
        # each group's rate: its own rate at construction times the schedule's factor
        self.lr, self.schedule, self.num_steps, self.path = lr, schedule, num_steps, path
        self.base_lrs = [group["lr"] for group in opt.param_groups]
        self.watchers = watchers if watchers is not None else Watchers()
        self.monitor = LossMonitor(batches.num_data)
        self.result = FitResult(num_steps=num_steps)
        self.start, self.seconds_before, self.t0 = 0, 0.0, time.perf_counter()
        self.last_good = None
        self.natural = natural
        # data-parallel: this process's part (train/distributed.py); only process 0 writes
        self.parallel, self.seed = parallel, seed
        self.writer = parallel is None or parallel.writer
        # the step strategies (train/steps.py): the loss and gradients of each eager step,
        # the all-reduce of a data-parallel run, and the step recorded as a CUDA graph after
        # the first (validated, eager) step
        self.gradients = gradient_step(elbo, model, guide, natural, parallel,
                                       lambda: batches.share)
        self.data_parallel = (None if parallel is None else
                              DataParallelStep(parallel, params, seed))
        self.graph = GraphedStep.of(elbo, model, guide, params) if cuda_graph else None
        self.replayed_update = False  # whether the latest update came from a replay

    def progress_label(self, loss_per_point: float) -> dict[str, str]:
        """The progress bar's figure: ``elbo/pt`` for an ELBO, ``loss/pt`` for an objective
        that is not one (the local alpha objective)."""
        if isinstance(self.elbo, LocalAlpha):
            return {"loss": f"{loss_per_point:.4f}/pt"}
        return {"elbo": f"{-loss_per_point:.4f}/pt"}

    def resume(self, state: dict | None) -> None:
        """Continue from ``state``, the checkpoint :func:`resume_state` read (parameters,
        moments, streams, losses); ``None``: there was none, the run starts from step 0. In a
        data-parallel run every process loads it, and an error in one (a checkpoint of another
        model, say) stops all of them at once."""
        if state is None:
            return
        with (contextlib.nullcontext() if self.parallel is None else
              self.parallel.together("resuming from the checkpoint")):
            self._load(state)

    def _load(self, state: dict) -> None:
        """Check ``state`` against this run and load it."""
        self.check_resumable(state)
        for part, module in (("model", self.model), ("guide", self.guide)):
            try:
                module.load_state_dict(state[part])
            except RuntimeError as err:
                what = " ".join(str(err).split("\n", 1)[-1].split())
                raise ValueError(
                    f"the checkpoint {self.path} holds another {part} than this run's "
                    f"{type(module).__name__} (built with other settings): {what}") from None
        self.opt.load_state_dict(state["optimizer"])
        for group, lr in zip(self.opt.param_groups, self.base_lrs, strict=True):
            group["lr"] = lr  # load_state_dict brought back the saved rate; each step sets it
        set_rng_state(state["rng"], self.generator, self.device)
        self.result.losses = list(state["losses"])
        for loss in self.result.losses:  # the smoothed loss, as the run before saw it
            self.monitor.update(loss)
        self.monitor.warned = bool(state.get("warned_unstable", False))
        self.start = self.result.resumed_from = int(state["step"])
        if self.natural is not None and "natural" in state:  # its backtracked step sizes
            self.natural.load_state_dict(state["natural"])
        self.seconds_before = float(state.get("seconds", 0.0))
        stopping = self.watchers.early_stopping
        if stopping is not None and state.get("early_stopping") is not None:
            stopping.load_state_dict(state["early_stopping"])
        self.batches.skip(self.start)

    def check_resumable(self, state: dict) -> None:
        """Refuse a checkpoint of other data (another ``N``) or of more steps than
        ``num_steps``; warn where ``lr``, ``batch_size`` or ``seed`` differ from the
        checkpoint's (the run goes on, no longer the one it continues). Checkpoints that do not
        record a setting are not checked for it."""
        saved_n, n = state.get("num_data"), self.batches.num_data
        if saved_n is not None and saved_n != n:
            raise ValueError(
                f"the checkpoint {self.path} was written training on N={saved_n} points, this "
                f"run has N={n}: it resumes only on the data it was written on (start afresh "
                "with another checkpoint path, or resume=False)")
        step = int(state["step"])
        if step > self.num_steps:
            raise ValueError(
                f"num_steps={self.num_steps} is below the {step} steps the checkpoint "
                f"{self.path} has run: num_steps counts every step of the run, those before "
                f"the checkpoint included; pass num_steps >= {step}")
        if not self.writer:
            return
        if "lr_schedule" not in state:  # written before schedules: a constant rate
            state = {**state, "lr_schedule": "constant", "lr_decay": 1.0}
        for name, now in (("lr", self.lr), ("batch_size", self.batches.batch_size),
                          ("seed", self.seed), ("lr_schedule", self.schedule.name),
                          ("lr_decay", self.schedule.decay), ("num_steps", self.num_steps)):
            if name == "lr_decay" and state.get("lr_schedule") != self.schedule.name:
                continue  # warned as another schedule
            if name == "num_steps" and not self.schedule.decays:
                continue  # the rate does not depend on it
            if name in state and state[name] != now:
                warnings.warn(  # at the user's call: check_resumable, _load, resume, _fit,
                    # fit, its error-unwrapping wrapper, the user
                    f"resuming with {name}={now}; the checkpoint was written with "
                    f"{name}={state[name]}: {_CHANGED[name]}", UserWarning, stacklevel=7)

    def save(self, step: int, rng: dict | None = None) -> None:
        """Checkpoint at the start of ``step``; ``rng``: the random state there, if the
        streams have moved on since (a step cut short by an interrupt or a NaN)."""
        if self.path is None or not self.writer:
            return
        atomic_save(self.path, {
            "step": step,
            "model": self.model.state_dict(),
            "guide": self.guide.state_dict(),
            "optimizer": self.opt.state_dict(),
            "rng": rng if rng is not None else rng_state(self.generator, self.device),
            "losses": self.result.losses,
            "lr": self.lr,
            "lr_schedule": self.schedule.name,
            "lr_decay": self.schedule.decay,
            "num_steps": self.num_steps,
            "warned_unstable": self.monitor.warned,
            "early_stopping": (None if self.watchers.early_stopping is None else
                               self.watchers.early_stopping.state_dict()),
            # the run's settings that resuming checks (check_resumable)
            "num_data": self.batches.num_data,
            "batch_size": self.batches.batch_size,
            "seed": self.seed,
            "seconds": self.seconds_before + time.perf_counter() - self.t0,
            **({} if self.natural is None else {"natural": self.natural.state_dict()}),
        })

    def loss_and_grads(self, step: int, args) -> tuple[float, Exception | None]:
        """One evaluation of the objective and its gradient; ``(nan, error)`` where a Cholesky
        failure after the first step shows parameters gone non-finite."""
        # Pyro's validation (distribution arguments, the mean-field check, finiteness of layer
        # inputs and targets) runs on the first step only: model, guide and data shapes do not
        # change between steps, X and y were checked, and a NaN loss is caught by the caller.
        try:
            with pyro.validation_enabled(is_validation_enabled() and step == self.start):
                return self.gradients.step(args), None
        except CholeskyError as err:
            if step == self.start and self.parallel is None:
                raise  # the starting parameters themselves: not a divergence
            # in a data-parallel run the other processes wait in the all-reduce: the NaN
            # reaches them there, and every process stops at this step
            return math.nan, err

    def graphed_loss_and_grads(self, step: int, args) -> tuple[float, Exception | None]:
        """:meth:`loss_and_grads` replayed from the CUDA graph (:class:`GraphedStep`)."""
        try:
            loss = self.graph.step(args)
        except CholeskyError as err:  # in the eager run of a step whose replay was not finite
            return math.nan, err
        if loss is None:  # the step cannot be recorded: eager from here (warned)
            self.graph = None
            self.opt.zero_grad()
            return self.loss_and_grads(step, args)
        return loss, None

    def leave_graph(self, step: int, args) -> tuple[float, Exception | None]:
        """The loss is not finite even eagerly after an update from a replayed step: take the
        update back (the parameters of the step before, the moments' non-finite entries
        zeroed), train eagerly from here, and evaluate this step again. A replay that misled
        the optimiser then costs one step, and a run that diverges eagerly too still stops as
        an eager run does."""
        with torch.no_grad():
            for p, good in zip(self.params, self.last_good, strict=True):
                p.copy_(good)
            drop_non_finite_moments(self.opt)
        warnings.warn(
            f"the loss was not finite at step {step}, after an update from a step replayed "
            "from the CUDA graph; the update was taken back and training goes on without the "
            "graph", UserWarning, stacklevel=6)  # the user's call of fit
        self.result.graph_steps, self.graph = self.graph.replays, None
        self.opt.zero_grad()
        return self.loss_and_grads(step, args)

    def diverged(self, step: int, loss: float, failure, step_rng) -> TrainingDivergedError:
        """Restore the last good parameters, checkpoint, and the error to raise."""
        with torch.no_grad():
            for p, good in zip(self.params, self.last_good, strict=True):
                p.copy_(good)
            drop_non_finite_moments(self.opt)
        self.save(step, step_rng)
        what = f"the loss became {loss}" if failure is None else f"{failure}"
        return TrainingDivergedError(
            f"{what} at step {step}; the parameters were restored to their last values "
            f"with a finite loss. Try a smaller lr (now {self.lr}), float64 data, or more "
            "jitter."
        )

    def local_step(self, step: int) -> tuple[float, Exception | None]:
        """This process's part of ``step``: its batch, the rate, its loss and gradients."""
        args = self.batches.draw(self.generator)
        factor = self.schedule.factor(step, self.num_steps)
        for group, lr in zip(self.opt.param_groups, self.base_lrs, strict=True):
            group["lr"] = lr * factor
        if self.graph is not None and step > self.start:
            loss, failure = self.graphed_loss_and_grads(step, args)
            if not math.isfinite(loss) and self.replayed_update:
                loss, failure = self.leave_graph(step, args)
        else:
            self.opt.zero_grad()
            if self.data_parallel is not None:
                self.data_parallel.seed_draws(step)
            loss, failure = self.loss_and_grads(step, args)
        return loss, failure

    def step(self, step: int, step_rng) -> float:
        if self.data_parallel is None:
            loss, failure = self.local_step(step)
        else:
            loss, failure = self.data_parallel.step(lambda: self.local_step(step),
                                                    first=step == self.start)
        if not math.isfinite(loss):
            # the error as raised (a Cholesky failure inside the model, say), not as Pyro's
            # traces wrapped it with their tables of site shapes (pyro_dgp.errors)
            failure = None if failure is None else unwrap_trace_error(failure)
            raise self.diverged(step, loss, failure, step_rng) from failure
        with torch.no_grad():
            for p, good in zip(self.params, self.last_good, strict=True):
                good.copy_(p)
        if self.natural is not None:
            try:
                self.natural.step()
            except NaturalStepError as err:  # the parameters of before this step come back
                raise self.diverged(step, math.nan, err, step_rng) from err
        self.opt.step()
        # the guard of leave_graph: whether this update came from a replay
        self.replayed_update = self.graph is not None and self.graph.last_replayed
        self.result.losses.append(loss)
        return loss

    def run(self, checkpoint_every: int) -> FitResult:
        """The steps from ``start`` to ``num_steps`` (or to a stop), the checkpoint at the
        end, and the best iterate restored where validation data chose one."""
        self.t0 = time.perf_counter()
        self.last_good = [p.detach().clone() for p in self.params]
        display = Progress(self.watchers.progress if self.writer else False, self.num_steps,
                           self.start)
        with side_stream(self.device) if self.graph is not None else contextlib.nullcontext():
            try:
                end = self._run(display, checkpoint_every)
            finally:
                display.close()
        self.save(end)
        if self.graph is not None:
            self.result.graph_steps = self.graph.replays
        stopping = self.watchers.early_stopping
        if stopping is not None:
            stopping.restore_best()
            self.result.validation = list(stopping.history)
            self.result.best_step = stopping.best_step if stopping.history else None
            self.result.best_validation = stopping.best
        self.result.seconds = self.seconds_before + time.perf_counter() - self.t0
        return self.result

    def _run(self, display: Progress, checkpoint_every: int) -> int:
        """The loop; returns the steps done at its end."""
        losses = self.result.losses
        stopping = self.watchers.early_stopping
        if stopping is not None and stopping.stopped:  # resumed from a run that had stopped
            self.stopped(self.start, "early stopping (in the run this one resumes)")
            return self.start
        step, step_rng = self.start, None
        try:
            for step in range(self.start, self.num_steps):
                if self.path is not None:  # the generator's state: only for a checkpoint
                    step_rng = rng_state(self.generator, self.device)
                loss = self.step(step, step_rng)
                done = step + 1
                self.monitor.update(loss)
                # stacklevel 7: check, _run, run, _fit, fit, its error-unwrapping wrapper,
                # the user's call
                if self.writer:
                    self.monitor.check(self.opt.param_groups[0]["lr"], stacklevel=7)
                # the label is formatted only at the steps that show it
                display.update(done, lambda: self.progress_label(self.monitor.smoothed))
                reason = self.after_step(done, loss)
                if reason is not None and done < self.num_steps:
                    self.stopped(done, reason)
                    return done
                if self.path is not None and done % checkpoint_every == 0:
                    self.save(done)
        except (KeyboardInterrupt, PeerFailedError):
            # the step in flight is dropped; the run resumes from its start exactly (unless
            # the interrupt came between the update and the loss record). A lost peer stops
            # the step in its all-reduce, before any update: every process was at this state
            self.save(len(losses), step_rng if len(losses) == step else None)
            raise
        return self.num_steps

    def stopped(self, done: int, reason: str) -> None:
        self.result.stopped_at, self.result.stop_reason = done, reason

    def after_step(self, done: int, loss: float) -> str | None:
        """Validation and callbacks after ``done`` steps; why the run stops, or ``None``."""
        return self.watchers.after_step(done, done == self.num_steps, lambda validation: StepInfo(
            step=done, loss=loss, loss_per_point=loss / self.batches.num_data,
            smoothed=self.monitor.smoothed, lr=self.opt.param_groups[0]["lr"],
            validation=validation, model=self.model, guide=self.guide))


def resume_state(path: Path | None, device: torch.device,
                 parallel: DataParallel | None = None) -> dict | None:
    """The checkpoint at ``path`` to resume from, on ``device``; ``None``, warned, where there
    is none (the run starts from step 0). In a data-parallel run process 0 reads it and sends
    it to every process (:meth:`DataParallel.share_checkpoint`): where it cannot (a corrupt
    file, not a checkpoint), every process stops at once, told why."""
    if path is None:
        raise ValueError("resume=True needs a checkpoint path")

    def read() -> dict | None:
        return read_checkpoint(path, map_location=device) if path.exists() else None

    state = read() if parallel is None else parallel.share_checkpoint(read, map_location=device)
    if state is None and (parallel is None or parallel.writer):
        # stacklevel 5: resume_state, _fit, fit, its error-unwrapping wrapper, the user
        warnings.warn(f"resume=True, but there is no checkpoint at {path}: training starts "
                      "from step 0", UserWarning, stacklevel=5)
    return state
