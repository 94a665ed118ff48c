"""Guides by name, for the command line, saved fits and the benchmark harness.

Each family registers its names itself, in its own module of ``pyro_dgp/guides/families/``,
with :func:`register_guide`::

    @register_guide("meanfield-sampled", "mean-field, sampled-u estimator", collapsed=False)
    @register_guide("meanfield", "mean-field Gaussian per layer, collapsed estimator (DSVI)")
    class MeanField(LayerGuide): ...

(decorators apply from the bottom up, so the bottom name registers first). Most guides fit a
model whose layers have global inducing outputs (``GPLayer``); the families that declare
``supports_local_inducing`` (:data:`LOCAL_INDUCING_GUIDES`, the amortized guides) fit only a
model of ``AmortizedGPLayer``\\ s, whose inducing outputs are one per data point (e.g.
:func:`~pyro_dgp.gp.avdgp.avdgp_regression`). :func:`make_guide` refuses a pairing that does
not fit, naming the guides that do.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

import torch

from ..gp.layer import GPLayer

__all__ = ["GUIDES", "LOCAL_INDUCING_GUIDES", "SEMI_IMPLICIT_GUIDES", "GuideEntry",
           "entries", "has_local_inducing", "make_guide", "register_guide"]


@dataclass(frozen=True)
class GuideEntry:
    """One registered name: its one-line ``description``, its ``family`` (the
    :class:`~pyro_dgp.guides.LayerGuide` subclass it builds) and ``build``, ``model ->
    guide``."""

    name: str
    description: str
    family: type
    build: Callable


_ENTRIES: dict[str, GuideEntry] = {}

#: name -> one-line description, in the order the families registered them
GUIDES: dict[str, str] = {}


def register_guide(name: str, description: str, *, build: Callable | None = None, **options):
    """A class decorator that registers the family it decorates under ``name``:
    :func:`make_guide` then builds ``family(model, **options)``, or ``build(model)`` where
    given (e.g. a completed autoguide). Stack it for several names of one family.

    :raises ValueError: for a name registered already."""
    def register(family: type) -> type:
        if name in _ENTRIES:
            raise ValueError(f"register_guide: the name {name!r} is registered already "
                             f"(to {_ENTRIES[name].family.__name__})")
        maker = build if build is not None else (lambda model: family(model, **options))
        _ENTRIES[name] = GuideEntry(name, description, family, maker)
        GUIDES[name] = description
        return family
    return register


def entries() -> list[GuideEntry]:
    """Every registered name's :class:`GuideEntry`, in the order of registration."""
    return list(_ENTRIES.values())


class _Names(Set):
    """The registered names whose family declares a capability, read at each use (so the
    families registered after this module was imported are in it)."""

    def __init__(self, declares: Callable[[type], bool]):
        self.declares = declares

    def _names(self) -> list[str]:
        return [e.name for e in _ENTRIES.values() if self.declares(e.family)]

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"frozenset({sorted(self._names())})"

    @classmethod
    def _from_iterable(cls, names) -> frozenset[str]:
        return frozenset(names)


#: the guides that need a model of ``AmortizedGPLayer``\ s (and refuse any other): the
#: families that declare ``supports_local_inducing``
LOCAL_INDUCING_GUIDES: Set[str] = _Names(lambda family: family.supports_local_inducing)

#: the semi-implicit guides (no Gaussian ``q(u)``, no tractable ``log q``): the families
#: that declare ``tractable_log_q = False``
SEMI_IMPLICIT_GUIDES: Set[str] = _Names(lambda family: not family.tractable_log_q)


def has_local_inducing(model) -> bool | None:
    """Whether ``model``'s GP layers have per-point inducing outputs (``AmortizedGPLayer``):
    ``True`` or ``False`` for a ``torch.nn.Module`` with GP layers, ``None`` where that cannot
    be told (another callable, or no GP layer among its submodules)."""
    if not isinstance(model, torch.nn.Module):
        return None
    flags = [bool(getattr(m, "local_inducing", False)) for m in model.modules()
             if isinstance(m, GPLayer)]
    if not flags:
        return None
    return any(flags)


def _check_fits(entry: GuideEntry, model) -> None:
    local = has_local_inducing(model)
    if local is None or local == entry.family.supports_local_inducing:
        return
    name = entry.name
    if local:
        fitting = sorted(LOCAL_INDUCING_GUIDES)
        raise ValueError(
            f"make_guide: the model's layers are AmortizedGPLayers (one u per data point), "
            f"which guide {name!r} does not support; choose one of {fitting}")
    raise ValueError(
        f"make_guide: guide {name!r} needs a model of AmortizedGPLayers (per-point inducing "
        "points), e.g. pyro_dgp.gp.avdgp_regression(X, y) or 'pyro-dgp fit --model avdgp'; "
        f"this model's layers have global inducing outputs")


def make_guide(name: str, model):
    """A fresh guide of ``model`` by name (see :data:`GUIDES`).

    :raises ValueError: for an unknown name, or a guide that does not fit the model's kind
        of layers (:data:`LOCAL_INDUCING_GUIDES`)."""
    if not isinstance(name, str):
        raise TypeError(f"make_guide: name must be a str (one of {sorted(GUIDES)}), got "
                        f"{type(name).__name__}; the call is make_guide(name, model)")
    if name not in _ENTRIES:
        raise ValueError(f"unknown guide {name!r}; choose from {sorted(GUIDES)}")
    entry = _ENTRIES[name]
    _check_fits(entry, model)
    return entry.build(model)
