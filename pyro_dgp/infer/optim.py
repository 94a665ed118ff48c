"""The optimiser of :func:`~pyro_dgp.fit`: its parameters, its construction, and the repair of
its moments after a divergence."""

from __future__ import annotations

import warnings

import torch

__all__ = ["drop_non_finite_moments", "make_optimizer", "parameters_of", "warn_if_taken_from_store"]


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
