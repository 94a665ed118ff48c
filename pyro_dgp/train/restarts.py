"""``fit(..., restarts=R)``: ``R`` independent fits of one model and guide from ``R`` seeds,
for :func:`pyro_dgp.stack` to combine into one mixture posterior: ``stack(restarts, X_val, y_val)``.

**Seeds.** Restart ``k`` runs from seed ``seed + k``, so restart 0 is exactly the plain
``fit(..., seed=seed)``; ``seed=None`` draws the first seed from torch's global random stream
(``Restarts`` records each restart's seed, so any one can be run again), and with
``resume=True`` lets each restart go on with its checkpoint's seed. Restarts differ by what
their seeds draw: minibatches, Monte Carlo draws and any initial values a guide draws when it
sets up (an autoguide's); a model and guide that start at fixed values start every restart
there.

**Copies.** Restart 0 trains the model and guide given, in place; restart ``k >= 1`` trains a
copy of the pair made before any training (:func:`independent_copy`): the model and guide
copied together, so the copied guide is a guide of the copied model, and every module renamed
(``DeepGP`` to ``DeepGP_restart``, ``DeepGP_restart_1``, ...). Pyro's global parameter store
holds parameters by module name, so a plain copy would read, and train, the original's
parameters; the renamed copies share nothing. Layer sites keep their names (``layer1.u``).
Sites of random hyperparameters (``PyroSample``) are named after their module, so a model
with any must come with a guide that has not run yet (it then sets up on its own copy).

**Processes.** ``jobs=1`` (the default) runs the restarts one after another; ``jobs=n`` runs
restart 0 here and the others in ``n - 1`` worker processes (spawned, one torch thread each
unless ``threads`` is given), which send back each trained pair's ``state_dict`` (read with
``torch.load(weights_only=True)``) and ``FitResult``; ``jobs="auto"`` takes one process per
CPU core the process may use, up to ``R`` (on a GPU: 1). The model, guide, data and options
travel to the workers by pickle, so they must be picklable (callbacks functions of a module,
not lambdas), and a script must start under ``if __name__ == "__main__":`` (each spawned
process imports it); with ``jobs > 1`` only restart 0 shows progress. A run with the same
thread count gives the same parameters in a worker as in this process. Each worker is a
fresh Python process that imports the package before it trains, so ``jobs > 1`` pays for
restarts that run long against that start, on cores that are otherwise idle.

**Checkpoints.** ``checkpoint`` must hold the field ``"{restart}"`` (``"fit-{restart}.pt"``),
replaced by each restart's number, so that no two restarts write one file; ``resume=True``
resumes each restart from its own file. ``distributed=True`` is refused (a data-parallel run
already uses every process).
"""

from __future__ import annotations

import copy
import os
import pickle

import pyro
import torch

from ..gp.layer import GPLayer, random_hyperparameters
from ..guides.draws import check_guide_of
from ..guides.protocol import protocol_of
from ..processes import process_count, run_here_and_in_workers, tensors_from_bytes, tensors_to_bytes
from ..rng import MAX_SEED
from ..validation import (
    check_positive_int,
    model_dtype_device,
    pyro_name,
    rename_pyro_module,
    unique_name,
)
from .result import Restart, Restarts

__all__ = ["RESTART_FIELD", "fit_restarts", "independent_copy", "restart_checkpoints",
           "restart_jobs", "restart_seeds"]

#: the field of ``checkpoint`` that each restart's number replaces
RESTART_FIELD = "{restart}"


def fit_restarts(fit, model, guide, X, y=None, *, restarts, jobs, seed, checkpoint, resume,
                 distributed, progress, threads, **options) -> Restarts:
    """``fit(model, guide, X, y, restarts=R, ...)`` (module docstring): ``R`` fits, restart
    ``k`` by ``fit(model_k, guide_k, X, y, seed=seed + k, checkpoint=<k's file>, ...)``."""
    if restarts is None:
        raise ValueError(f"jobs={jobs!r} sets the processes that train restarts: pass "
                         "restarts=R too (a single fit runs in this process)")
    R = check_positive_int(restarts, "restarts")
    if distributed:
        raise ValueError("restarts is not available with distributed=True (a data-parallel run "
                         "already uses every process): run the restarts one after another")
    workers = restart_jobs(jobs, R, model)
    seeds = restart_seeds(seed, R, resume)
    paths = restart_checkpoints(checkpoint, R)
    check_guide_of(model, guide, "fit")
    pairs = [(model, guide)] + [independent_copy(model, guide) for _ in range(R - 1)]
    runs = [dict(options, seed=s, checkpoint=p, resume=resume, progress=progress,
                 threads=threads) for s, p in zip(seeds, paths, strict=True)]
    if workers == 1:
        results = [fit(m, g, X, y, **run) for (m, g), run in zip(pairs, runs, strict=True)]
    else:
        results = _fit_in_workers(fit, pairs, X, y, runs, workers)
    return Restarts([Restart(m, g, r, s) for (m, g), r, s in
                     zip(pairs, results, seeds, strict=True)])


def restart_seeds(seed: int | None, restarts: int, resume: bool) -> list[int | None]:
    """``[seed, seed + 1, ..., seed + R - 1]``; for ``seed=None`` from a first seed drawn from
    torch's global stream, or, on resume, ``None`` each (each checkpoint's own seed)."""
    if seed is None:
        if resume:
            return [None] * restarts
        seed = int(torch.randint(MAX_SEED - restarts + 2, ()).item())
    seed = check_positive_int(seed, "seed", upper=MAX_SEED, allow_zero=True)
    if seed + restarts - 1 > MAX_SEED:
        raise ValueError(f"seed={seed} with restarts={restarts}: restart k runs from seed + k, "
                         f"which must stay at most {MAX_SEED}; give a smaller seed")
    return [seed + k for k in range(restarts)]


