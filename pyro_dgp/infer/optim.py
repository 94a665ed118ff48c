"""The optimiser of :func:`~pyro_dgp.fit`: its parameters, its construction, and the repair of
its moments after a divergence."""

from __future__ import annotations

import torch

__all__ = ["drop_non_finite_moments", "make_optimizer", "parameters_of"]


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
