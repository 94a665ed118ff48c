"""``fit``: stochastic variational inference with minibatches, progress, checkpoints, resume."""

from __future__ import annotations

import os
from pathlib import Path

import pyro
import torch

from ..datasets.stream import RowStream, as_stream
from ..errors import user_errors_first
from ..rng import MAX_SEED
from ..validation import (
    check_inputs,
    check_positive_finite,
    check_positive_int,
    check_targets,
    labels_like,
)
from .batches import Batches, check_stream, model_dtype_device
from .chunked import fit_elbo
from .cuda_graph import check_graph_options
from .distributed import DataParallel, check_objective, for_fit
from .draws import check_guide_of
from .minibatch import check_minibatch_scale
from .natgrad import NaturalGradient
from .objectives import make_objective
from .optim import make_optimizer, parameters_of, warn_if_taken_from_store
from .threads import num_threads, step_work, threads_for
from .trainer import FitResult, Trainer, TrainingDivergedError

__all__ = ["FitResult", "TrainingDivergedError", "fit", "make_objective", "make_optimizer"]


def _check_options(lr, lr_decay, num_particles, seed, optimizer, final_elbo_particles,
                   threads) -> None:
    """Validate ``fit``'s settings, each error naming its argument, before anything is
    derived from them (the thread count from ``num_particles``)."""
    check_positive_finite(lr, "lr")
    if lr_decay is None or isinstance(lr_decay, bool | str | bytes):
        raise TypeError(f"lr_decay must be a number in (0, 1], got {lr_decay!r} (of type "
                        f"{type(lr_decay).__name__})")
    if not 0 < float(lr_decay) <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
    check_positive_int(num_particles, "num_particles")
    if seed is not None:
        check_positive_int(seed, "seed", upper=MAX_SEED, allow_zero=True)
    check_positive_int(final_elbo_particles, "final_elbo_particles", allow_zero=True)
    if threads is not None:
        check_positive_int(threads, "threads")
    if isinstance(optimizer, str | bytes) or not callable(optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer class such as torch.optim.Adam (or a "
            f"callable (params, lr=...) -> optimizer), got {optimizer!r} (of type "
            f"{type(optimizer).__name__})")


def _check_arguments(model, X, y, num_steps, batch_size, checkpoint_every):
    """Validate ``fit``'s data and sizes; returns ``(X, y, N, B)``, ``X`` a tensor or a stream
    (:func:`~pyro_dgp.datasets.stream.as_stream`), integer or boolean labels of a binary
    likelihood in ``X``'s dtype. Sets the model's ``num_data``."""
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
        if getattr(getattr(model, "likelihood", None), "binary", False):
            y = labels_like(y, X)
        check_targets(y, N)
    check_positive_int(num_steps, "num_steps")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    check_positive_int(checkpoint_every, "checkpoint_every")
    B = N if batch_size is None else min(batch_size, N)
    if hasattr(model, "num_data"):
        model.num_data = N
    if isinstance(X, RowStream):  # its rows are converted to the model's dtype and device
        return X, y, N, B
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
    return X, y, N, B


@user_errors_first
def fit(
    model, guide, X, y: torch.Tensor | None = None, *,
    num_steps: int = 1000, batch_size: int | None = None, lr: float = 0.01,
    objective="auto", num_particles: int = 1, seed: int | None = 0, progress: bool = True,
    checkpoint: str | os.PathLike | None = None, checkpoint_every: int = 500,
    resume: bool = False, optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    lr_decay: float = 1.0, final_elbo_particles: int = 8, threads: int | None = None,
    natural_gradient=None, alpha: float = 0.5, num_samples: int = 10,
    distributed: bool = False, cuda_graph: bool = False,
) -> FitResult:
    """Train ``guide`` (and the model's hyperparameters) by SVI.

    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets, on the model's device and dtype
        (labels of a binary likelihood may be integer or boolean: read in ``X``'s dtype);
        or data read row by row, ``y`` omitted (:mod:`pyro_dgp.infer.batches`).
    :param batch_size: minibatch size B (``None``, or ``>= N``: full batch); the likelihood
        must be scaled by ``N / B``: a :class:`~pyro_dgp.DeepGP` does it through its
        ``num_data``, a hand-written model through its data plate
        (:mod:`pyro_dgp.infer.minibatch`; a model that does not is warned about).
    :param objective: a Pyro ELBO or a name (:func:`make_objective`); ``"alpha"``: the local
        alpha-divergence objective (:mod:`pyro_dgp.infer.alpha`), ``alpha`` in ``(0, 1]``,
        ``num_samples`` draws per point: a loss, not an ELBO (shown as ``loss/pt``).
    :param seed: seeds Pyro/torch/numpy and the minibatch stream, in ``[0, 2**32 - 1]``
        (``None``: leave as is). :param optimizer: an Optimizer class (or ``(params, lr=)``).
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
    :param cuda_graph: on a GPU, replay each step after the first from a CUDA graph of the
        objective and its gradient: the same computation and draws, launched at once
        (:mod:`pyro_dgp.infer.cuda_graph`, which says what it needs).
    :raises TrainingDivergedError: on a NaN/inf loss or a Cholesky failure (parameters gone
        non-finite), after restoring the last good parameters and writing the checkpoint.
    """
    _check_options(lr, lr_decay, num_particles, seed, optimizer, final_elbo_particles, threads)
    X, y, N, B = _check_arguments(model, X, y, num_steps, batch_size, checkpoint_every)
    check_guide_of(model, guide, "fit")
    if cuda_graph:
        check_graph_options(X.device if isinstance(X, torch.Tensor) else
                            model_dtype_device(model)[1], natural_gradient, distributed)
    batches, parallel = _batches(model, X, y, B, distributed, objective, natural_gradient)
    with num_threads(_threads(threads, model, batches, num_particles)):
        return _fit(model, guide, batches, parallel, num_steps=num_steps, lr=lr,
                    objective=objective, num_particles=num_particles, seed=seed,
                    progress=progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                    resume=resume, optimizer=optimizer, lr_decay=lr_decay, alpha=alpha,
                    final_elbo_particles=final_elbo_particles, num_samples=num_samples,
                    natural_gradient=natural_gradient, cuda_graph=cuda_graph)


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
    own = dict(model.named_parameters())
    with torch.no_grad():
        guide(X0, y0)  # creates lazily-built variational parameters
    warn_if_taken_from_store(model, own)
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
    training = Trainer(model, guide, elbo, batches, opt, params, generator, lr, lr_decay,
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
