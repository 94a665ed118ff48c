"""Pyro's global parameter store and the library's unique names: the check that a guide and
its model read the parameters loaded into the store for them.

Every model and guide built without ``name=`` gets a name of its own in the process
(``DeepGP``, then ``DeepGP_1``...: ``docs/design.md``), and reads its parameters in Pyro's
global store under that name. A model and guide rebuilt in the same process get new names, so
``pyro.get_param_store().load(path)`` of the parameters an earlier pair trained restores
nothing into them: they read their own, new names and start from their initial values.

A guide checks for this when it sets up (:func:`check_store`): where the store held nothing
under the guide's (or its model's) own name, but holds, under another name, parameters of
exactly its layout (the same names below the module's, the same shapes) that no guide or model
of this process has read, those were loaded from a file for an earlier pair, and the guide
warns, naming the saved names and the ways to restore them. Every guide records at its set-up
the parameters it and its model read (the store's, where it holds their names), so a process
that fits one model after another without clearing the store is not warned, nor one that
restores a pair by its saved names and then builds another.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import pyro
import torch
from pyro.nn import PyroModule

from ..validation import pyro_name

__all__ = ["check_store", "stored_names", "unread_copies"]

#: ``id`` of every parameter tensor a guide or its model reads, with a weak reference to it
#: (tensors compare elementwise, so they cannot be members of a ``WeakSet``)
_READ: dict[int, weakref.ref] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    if _READ.get(key) is ref:
        del _READ[key]


def _remember_read(t: torch.Tensor) -> None:
    if not _was_read(t):
        _READ[id(t)] = weakref.ref(t, functools.partial(_forget, id(t)))


def _was_read(t: torch.Tensor) -> bool:
    ref = _READ.get(id(t))
    return ref is not None and ref() is t


def stored_names() -> set[str] | None:
    """The names in Pyro's global parameter store; ``None`` with module-local parameters
    (``pyro.settings`` ``module_local_params``: the store is not read)."""
    if pyro.settings.get("module_local_params"):
        return None
    return set(pyro.get_param_store().keys())


def _full_name(root: str, relative: str) -> str:
    return f"{root}.{relative}" if root else relative


def _layout(module) -> dict[str, torch.Size]:
    """``{name below the module's: shape}`` of a ``PyroModule``'s parameters as the store
    names them: ``named_parameters()`` gives a constrained ``PyroParam`` ``x`` as its tensor
    ``x_unconstrained``, which the store holds under ``<module's name>.x``."""
    return {name.removesuffix("_unconstrained"): p.shape for name, p in module.named_parameters()}


def unread_copies(module, stored: set[str]) -> list[str]:
    """The names other than ``module``'s own under which Pyro's parameter store holds, none of
    them read in this process, parameters of ``module``'s layout; empty where ``stored`` (the
    store's names before ``module`` first ran) held any under ``module``'s own name (it reads
    those), or for a module that is not a ``PyroModule``."""
    if not isinstance(module, PyroModule):
        return []
    root, layout = pyro_name(module), _layout(module)
    if not layout or any(_full_name(root, rel) in stored for rel in layout):
        return []
    params = dict(pyro.get_param_store().named_parameters())
    suffix = "." + next(iter(layout))
    others = sorted({name[:-len(suffix)] for name in params if name.endswith(suffix)} - {root})
    found = []
    for other in others:
        tensors = [(params.get(_full_name(other, rel)), shape) for rel, shape in layout.items()]
        if all(t is not None and t.shape == shape and not _was_read(t) for t, shape in tensors):
            found.append(other)
    return found


def _name_of(module) -> str:
    return pyro_name(module) if isinstance(module, PyroModule) else ""


def check_store(guide, stored: set[str] | None) -> None:
    """At the set-up of ``guide``, the store having held the names ``stored`` before (``None``:
    module-local parameters, no check): warn where the guide or its model will not read the
    parameters loaded into the store for an earlier pair of their layout (module docstring),
    then record the parameters they will read (the store's under their names, else their own)
    as read."""
    if stored is None:
        return
    _warn_if_not_restored(guide, stored)
    params = dict(pyro.get_param_store().named_parameters())
    for module in (guide, guide.model):
        if isinstance(module, PyroModule):
            for name, p in module.named_parameters():
                full = _full_name(pyro_name(module), name.removesuffix("_unconstrained"))
                _remember_read(params.get(full, p))


def _warn_if_not_restored(guide, stored: set[str]) -> None:
    model = guide.model
    saved = [(what, module, unread_copies(module, stored))
             for what, module in (("guide", guide), ("model", model))]
    saved = [(what, module, names) for what, module, names in saved if names]
    if not saved:
        return
    held = " and ".join(f"as its {what}'s under {_listed(names)}" if what == "model" else
                        f"as this guide's under {_listed(names)}" for what, _, names in saved)
    own = " and ".join(repr(_name_of(module)) for _, module, _ in saved)
    rebuild = " and ".join(f"the {what} with name={names[0]!r}" for what, _, names in saved)
    warnings.warn(
        f"{type(guide).__name__} {_name_of(guide)!r}: Pyro's parameter store holds parameters "
        f"that no model or guide of this process has read, laid out {held} (loaded with "
        "pyro.get_param_store().load?). pyro_dgp names every model and guide apart within a "
        f"process, and these read theirs under their own names ({own}), so they start from "
        "their initial values and the load restores nothing: rebuild "
        f"{rebuild}, or save and restore model.state_dict() and guide.state_dict() "
        "(pyro_dgp.train.save_fit and load_fit do both).",
        UserWarning, stacklevel=3)


def _listed(names: list[str]) -> str:
    return " or ".join(repr(n) for n in names)
