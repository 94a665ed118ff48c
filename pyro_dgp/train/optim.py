"""The optimiser of :func:`~pyro_dgp.fit`: its parameters, its construction, and the repair of
its moments after a divergence."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["DEFAULT_LR_DECAY", "LR_SCHEDULES", "LRSchedule", "drop_non_finite_moments", "lr_factor",
           "make_optimizer", "parameters_of", "resolve_lr_schedule", "warn_if_taken_from_store"]

#: the named shapes of ``fit``'s learning rate over a run (``lr_schedule``)
LR_SCHEDULES = ("cosine", "exponential", "constant")

#: the last step's learning rate as a fraction of ``lr`` when ``lr_decay`` is not given
DEFAULT_LR_DECAY = 0.1


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate over a run as a factor of ``lr``: a named ``shape`` down to ``decay``
    at the last step, or a function (:func:`lr_factor`)."""

    shape: str | Callable
    decay: float = 1.0

    def factor(self, step: int, num_steps: int) -> float:
        return lr_factor(self.shape, self.decay, step, num_steps)

    @property
    def name(self) -> str:
        """The shape's name, as a checkpoint records it (a function: ``function <its
        qualified name>``)."""
        if isinstance(self.shape, str):
            return self.shape
        return f"function {getattr(self.shape, '__qualname__', type(self.shape).__name__)}"

    @property
    def decays(self) -> bool:
        """Whether the rate depends on ``num_steps`` (a decay, or a function)."""
        return callable(self.shape) or (self.shape != "constant" and self.decay != 1)


def resolve_lr_schedule(lr_schedule, lr_decay) -> LRSchedule:
    """The :class:`LRSchedule` of ``fit``'s ``lr_schedule`` and ``lr_decay`` (each ``None``
    when not given; ``lr_decay`` already checked in ``(0, 1]``): neither given, a cosine
    decay to :data:`DEFAULT_LR_DECAY`; ``lr_decay`` alone, the exponential decay it has
    always meant; a named schedule alone, to :data:`DEFAULT_LR_DECAY` (``"constant"``: 1).

    :raises ValueError: an unknown name, or ``lr_decay`` beside a schedule it cannot shape
        (``"constant"``, or a function).
    :raises TypeError: an ``lr_schedule`` neither a name nor a function.
    """
    if lr_schedule is None:
        return LRSchedule("cosine", DEFAULT_LR_DECAY) if lr_decay is None else LRSchedule(
            "exponential", float(lr_decay))
    if callable(lr_schedule):
        if lr_decay is not None:
            raise ValueError("lr_decay shapes a named lr_schedule; a function lr_schedule "
                             "gives the whole schedule: leave lr_decay out")
        return LRSchedule(lr_schedule)
    if not isinstance(lr_schedule, str):
        raise TypeError(f"lr_schedule must be one of {LR_SCHEDULES} or a function (step, "
                        f"num_steps) -> factor of lr, got {lr_schedule!r} (of type "
                        f"{type(lr_schedule).__name__})")
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES} or a function (step, "
                         f"num_steps) -> factor of lr, got {lr_schedule!r}")
    if lr_schedule == "constant":
        if lr_decay not in (None, 1):
            raise ValueError(f"lr_schedule='constant' keeps lr at every step; lr_decay="
                             f"{lr_decay} would decay it: leave lr_decay out, or pick "
                             "'cosine' or 'exponential'")
        return LRSchedule("constant")
    return LRSchedule(lr_schedule, DEFAULT_LR_DECAY if lr_decay is None else float(lr_decay))


def lr_factor(schedule: str | Callable, decay: float, step: int, num_steps: int) -> float:
    """``lr_t / lr`` at ``step`` t of ``num_steps`` T, a function of the step only (a resumed
    run follows the schedule exactly), with ``p = t / (T - 1)`` and ``d = decay``:

    - ``"cosine"``: ``d + (1 - d) (1 + cos(pi p)) / 2`` (Loshchilov and Hutter 2017, without
      restarts): near ``lr`` for the first third, then down to ``d lr``, flat at both ends;
    - ``"exponential"``: ``d ** p``; ``"constant"``: 1;
    - a function: ``schedule(t, T)``, which must be positive and finite.
    """
    if callable(schedule):
        factor = schedule(step, num_steps)
        try:
            value = float(factor)
        except (TypeError, ValueError):
            raise TypeError(f"lr_schedule({step}, {num_steps}) returned {factor!r}; it must "
                            "return a number, the factor of lr at that step") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"lr_schedule({step}, {num_steps}) returned {value}; the factor "
                             "of lr must be positive and finite")
        return value
    if schedule == "constant" or decay == 1:
        return 1.0
    progress = step / max(num_steps - 1, 1)
    if schedule == "exponential":
        return decay ** progress
    return decay + (1 - decay) * (1 + math.cos(math.pi * progress)) / 2


def parameters_of(*modules) -> list[torch.nn.Parameter]:
    """The parameters of ``modules``, each once, in the modules' order (the same in every
    process that builds them alike)."""
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def warn_if_taken_from_store(model: torch.nn.Module,
                             before: dict[str, torch.Tensor]) -> None:
    """Warn where ``model``'s parameters are no longer the tensors ``before`` (its
    ``named_parameters()`` before its first run): a ``PyroModule`` whose parameter's name is
    already in Pyro's global parameter store takes the stored tensor in place of its own (a
    second instance of a hand-written model class, whose names are its attribute paths, takes
    the values the first one trained)."""
    taken = [name.removesuffix("_unconstrained") for name, p in model.named_parameters()
             if name in before and before[name] is not p]
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        warnings.warn(
            f"fit: {len(taken)} parameters of the model ({shown}) were taken from Pyro's "
            "parameter store, which already held their names (another model object of the "
            "same names?), so training starts from those values, not from the model's own. "
            "Call pyro.clear_param_store() before building the model, or name each instance "
            "apart (PyroModule(name=...)).", UserWarning, stacklevel=5)  # the user's fit


def drop_non_finite_moments(opt: torch.optim.Optimizer) -> None:
    """Zero the non-finite entries of an optimiser's state tensors (Adam's moments).

    A divergence is seen one step late: the update that made the parameters non-finite came
    from a non-finite gradient, which also entered the moments. The parameters are restored
    from the step before; the moments are not kept per step (a copy of the optimiser's state
    at every step would cost more than the parameters' own), so their poisoned entries restart
    from zero, as for a parameter that has not been updated yet, and a resumed run (at a
    smaller ``lr``, say) can go on."""
    for state in opt.state.values():
        for value in state.values():
            # every floating state, scalar parameters' 0-dim moments too (a step count is
            # finite: unchanged)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
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
