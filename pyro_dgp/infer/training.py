"""``fit``: stochastic variational inference with minibatches, progress, checkpoints, resume."""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import torch
from pyro.infer.util import is_validation_enabled
from tqdm.auto import tqdm

from ..datasets.stream import RowStream, as_stream
from ..errors import user_errors_first
from ..linalg import CholeskyError
from ..validation import check_inputs, check_positive_int, check_targets
from .alpha import LocalAlpha
from .batches import Batches, check_stream, model_dtype_device
from .checkpoint import atomic_save, rng_state, safe_load, set_rng_state
from .chunked import fit_elbo
from .cuda_graph import GraphCaptureError, GraphedLoss, side_stream
from .distributed import DataParallel, PeerFailedError, check_objective, for_fit
from .draws import check_guide_of
from .minibatch import check_minibatch_scale
from .natgrad import NaturalGradient
from .objectives import make_objective
from .optim import drop_non_finite_moments, make_optimizer, parameters_of
from .threads import num_threads, step_work, threads_for

__all__ = ["FitResult", "TrainingDivergedError", "fit", "make_objective", "make_optimizer"]


class TrainingDivergedError(FloatingPointError):
    """The loss became NaN or inf; the parameters were restored to the last good step."""


@dataclass
class FitResult:
    """``losses[k]`` is the training loss at step k (the negative ELBO estimate, or the
    negative local alpha objective), full-data scale;
    ``final_elbo`` the ELBO at the final parameters (:func:`~pyro_dgp.elbo`, the ELBO
    estimator of the guide whatever the training objective, averaged over
    ``final_elbo_particles`` draws on the training data; ``nan`` if not evaluated) and
    ``final_elbo_stderr`` its Monte Carlo standard error; ``seconds`` the wall time of the
    run's steps, those of the calls it resumed included; ``graph_steps`` how many of them were
    replays of a CUDA graph (``fit(cuda_graph=True)``)."""

    losses: list[float] = field(default_factory=list)
    num_steps: int = 0
    seconds: float = 0.0
    resumed_from: int | None = None
    final_elbo: float = math.nan
    final_elbo_stderr: float = math.nan
    graph_steps: int = 0

    def __repr__(self) -> str:
        last = f"{self.losses[-1]:.4g}" if self.losses else "none"
        return (f"FitResult(num_steps={self.num_steps}, final_elbo={self.final_elbo:.6g} "
                f"(se {self.final_elbo_stderr:.2g}), last loss={last}, "
                f"seconds={self.seconds:.1f}, resumed_from={self.resumed_from})")


def _check_arguments(model, X, y, num_steps, batch_size, lr, lr_decay, checkpoint_every):
    """Validate ``fit``'s arguments; returns ``(X, N, B)``, ``X`` a tensor or a stream
    (:func:`~pyro_dgp.datasets.stream.as_stream`). Sets the model's ``num_data``."""
    if not isinstance(X, torch.Tensor):
        X = as_stream(X, y)
    if isinstance(X, RowStream):
        N = check_stream(model, X)
    else:
        check_inputs(X)
        N = X.shape[-2]
        if y is None:
            raise ValueError("y is required when X is a tensor (y may be omitted only for a "
                             "stream or dataset, which holds the targets)")
        check_targets(y, N)
    check_positive_int(num_steps, "num_steps")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
    check_positive_int(checkpoint_every, "checkpoint_every")
    B = N if batch_size is None else min(batch_size, N)
    if hasattr(model, "num_data"):
        model.num_data = N
    if isinstance(X, RowStream):  # its rows are converted to the model's dtype and device
        return X, N, B
    if y.dtype != X.dtype or y.device != X.device:
        raise ValueError(f"y is {y.dtype} on {y.device} but X is {X.dtype} on {X.device}: give "
                         "both in the model's dtype and device")
    other = [(name, p) for name, p in model.named_parameters()
             if p.dtype != X.dtype or p.device != X.device]
    if other:
        listed = ", ".join(f"{name.removesuffix('_unconstrained')} ({p.dtype} on {p.device})"
                           for name, p in other[:4])
        raise ValueError(
            f"X is {X.dtype} on {X.device} but {len(other)} model parameter(s) are not: "
            f"{listed}; build the model from the same data or call model.to(...)"
        )
    return X, N, B


