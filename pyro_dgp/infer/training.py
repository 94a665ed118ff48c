"""``fit``: stochastic variational inference with minibatches, progress, checkpoints, resume."""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import torch
from pyro.infer import ELBO, RenyiELBO, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.util import is_validation_enabled
from tqdm.auto import tqdm

from ..guides.base import LayerGuide
from ..linalg import CholeskyError
from ..validation import check_inputs, check_positive_int, check_targets
from .elbo import AnalyticKL_ELBO
from .importance import RenyiELBO as ImportanceRenyiELBO

__all__ = ["FitResult", "TrainingDivergedError", "fit", "make_objective", "make_optimizer"]


class TrainingDivergedError(FloatingPointError):
    """The loss became NaN or inf; the parameters were restored to the last good step."""


@dataclass
class FitResult:
    """``losses[k]`` is the negative ELBO estimate (objective) at step k (full-data scale);
    ``seconds`` the wall time of the run's steps, those of the calls it resumed included."""

    losses: list[float] = field(default_factory=list)
    num_steps: int = 0
    seconds: float = 0.0
    resumed_from: int | None = None

    @property
    def final_elbo(self) -> float:
        """Mean of the last 10% of the ELBO estimates (at least one)."""
        tail = self.losses[-max(1, len(self.losses) // 10) :]
        return -sum(tail) / len(tail)


_OBJECTIVES = {
    "elbo": lambda p, v: Trace_ELBO(num_particles=p, vectorize_particles=v, max_plate_nesting=1),
    "meanfield": lambda p, v: AnalyticKL_ELBO(
        num_particles=p, vectorize_particles=v, max_plate_nesting=1
    ),
    "renyi": lambda p, v: ImportanceRenyiELBO(alpha=0.5, num_particles=max(p, 2),
                                              vectorize_particles=v, max_plate_nesting=1),
}


def make_objective(objective, guide, num_particles: int = 1) -> ELBO:
    """An ELBO instance from a name (``"auto"``, ``"elbo"``, ``"meanfield"``, ``"renyi"``) or
    an instance (returned as is, except that Pyro's ``RenyiELBO`` becomes
    :class:`pyro_dgp.importance.RenyiELBO` with the same settings: exact per-draw weights).
    ``"auto"`` is ``"meanfield"`` for guides that factorise like the prior, else ``"elbo"``
    (Trace_ELBO). ``"meanfield"`` is :class:`~pyro_dgp.elbo.AnalyticKL_ELBO`:
    TraceMeanField_ELBO's estimator (analytic KL), without the log-densities it discards.
    ``"renyi"`` is :class:`pyro_dgp.importance.RenyiELBO` (alpha 0.5)."""
    if isinstance(objective, ELBO):
        if isinstance(objective, TraceMeanField_ELBO):
            _warn_mean_field(guide)
        if isinstance(objective, RenyiELBO):
            _check_per_draw_weights(guide)
            if not isinstance(objective, ImportanceRenyiELBO):
                # the same settings, evaluated with exact per-draw weights (pyro_dgp.importance)
                objective = ImportanceRenyiELBO(
                    alpha=objective.alpha, num_particles=objective.num_particles,
                    max_plate_nesting=objective.max_plate_nesting,
                    vectorize_particles=objective.vectorize_particles)
        return objective
    num_particles = check_positive_int(num_particles, "num_particles")
    if objective == "auto":
        objective = "meanfield" if getattr(guide, "mean_field", False) else "elbo"
    if objective not in _OBJECTIVES:
        raise ValueError(
            f"objective must be a pyro ELBO or one of {['auto', *_OBJECTIVES]}, got {objective!r}"
        )
    if objective == "meanfield":
        _warn_mean_field(guide)
    if objective == "renyi":
        _check_per_draw_weights(guide)
    return _OBJECTIVES[objective](num_particles, num_particles > 1)


def _check_per_draw_weights(guide) -> None:
    if isinstance(guide, LayerGuide) and not guide.per_draw_weights:
        raise ValueError(
            f"RenyiELBO needs each draw's importance weight, which {type(guide).__name__} does "
            "not give (it draws f from a collapsed marginal, not given the sampled u, or scores "
            "u by a closed-form KL): the result would not be a bound on log p(y). Use "
            "MeanField(model, collapsed=False) (guide 'meanfield-sampled') or a completed "
            "autoguide (guides.complete; 'autonormal', 'automvn', ...), or the ELBO"
        )


def _warn_mean_field(guide) -> None:
    if not getattr(guide, "mean_field", False):
        warnings.warn(
            f"TraceMeanField_ELBO assumes a guide that factorises like the model; "
            f"{type(guide).__name__} does not declare that (its analytic KL terms may be "
            "wrong); use Trace_ELBO",
            UserWarning,
            stacklevel=3,
        )


def _parameters(*modules) -> list[torch.nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _drop_non_finite_moments(opt: torch.optim.Optimizer) -> None:
    """Zero the non-finite entries of an optimiser's state tensors (Adam's moments).

    A divergence is seen one step late: the update that made the parameters non-finite came
    from a non-finite gradient, which also entered the moments. The parameters are restored
    from the step before; the moments are not kept per step (a copy of the optimiser's state
    at every step would cost more than the parameters' own), so their poisoned entries restart
    from zero, as for a parameter that has not been updated yet, and a resumed run (at a
    smaller ``lr``, say) can go on."""
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim():
                torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)


def make_optimizer(optimizer: type[torch.optim.Optimizer], params, lr: float):
    """``optimizer(params, lr=lr)``; for Adam and AdamW the fused implementation (one kernel
    over all parameters) where this torch supports it on the parameters' device, instead of
    a Python loop over the parameter tensors."""
    if optimizer in (torch.optim.Adam, torch.optim.AdamW):
        try:
            return optimizer(params, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):  # older torch, or a device without it
            pass
    return optimizer(params, lr=lr)


def _rng_state(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step draws from: Pyro's (torch CPU, Python, NumPy), the
    minibatch generator's and, for data on a GPU, that GPU's (the guides draw there)."""
    state = {"pyro": pyro.util.get_rng_state(), "batches": generator.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, generator: torch.Generator, device: torch.device) -> None:
    # generator states must be CPU byte tensors, whatever map_location moved them to
    pyro_state = dict(state["pyro"], torch=state["pyro"]["torch"].cpu())
    pyro.util.set_rng_state(pyro_state)
    generator.set_state(state["batches"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _save(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written checkpoint


def fit(
    model,
    guide,
    X: torch.Tensor,
    y: torch.Tensor,
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
) -> FitResult:
    """Train ``guide`` (and the model's hyperparameters) by SVI.

    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets, on the model's device and dtype.
    :param batch_size: minibatch size B (``None``: full batch); the likelihood is scaled by
        ``N / B`` through the model's ``num_data``.
    :param objective: a Pyro ELBO instance or a name, see :func:`make_objective`.
    :param seed: seeds Pyro/torch/numpy and the minibatch stream (``None``: leave as is).
    :param checkpoint: file written every ``checkpoint_every`` steps, at the end, on
        divergence and on KeyboardInterrupt; ``resume=True`` continues from it exactly
        (parameters, optimizer moments, random streams, loss history).
    :param lr_decay: the learning rate at the last step as a fraction of ``lr``, reached by
        exponential decay over steps ``t = 0 .. num_steps - 1``,
        ``lr_t = lr * lr_decay ** (t / (num_steps - 1))`` (``1``: constant). A
        function of the step only, so a resumed run follows the same schedule.
    :raises TrainingDivergedError: on a NaN/inf loss or a Cholesky failure (parameters gone
        non-finite), after restoring the last good parameters and writing the checkpoint.
    """
    check_inputs(X)
    N = X.shape[-2]
    check_targets(y, N)
    num_steps = check_positive_int(num_steps, "num_steps")
    if batch_size is not None:
        batch_size = check_positive_int(batch_size, "batch_size")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
    checkpoint_every = check_positive_int(checkpoint_every, "checkpoint_every")
    B = N if batch_size is None else min(batch_size, N)
    if B < N:
        if not hasattr(model, "num_data"):
            raise ValueError(
                "minibatching needs a model with a num_data attribute that scales its "
                "likelihood (pyro.plate subsampling); pass batch_size=None for full batches"
            )
    if hasattr(model, "num_data"):
        model.num_data = N
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

    if seed is not None:
        pyro.set_rng_seed(seed)
    # the minibatch stream: from the seed, else from torch's global stream (as is)
    generator = torch.Generator().manual_seed(
        seed if seed is not None else int(torch.randint(2**62, ()).item()))
    elbo = make_objective(objective, guide, num_particles)
    with torch.no_grad():
        guide(X[:B], y[:B])  # creates lazily-built variational parameters
    params = _parameters(model, guide)
    opt = make_optimizer(optimizer, params, lr)

    result = FitResult(num_steps=num_steps)
    start, seconds_before = 0, 0.0
    path = Path(checkpoint) if checkpoint is not None else None
    if resume:
        if path is None:
            raise ValueError("resume=True needs a checkpoint path")
        if path.exists():
            state = torch.load(path, map_location=X.device, weights_only=False)
            model.load_state_dict(state["model"])
            guide.load_state_dict(state["guide"])
            opt.load_state_dict(state["optimizer"])
            for group in opt.param_groups:  # load_state_dict brought back the saved rate
                group["lr"] = lr  # (a decaying schedule sets each step's rate from lr below)
            saved_lr = state.get("lr")
            if saved_lr is not None and saved_lr != lr:
                warnings.warn(
                    f"resuming with lr={lr}; the checkpoint was written with lr={saved_lr}: "
                    "the run continues from its state at the new rate, not exactly",
                    UserWarning, stacklevel=2)
            _set_rng_state(state["rng"], generator, X.device)
            result.losses = list(state["losses"])
            start = result.resumed_from = int(state["step"])
            seconds_before = float(state.get("seconds", 0.0))

    def save(step: int, rng: dict | None = None) -> None:
        """Checkpoint at the start of ``step``; ``rng``: the random state there, if the
        streams have moved on since (a step cut short by an interrupt or a NaN)."""
        if path is not None:
            _save(path, {
                "step": step,
                "model": model.state_dict(),
                "guide": guide.state_dict(),
                "optimizer": opt.state_dict(),
                "rng": rng if rng is not None else _rng_state(generator, X.device),
                "losses": result.losses,
                "lr": lr,
                "seconds": seconds_before + time.perf_counter() - t0,
            })

    differentiable = hasattr(elbo, "differentiable_loss")
    validate = is_validation_enabled()
    t0 = time.perf_counter()
    last_good = [p.detach().clone() for p in params]
    bar = tqdm(total=num_steps, initial=start, disable=not progress, desc="SVI", leave=False)
    step = start
    step_rng = None
    try:
        for step in range(start, num_steps):
            if path is not None:  # the generator's state: only where a checkpoint needs it
                step_rng = _rng_state(generator, X.device)
            if B < N:
                idx = torch.randperm(N, generator=generator)[:B].to(X.device)
                args = (X[idx], y[idx])
            else:
                args = (X, y)
            if lr_decay != 1:
                for group in opt.param_groups:
                    group["lr"] = lr * lr_decay ** (step / max(num_steps - 1, 1))
            opt.zero_grad()
            # Pyro's validation (distribution arguments, the mean-field check, finiteness of
            # layer inputs and targets) runs on the first step only: model, guide and data
            # shapes do not change between steps, X and y were checked above, and a NaN loss
            # is caught below. Its checks would run again at every step.
            failure = None
            try:
                with pyro.validation_enabled(validate and step == start):
                    if differentiable:
                        loss_t = elbo.differentiable_loss(model, guide, *args)
                        loss_t.backward()
                        loss = float(loss_t.detach())
                    else:
                        loss = float(elbo.loss_and_grads(model, guide, *args))
            except CholeskyError as err:
                if step == start:  # the starting parameters themselves: not a divergence
                    raise
                loss, failure = math.nan, err  # parameters gone non-finite show up here first
            if not math.isfinite(loss):
                with torch.no_grad():
                    for p, good in zip(params, last_good, strict=True):
                        p.copy_(good)
                    _drop_non_finite_moments(opt)
                save(step, step_rng)
                what = f"the loss became {loss}" if failure is None else f"{failure}"
                raise TrainingDivergedError(
                    f"{what} at step {step}; the parameters were restored to their last values "
                    f"with a finite loss. Try a smaller lr (now {lr}), float64 data, or more "
                    "jitter."
                ) from failure
            with torch.no_grad():
                for p, good in zip(params, last_good, strict=True):
                    good.copy_(p)
            opt.step()
            result.losses.append(loss)
            if progress:
                bar.update(1)
                if step % 10 == 0:
                    recent = result.losses[-50:]
                    bar.set_postfix(elbo=f"{-sum(recent) / len(recent) / N:.4f}/pt")
            if path is not None and (step + 1) % checkpoint_every == 0:
                save(step + 1)
        step = num_steps
    except KeyboardInterrupt:
        # the step in flight is dropped; the rest of the run resumes from its start exactly
        # (unless the interrupt came between the update and the loss record)
        interrupted = len(result.losses)
        save(interrupted, step_rng if interrupted == step else None)
        raise
    finally:
        bar.close()
    save(step)
    result.seconds = seconds_before + time.perf_counter() - t0
    return result