def restart_checkpoints(checkpoint, restarts: int) -> list[str | None]:
    """Each restart's checkpoint file: ``checkpoint`` with ``"{restart}"`` replaced by its
    number (``None``: none)."""
    if checkpoint is None:
        return [None] * restarts
    path = os.fspath(checkpoint)
    if RESTART_FIELD not in str(path):
        raise ValueError(f"checkpoint={str(path)!r} with restarts={restarts}: every restart "
                         f"would write that one file; put the field {RESTART_FIELD!r} in the "
                         "path (e.g. 'fit-{restart}.pt'), which each restart's number replaces")
    return [str(path).replace(RESTART_FIELD, str(k)) for k in range(restarts)]


def restart_jobs(jobs, restarts: int, model) -> int:
    """The number of processes that train: ``jobs``, or for ``"auto"`` one per usable CPU
    core up to ``restarts`` (1 for a model on a GPU); never more than ``restarts``."""
    return process_count(jobs, restarts, model_dtype_device(model)[1])


def independent_copy(model, guide) -> tuple:
    """``(model_copy, guide_copy)``: the pair copied together (``guide_copy.model is
    model_copy``), every ``PyroModule`` of both renamed to a name no module or stored
    parameter has, so that the copy's parameters in Pyro's store are its own; each GP layer
    keeps its site names.

    :raises ValueError: the model has random hyperparameters (``PyroSample``), whose site names
        would change, and the guide has already set up on the original's sites.
    """
    random = random_hyperparameters(model) if isinstance(model, torch.nn.Module) else {}
    if random and protocol_of(guide).is_set_up:
        raise ValueError(
            f"independent_copy (each restart of fit(restarts=R) but the first): the model has "
            f"random hyperparameters {random}, whose site names follow their module's name, "
            "which the copy's new name changes, and the guide has already run on the "
            "original's sites: pass a guide that has not run yet")
    model_copy, guide_copy = copy.deepcopy((model, guide))
    modules = _pyro_modules(model_copy, guide_copy)
    for module in modules:
        if isinstance(module, GPLayer):
            module.name_if_unnamed(module.name)  # the site names stay the original's
    taken = {name.partition(".")[0] for name in pyro.get_param_store().keys()}
    taken |= {pyro_name(m).partition(".")[0] for m in _pyro_modules(model, guide)}
    new_roots: dict[str, str] = {}
    for module in modules:
        root, dot, rest = pyro_name(module).partition(".")
        if root not in new_roots:
            new_roots[root] = _fresh_name(root or type(module).__name__, taken)
        rename_pyro_module(module, new_roots[root] + dot + rest)
    return model_copy, guide_copy


def _pyro_modules(*objects) -> list:
    """Every ``PyroModule`` of the module trees of ``objects`` (each once)."""
    found = {}
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for module in obj.modules():
                if isinstance(module, pyro.nn.PyroModule):
                    found.setdefault(id(module), module)
    return list(found.values())


def _fresh_name(base: str, taken: set[str]) -> str:
    """``<base>_restart``, ``<base>_restart_1``, ...: the first not in ``taken`` (added)."""
    name = unique_name(f"{base}_restart")
    while name in taken:
        name = unique_name(f"{base}_restart")
    taken.add(name)
    return name


def _fit_in_workers(fit, pairs: list[tuple], X, y, runs: list[dict], workers: int) -> list:
    """Restart 0 in this process, the others in ``workers - 1`` spawned processes; each
    worker's trained state is loaded into this process's copy of its pair."""
    payloads = [_payload(k, fit, m, g, X, y, dict(run, progress=False,
                                                   threads=run["threads"] or 1))
                for k, ((m, g), run) in enumerate(zip(pairs, runs, strict=True)) if k > 0]
    first, trained = run_here_and_in_workers(lambda: fit(*pairs[0], X, y, **runs[0]),
                                             _train_in_worker, payloads, workers)
    return [first] + [_load_trained(model, guide, X, y, *sent) for (model, guide), sent
                      in zip(pairs[1:], trained, strict=True)]


def _payload(k: int, fit, model, guide, X, y, run: dict) -> bytes:
    """Restart ``k``'s work for a worker, pickled here and now: by value (the tensors copied,
    not moved to shared memory under a restart this process trains meanwhile)."""
    try:
        return pickle.dumps((fit, model, guide, X, y, run), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(
            f"jobs > 1 sends restart {k}'s model, guide, data and options to a worker process "
            f"by pickle, which failed ({error}); define callbacks and validation functions at "
            "a module's top level (not lambdas or local functions), or pass jobs=1") from None


def _train_in_worker(payload: bytes) -> tuple:
    """In a worker process: one restart (:func:`_payload`); returns ``(model's state_dict,
    guide's state_dict, as bytes; FitResult; the model's num_data)``."""
    fit, model, guide, X, y, run = pickle.loads(payload)  # from this package's parent process
    result = fit(model, guide, X, y, **run)
    return (tensors_to_bytes(model.state_dict()), tensors_to_bytes(guide.state_dict()), result,
            getattr(model, "num_data", None))


def _load_trained(model, guide, X, y, model_state: bytes, guide_state: bytes, result,
                  num_data):
    """Load a worker's trained state into this process's copy; returns its ``FitResult``."""
    device = model_dtype_device(model)[1]
    if not protocol_of(guide).is_set_up and isinstance(X, torch.Tensor):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            guide(X[..., :1, :], y[:1])  # creates its lazily built parameters, then loaded
    for module, state in ((model, model_state), (guide, guide_state)):
        module.load_state_dict(tensors_from_bytes(state, map_location=device))
    if num_data is not None:
        model.num_data = num_data
    return result