class _Training:
    """The state of one call of :func:`fit`: optimiser, random streams, checkpoint file."""

    def __init__(self, model, guide, elbo, batches: Batches, opt, params, generator, lr,
                 lr_decay, num_steps, path, natural: NaturalGradient | None = None,
                 parallel: DataParallel | None = None, seed: int = 0, cuda_graph: bool = False):
        self.model, self.guide, self.elbo, self.batches = model, guide, elbo, batches
        self.device = batches.device
        self.opt, self.params, self.generator = opt, params, generator
        self.lr, self.lr_decay, self.num_steps, self.path = lr, lr_decay, num_steps, path
        self.result = FitResult(num_steps=num_steps)
        self.start, self.seconds_before, self.t0 = 0, 0.0, time.perf_counter()
        self.last_good = None
        self.natural = natural
        # data-parallel: this process's part (infer/distributed.py); only process 0 writes
        self.parallel, self.seed = parallel, seed
        self.writer = parallel is None or parallel.writer
        # the step recorded as a CUDA graph after the first (validated, eager) step
        self.cuda_graph, self.graphed = cuda_graph, None

    def progress_label(self, loss_per_point: float) -> dict[str, str]:
        """The progress bar's figure: ``elbo/pt`` for an ELBO, ``loss/pt`` for an objective
        that is not one (the local alpha objective)."""
        if isinstance(self.elbo, LocalAlpha):
            return {"loss": f"{loss_per_point:.4f}/pt"}
        return {"elbo": f"{-loss_per_point:.4f}/pt"}

    def resume(self) -> None:
        """Continue from the checkpoint, if it exists (parameters, moments, streams, losses)."""
        if self.path is None:
            raise ValueError("resume=True needs a checkpoint path")
        state = None
        if self.writer and self.path.exists():
            state = safe_load(self.path, map_location=self.device)
        if self.parallel is not None:  # process 0's checkpoint, on every process
            state = self.parallel.broadcast_state(state, map_location=self.device)
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.guide.load_state_dict(state["guide"])
        self.opt.load_state_dict(state["optimizer"])
        for group in self.opt.param_groups:  # load_state_dict brought back the saved rate
            group["lr"] = self.lr  # (a decaying schedule sets each step's rate from lr)
        saved_lr = state.get("lr")
        if saved_lr is not None and saved_lr != self.lr and self.writer:
            warnings.warn(
                f"resuming with lr={self.lr}; the checkpoint was written with lr={saved_lr}: "
                "the run continues from its state at the new rate, not exactly",
                UserWarning, stacklevel=3)
        set_rng_state(state["rng"], self.generator, self.device)
        self.result.losses = list(state["losses"])
        self.start = self.result.resumed_from = int(state["step"])
        self.seconds_before = float(state.get("seconds", 0.0))
        self.batches.skip(self.start)

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
            "seconds": self.seconds_before + time.perf_counter() - self.t0,
        })

    def loss_and_grads(self, step: int, args) -> tuple[float, Exception | None]:
        """One evaluation of the objective and its gradient; ``(nan, error)`` where a Cholesky
        failure after the first step shows parameters gone non-finite."""
        # Pyro's validation (distribution arguments, the mean-field check, finiteness of layer
        # inputs and targets) runs on the first step only: model, guide and data shapes do not
        # change between steps, X and y were checked, and a NaN loss is caught by the caller.
        try:
            with pyro.validation_enabled(is_validation_enabled() and step == self.start):
                if self.natural is not None:
                    return self.natural.loss_and_grads(
                        lambda: self.elbo.differentiable_loss(self.model, self.guide, *args)), None
                if self.parallel is not None or hasattr(self.elbo, "differentiable_loss"):
                    # this process's part of the global objective (infer/distributed.py):
                    # its loss weighted B_r / B (1 in one process), so that the KL adds up
                    # to once
                    loss_t = self.batches.share * self.elbo.differentiable_loss(
                        self.model, self.guide, *args)
                    loss_t.backward()
                    return float(loss_t.detach()), None
                return float(self.elbo.loss_and_grads(self.model, self.guide, *args)), None
        except CholeskyError as err:
            if step == self.start and self.parallel is None:
                raise  # the starting parameters themselves: not a divergence
            # in a data-parallel run the other processes wait in the all-reduce: the NaN
            # reaches them there, and every process stops at this step
            return math.nan, err

    def graphed_loss_and_grads(self, args) -> tuple[float, Exception | None]:
        """:meth:`loss_and_grads` by a replay of the recorded step (recorded at the first
        call); a step whose loss is not finite is run again eagerly, where a failed Cholesky
        factor is retried with more jitter (a graph cannot retry: its factor is NaN)."""
        with pyro.validation_enabled(False):
            if self.graphed is None:
                try:
                    self.graphed = GraphedLoss(
                        lambda *a: self.elbo.differentiable_loss(self.model, self.guide, *a),
                        self.params, args)
                except GraphCaptureError as err:
                    warnings.warn(f"{err}; training goes on without it", UserWarning,
                                  stacklevel=5)
                    self.cuda_graph = False
                    self.opt.zero_grad()
                    return self.loss_and_grads(-1, args)
            if self.graphed.fits(*args):
                loss = float(self.graphed(*args))
                if math.isfinite(loss):
                    self.result.graph_steps += 1
                    return loss, None
            try:
                return float(self.graphed.eager(*args)), None
            except CholeskyError as err:
                return math.nan, err

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
            "graph", UserWarning, stacklevel=4)
        self.cuda_graph = False
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

    def step(self, step: int, step_rng) -> float:
        args = self.batches.draw(self.generator)
        if self.lr_decay != 1:
            for group in self.opt.param_groups:
                group["lr"] = self.lr * self.lr_decay ** (step / max(self.num_steps - 1, 1))
        if self.cuda_graph and step > self.start:
            loss, failure = self.graphed_loss_and_grads(args)
            if not math.isfinite(loss) and self.result.graph_steps:
                loss, failure = self.leave_graph(step, args)
        else:
            self.opt.zero_grad()
            if self.parallel is not None:
                self.parallel.step = step
                self.parallel.seed_step(self.seed, step)
            loss, failure = self.loss_and_grads(step, args)
        if self.parallel is not None:  # the gradient and loss of the global batch
            loss = self.parallel.all_reduce(self.params, loss)
            if failure is not None and step == self.start:
                raise failure  # the starting parameters themselves: not a divergence
        if not math.isfinite(loss):
            raise self.diverged(step, loss, failure, step_rng) from failure
        with torch.no_grad():
            for p, good in zip(self.params, self.last_good, strict=True):
                good.copy_(p)
        if self.natural is not None:
            self.natural.step()
        self.opt.step()
        self.result.losses.append(loss)
        return loss

    def run(self, progress: bool, checkpoint_every: int) -> FitResult:
        progress = progress and self.writer
        self.t0 = time.perf_counter()
        self.last_good = [p.detach().clone() for p in self.params]
        bar = tqdm(total=self.num_steps, initial=self.start, disable=not progress, desc="SVI",
                   leave=False)
        with side_stream(self.device) if self.cuda_graph else contextlib.nullcontext():
            return self._run(bar, progress, checkpoint_every)

    def _run(self, bar, progress: bool, checkpoint_every: int) -> FitResult:
        N, losses = self.batches.num_data, self.result.losses
        step, step_rng = self.start, None
        try:
            for step in range(self.start, self.num_steps):
                if self.path is not None:  # the generator's state: only for a checkpoint
                    step_rng = rng_state(self.generator, self.device)
                self.step(step, step_rng)
                if progress:
                    bar.update(1)
                    if step % 10 == 0:
                        recent = sum(losses[-50:]) / len(losses[-50:]) / N
                        bar.set_postfix(self.progress_label(recent))
                if self.path is not None and (step + 1) % checkpoint_every == 0:
                    self.save(step + 1)
            step = self.num_steps
        except (KeyboardInterrupt, PeerFailedError):
            # the step in flight is dropped; the run resumes from its start exactly (unless
            # the interrupt came between the update and the loss record). A lost peer stops
            # the step in its all-reduce, before any update: every process was at this state
            self.save(len(losses), step_rng if len(losses) == step else None)
            raise
        finally:
            bar.close()
        self.save(step)
        self.result.seconds = self.seconds_before + time.perf_counter() - self.t0
        return self.result


