"""``fit``: stochastic variational inference with minibatches, progress, checkpoints, resume.

**Data.** ``X (N, D)`` and ``y (N,)`` tensors on the model's device and dtype (labels of a
binary likelihood may be integer or boolean: read in ``X``'s dtype); NumPy arrays in memory are
taken as tensors of their own dtype on the model's device (float64 stays float64); a memory
map, ``.npy`` paths or a torch dataset are read row by row, ``y`` omitted
(:mod:`pyro_dgp.train.batches`). A ``batch_size`` above ``N`` is warned (training is
full-batch). The likelihood must be scaled by ``N / B``: a :class:`~pyro_dgp.DeepGP` does it
through its ``num_data``, a hand-written model through its data plate
(:mod:`pyro_dgp.infer.minibatch`; a model that does not is warned about).

**Learning rate.** ``lr_schedule`` shapes the rate from ``lr`` at the first step to
``lr * lr_decay`` at the last (:func:`~pyro_dgp.train.optim.lr_factor`): ``"cosine"``,
``"exponential"`` (``lr * lr_decay ** (t / (num_steps - 1))``), ``"constant"``, or a function
``(step, num_steps) -> factor`` of ``lr``. The default is a cosine decay to a tenth of ``lr``:
at a constant rate Adam's steps keep the size ``lr`` to the end, and a fit near its optimum is
kicked out of it again and again (spikes of the loss); the decay lets it settle. ``lr_decay``
given alone keeps the exponential schedule it has always meant. The rate is a function of the
step only, so a resumed run follows it exactly.

**Checkpoints.** ``checkpoint`` is written every ``checkpoint_every`` steps, at the end, on
divergence and on KeyboardInterrupt; ``resume=True`` continues from it exactly (parameters,
optimizer moments, random streams, loss history, early stopping's state). With ``seed=None``
a resumed run takes the checkpoint's seed (that of the draws of a data-parallel run's steps,
of the final ELBO and of the validation loss), so it goes on as the run that wrote it.

**Watching a run.** ``progress=True`` draws a bar when stderr is a terminal and otherwise
prints a line every tenth of the run (a log file or a notebook gets no bar's redraws);
``progress=k`` a line every ``k`` steps. ``callbacks`` are called after every
``callback_every`` steps (and the last) with a :class:`~pyro_dgp.train.monitor.StepInfo`
(the step, its loss, the smoothed loss, the rate, the latest validation loss, the model and
guide); one that returns a true value stops the run there (``FitResult.stop_reason`` names
it; its checkpoint resumes from there). ``validation=(X_val, y_val)`` evaluates, every
``validate_every`` steps (default: 50 times a run) and at the end, the training objective per
point on the validation data (:func:`~pyro_dgp.train.monitor.validation_loss`: the held-out
expected negative log-likelihood plus ``KL / N``, from the same 8 draws each time), or
``validation=(model, guide) -> loss`` any score (lower is better; e.g. the predictive's NLL
``lambda m, g: -predict(m, g, X_val).log_prob(y_val).mean().item()``). After ``patience``
evaluations without a lower one the run stops (``None``: it runs on); either way the model and
guide end with the parameters of the best evaluation (``FitResult.best_step``,
``validation``, ``stopped_at``). A :class:`~pyro_dgp.train.monitor.TrainingInstabilityWarning`
says when the smoothed loss has risen far above its best (:mod:`pyro_dgp.train.monitor`).

**Other settings.** ``final_elbo_particles``: draws of ``FitResult.final_elbo``, from their
own seeded stream (the global random state stays as training left it). ``natural_gradient``:
``gamma`` in ``(0, 1]`` or a schedule ``step -> gamma``
(:func:`~pyro_dgp.infer.natgrad.warmup_gamma`) of natural-gradient steps on the guide's
Gaussian ``q(u)``; the optimiser trains the rest, and a resumed run resumes the schedule.
``threads``: torch's intra-op threads during the fit, restored after (``None``: on CPU by the
problem's size, at most ``torch.get_num_threads()``,
:func:`~pyro_dgp.train.threads.threads_for`). ``distributed``: data-parallel over torchrun's
processes (:mod:`pyro_dgp.train.distributed`; without validation or
callbacks). ``cuda_graph``: each step after the first replayed from a CUDA graph of the
objective and its gradient (:mod:`pyro_dgp.train.cuda_graph` says what it needs).

**Restarts.** ``restarts=R`` trains ``R`` independent fits of the model and guide, restart
``k`` from seed ``seed + k`` (restart 0 the plain fit, on the objects given; the others on
renamed copies that share no parameter), one after another or in ``jobs`` processes, and
returns :class:`~pyro_dgp.train.result.Restarts`, whose ``.stack(X_val, y_val)`` combines them
with :func:`pyro_dgp.stack` (:mod:`pyro_dgp.train.restarts`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pyro
import torch

from ..errors import user_errors_first
from ..guides.draws import check_guide_of
from ..infer.minibatch import check_minibatch_scale
from ..infer.natgrad import NaturalGradient
from ..infer.objectives import make_objective
from ..validation import model_dtype_device
from .batches import Batches
from .chunked import fit_elbo
from .cuda_graph import check_graph_options
from .distributed import DataParallel, check_objective, for_fit
from .fit_arguments import (
    check_arguments,
    check_options,
    check_progress,
    check_validation_scale,
    check_watchers,
)
from .monitor import (
    EarlyStopping,
    StepInfo,
    TrainingInstabilityWarning,
    Watchers,
    validation_loss,
)
from .optim import make_optimizer, parameters_of, resolve_lr_schedule, warn_if_taken_from_store
from .restarts import fit_restarts
from .result import FitResult, Restarts, TrainingDivergedError
from .threads import num_threads, step_work, threads_for
from .trainer import Trainer, resume_state

__all__ = ["FitResult", "StepInfo", "TrainingDivergedError", "TrainingInstabilityWarning", "fit",
           "make_objective", "make_optimizer"]



@user_errors_first(renamed={"num_samples": "num_particles"})
def fit(
    model, guide, X, y: torch.Tensor | None = None, *, num_steps: int = 1000,
    batch_size: int | None = None, lr: float = 0.01, objective="auto", seed: int | None = 0,
    num_particles: int | None = None, progress: bool | int = True, restarts: int | None = None,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 500, jobs: int | str = 1,
    resume: bool = False, optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    lr_schedule: str | Callable[[int, int], float] | None = None, lr_decay: float | None = None,
    final_elbo_particles: int = 8, threads: int | None = None, natural_gradient=None,
    alpha: float = 0.5, distributed: bool = False, cuda_graph=False,
    validation=None, patience: int | None = None, validate_every: int | None = None,
    callbacks: Sequence[Callable[[StepInfo], bool | None]] | None = None, callback_every: int = 1,
) -> FitResult | Restarts:
    """Train ``guide`` (and the model's hyperparameters) by SVI (module docstring: more).

    :param X: ``(N, D)`` inputs (a tensor, a NumPy array, or data read row by row);
        :param y: ``(N,)`` targets. :param batch_size: minibatch size B (``None``: N).
    :param objective: a Pyro ELBO or a name (:func:`make_objective`); ``"alpha"``: the local
        alpha-divergence objective with ``alpha`` (shown as ``loss/pt``). :param num_particles:
        draws per step and point (``None``: :func:`.objectives.default_num_particles`).
    :param seed: seeds Pyro/torch/numpy and the minibatch stream, in ``[0, 2**32 - 1]``
        (``None``: leave as is, or on resume the checkpoint's seed: the run goes on as it was).
    :param optimizer: an Optimizer class (or ``(params, lr=)``). :param checkpoint: a file
        written every ``checkpoint_every`` steps and more (module docstring); ``resume=True``.
    :param lr_schedule: ``"cosine"`` (default), ``"exponential"``, ``"constant"`` or
        ``(step, num_steps) -> factor``; :param lr_decay: the last step's rate over ``lr``.
    :param progress: a bar on a terminal, else a line every tenth of the run; ``k``: every k.
    :param validation: ``(X_val, y_val)`` or ``(model, guide) -> loss``: early stopping after
        ``patience`` evaluations (every ``validate_every`` steps) without a better one, the
        best parameters restored. :param callbacks: functions of a ``StepInfo``, every
        ``callback_every`` steps; a true return value stops the run.
    :param final_elbo_particles: draws of ``FitResult.final_elbo`` (0: not evaluated).
    :param natural_gradient: ``None``, or the step size ``gamma`` (or a schedule) of
        natural-gradient steps on the guide's Gaussian ``q(u)`` (:mod:`.natgrad`).
    :param threads: torch's intra-op threads during the fit (``None``: by the problem's size).
    :param distributed: data-parallel (:mod:`.distributed`). :param cuda_graph: on a GPU,
        replay each step from a CUDA graph (:mod:`.cuda_graph`).
    :param restarts: ``R`` fits from seeds ``seed + k``: :class:`Restarts` (:mod:`.restarts`);
        :param jobs: processes that train them (``"auto"``: by cores).
    :raises TrainingDivergedError: on a NaN/inf loss or a Cholesky failure, after restoring
        the last good parameters and writing the checkpoint.
    :warns TrainingInstabilityWarning: the smoothed loss rose far above its best (once a run).
    """
    if restarts is not None or jobs != 1:  # R fits from seeds seed, seed + 1, ...
        return fit_restarts(fit, **locals())
    objective, num_particles = check_options(objective, lr, lr_decay, num_particles, seed,
                                             optimizer, final_elbo_particles, threads, guide)
    schedule = resolve_lr_schedule(lr_schedule, lr_decay)
    X, y, N, B = check_arguments(model, X, y, num_steps, batch_size, checkpoint_every, objective)
    watch = check_watchers(model, X, validation, patience, validate_every, callbacks,
                           callback_every, progress, num_steps, distributed)
    check_guide_of(model, guide, "fit")
    _check_cuda_graph(cuda_graph, model, X, natural_gradient, distributed)
    batches, parallel = _batches(model, X, y, B, distributed, objective, natural_gradient)
    with num_threads(_threads(threads, model, batches, num_particles)):
        return _fit(model, guide, batches, parallel, num_steps=num_steps, lr=lr,
                    objective=objective, num_particles=num_particles, seed=seed,
                    progress=progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                    resume=resume, optimizer=optimizer, schedule=schedule, alpha=alpha,
                    final_elbo_particles=final_elbo_particles, cuda_graph=cuda_graph,
                    natural_gradient=natural_gradient, watchers=watch)


def _check_cuda_graph(cuda_graph, model, X, natural_gradient, distributed: bool) -> None:
    if cuda_graph:
        check_graph_options(X.device if isinstance(X, torch.Tensor) else
                            model_dtype_device(model)[1], natural_gradient, distributed)


def _watchers(model, guide, elbo, batches: Batches, seed, progress, validation, patience,
              validate_every, callbacks, callback_every) -> Watchers:
    """What the run calls besides its steps (:class:`~pyro_dgp.train.monitor.Watchers`)."""
    stopping = None
    if validation is not None:
        if callable(validation):
            def score():
                return validation(model, guide)
        else:
            X_val, y_val = validation
            seed = 0 if seed is None else seed

            def score():
                return validation_loss(model, guide, elbo, X_val, y_val, batches.num_data, seed)

            def check():
                check_validation_scale(model, guide, X_val, y_val, batches.num_data)
        stopping = EarlyStopping(score, validate_every,
                                 math.inf if patience is None else patience, model, guide,
                                 check=None if callable(validation) else check)
    return Watchers(callbacks, callback_every, stopping, check_progress(progress))


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
         optimizer, schedule, final_elbo_particles, natural_gradient, alpha,
         cuda_graph, watchers):
    """:func:`fit` after its checks, with its thread count set."""
    path = Path(checkpoint) if checkpoint is not None else None
    state = resume_state(path, batches.device, parallel) if resume else None
    if seed is None and state is not None and state.get("seed") is not None:
        seed = int(state["seed"])  # the resumed run goes on with its random streams' seed
    if parallel is not None:
        seed = parallel.common_seed(seed)
    if seed is not None:
        pyro.set_rng_seed(seed)
    # the minibatch stream: from the seed, else from torch's global stream (as is)
    generator = torch.Generator().manual_seed(
        seed if seed is not None else int(torch.randint(2**62, ()).item()))
    elbo = make_objective(objective, guide, num_particles, alpha=alpha)
    if cuda_graph and not hasattr(elbo, "differentiable_loss"):
        raise ValueError(f"cuda_graph=True needs an objective with differentiable_loss; "
                         f"{type(elbo).__name__} has none")
    X0, y0 = batches.first()
    own = dict(model.named_parameters())
    with torch.no_grad():
        guide(X0, y0)  # creates lazily-built variational parameters
    warn_if_taken_from_store(model, own)
    if batches.local_size < batches.num_data:
        n = batches.local_size
        check_minibatch_scale(model, guide, X0[:n], y0[:n], batches.num_data)
    watching = _watchers(model, guide, elbo, batches, seed, progress, *watchers)
    if watching.early_stopping is not None:
        watching.early_stopping.check()
    if parallel is not None:
        check_objective(elbo)
    params = parameters_of(model, guide)
    if parallel is not None:  # every process starts from process 0's parameters
        parallel.check_same_structure(params)
        parallel.broadcast([*params, *model.buffers(), *guide.buffers()])
    opt = make_optimizer(optimizer, params, lr)
    natural = None if natural_gradient is None else NaturalGradient(guide, natural_gradient)
    training = Trainer(model, guide, elbo, batches, opt, params, generator, lr, schedule,
                       num_steps, path, natural, parallel, seed, cuda_graph, watching)
    if resume:
        training.resume(state)
        if natural is not None:
            natural.num_steps = training.start
    result = training.run(checkpoint_every)
    if final_elbo_particles:
        estimate = fit_elbo(model, guide, batches, final_elbo_particles,
                              0 if seed is None else seed, parallel)
        result.final_elbo, result.final_elbo_stderr = estimate.value, estimate.stderr
    return result