@user_errors_first
def fit(
    model, guide, X, y: torch.Tensor | None = None, *,
    num_steps: int = 1000,
    batch_size: int | None = None,
    lr: float = 0.01,
    objective="auto",
    num_particles: int = 1,
    seed: int | None = 0,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 500,
    resume: bool = False,
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    lr_decay: float = 1.0,
    final_elbo_particles: int = 8,
    threads: int | None = None,
    natural_gradient=None,
    alpha: float = 0.5, num_samples: int = 10, distributed: bool = False,
    cuda_graph: bool = False,
) -> FitResult:
    """Train ``guide`` (and the model's hyperparameters) by SVI.

    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets, on the model's device and dtype;
        or data read row by row, ``y`` omitted (:mod:`pyro_dgp.infer.batches`).
    :param batch_size: minibatch size B (``None``, or ``>= N``: full batch); the likelihood
        must be scaled by ``N / B``: a :class:`~pyro_dgp.DeepGP` does it through its
        ``num_data``, a hand-written model through its data plate
        (:mod:`pyro_dgp.infer.minibatch`; a model that does not is warned about).
    :param objective: a Pyro ELBO or a name (:func:`make_objective`); ``"alpha"``: the local
        alpha-divergence objective (:mod:`pyro_dgp.infer.alpha`), ``alpha`` in ``(0, 1]``,
        ``num_samples`` draws per point: a loss, not an ELBO (shown as ``loss/pt``).
    :param seed: seeds Pyro/torch/numpy and the minibatch stream (``None``: leave as is).
    :param checkpoint: file written every ``checkpoint_every`` steps, at the end, on
        divergence and on KeyboardInterrupt; ``resume=True`` continues from it exactly
        (parameters, optimizer moments, random streams, loss history).
    :param lr_decay: the last step's learning rate as a fraction of ``lr``:
        ``lr_t = lr * lr_decay ** (t / (num_steps - 1))`` (``1``: constant), a function of the
        step only, so a resumed run follows the same schedule.
    :param final_elbo_particles: draws of ``FitResult.final_elbo`` (0: not evaluated), from
        their own seeded stream: the global random state stays as training left it.
    :param natural_gradient: ``None``, or the step size ``gamma`` in ``(0, 1]`` (or a schedule
        ``step -> gamma``, :func:`~pyro_dgp.infer.natgrad.warmup_gamma`) of natural-gradient
        steps on the guide's Gaussian ``q(u)`` (:mod:`pyro_dgp.infer.natgrad`); the
        optimiser trains the rest. A resumed run resumes the schedule.
    :param threads: torch's intra-op threads during the fit (restored after); ``None``: on
        CPU by the problem's size (:func:`pyro_dgp.infer.threads.threads_for`: one thread for
        small problems, where more only spin), on other devices as is.
    :param distributed: data-parallel over torchrun's processes (:mod:`pyro_dgp.infer.distributed`).
    :param cuda_graph: on a GPU, record the objective's forward and backward pass as a CUDA
        graph after the first step and replay it (:mod:`pyro_dgp.infer.cuda_graph`): the
        kernels of a step are launched at once instead of one by one from Python. The same
        computation and random draws; Python state the model reads is frozen at the second
        step. For objectives with ``differentiable_loss``; not with ``natural_gradient`` or
        ``distributed``. A step that cannot be recorded warns and trains eagerly.
    :raises TrainingDivergedError: on a NaN/inf loss or a Cholesky failure (parameters gone
        non-finite), after restoring the last good parameters and writing the checkpoint.
    """
    X, N, B = _check_arguments(model, X, y, num_steps, batch_size, lr, lr_decay, checkpoint_every)
    check_guide_of(model, guide, "fit")
    _check_cuda_graph(cuda_graph, X, model, natural_gradient, distributed)
    batches, parallel = _batches(model, X, y, B, distributed, objective, natural_gradient)
    with num_threads(_threads(threads, model, batches, num_particles)):
        return _fit(model, guide, batches, parallel, num_steps=num_steps, lr=lr,
                    objective=objective, num_particles=num_particles, seed=seed,
                    progress=progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                    resume=resume, optimizer=optimizer, lr_decay=lr_decay, alpha=alpha,
                    final_elbo_particles=final_elbo_particles, num_samples=num_samples,
                    natural_gradient=natural_gradient, cuda_graph=cuda_graph)


def _check_cuda_graph(cuda_graph: bool, X, model, natural_gradient, distributed: bool) -> None:
    if not cuda_graph:
        return
    if natural_gradient is not None or distributed:
        what = "natural_gradient" if natural_gradient is not None else "distributed=True"
        raise ValueError(f"cuda_graph=True does not combine with {what}: its step runs "
                         "outside the objective's forward and backward pass")
    device = X.device if isinstance(X, torch.Tensor) else model_dtype_device(model)[1]
    if device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the data on a CUDA device; it is on {device}")


def _batches(model, X, y, B: int, distributed: bool, objective, natural_gradient):
    """``(Batches, DataParallel or None)``: the minibatches of this process (its part of each
    global batch of ``B`` rows, in a data-parallel run)."""
    dtype, device = ((X.dtype, X.device) if isinstance(X, torch.Tensor)
                     else model_dtype_device(model))
    parallel = for_fit(objective, natural_gradient, device) if distributed else None
    shard = None if parallel is None else parallel.shard(B)
    data = (X, y) if isinstance(X, torch.Tensor) else X
    return Batches(data, B, shard, dtype, device), parallel


def _threads(threads: int | None, model, batches: Batches, num_particles: int) -> int | None:
    """``threads``, else on CPU by the size of this process's step."""
    if threads is None and batches.device.type == "cpu":
        return threads_for(step_work(model, batches.local_size, num_particles))
    return threads


def _fit(model, guide, batches: Batches, parallel: DataParallel | None, *, num_steps, lr,
         objective, num_particles, seed, progress, checkpoint, checkpoint_every, resume,
         optimizer, lr_decay, final_elbo_particles, natural_gradient, alpha, num_samples,
         cuda_graph):
    """:func:`fit` after its checks, with its thread count set."""
    if parallel is not None:
        seed = parallel.common_seed(seed)
    if seed is not None:
        pyro.set_rng_seed(seed)
    # the minibatch stream: from the seed, else from torch's global stream (as is)
    generator = torch.Generator().manual_seed(
        seed if seed is not None else int(torch.randint(2**62, ()).item()))
    elbo = make_objective(objective, guide, num_particles, alpha=alpha, num_samples=num_samples)
    if cuda_graph and not hasattr(elbo, "differentiable_loss"):
        raise ValueError(f"cuda_graph=True needs an objective with differentiable_loss; "
                         f"{type(elbo).__name__} has none")
    X0, y0 = batches.first()
    with torch.no_grad():
        guide(X0, y0)  # creates lazily-built variational parameters
    if batches.local_size < batches.num_data:
        n = batches.local_size
        check_minibatch_scale(model, guide, X0[:n], y0[:n], batches.num_data)
    if parallel is not None:
        check_objective(elbo)
    params = parameters_of(model, guide)
    if parallel is not None:  # every process starts from process 0's parameters
        parallel.check_same_structure(params)
        parallel.broadcast([*params, *model.buffers(), *guide.buffers()])
    opt = make_optimizer(optimizer, params, lr)
    path = Path(checkpoint) if checkpoint is not None else None
    natural = None if natural_gradient is None else NaturalGradient(guide, natural_gradient)
    training = _Training(model, guide, elbo, batches, opt, params, generator, lr, lr_decay,
                         num_steps, path, natural, parallel, seed, cuda_graph)
    if resume:
        training.resume()
        if natural is not None:
            natural.num_steps = training.start
    result = training.run(progress, checkpoint_every)
    if final_elbo_particles:
        estimate = fit_elbo(model, guide, batches, final_elbo_particles,
                              0 if seed is None else seed, parallel)
        result.final_elbo, result.final_elbo_stderr = estimate.value, estimate.stderr
    return result
