"""The typed records that tag a GP layer's two sites for guides, objectives and diagnostics.

Every :class:`~pyro_dgp.gp.layer.GPLayer` emits two Pyro sample sites (the contract of
``docs/design.md``):

- ``<layer>.u``, the inducing outputs, tagged with an :class:`InducingSite`;
- ``<layer>.f``, the function values at the layer's inputs (masked, inside the data plate),
  tagged with a :class:`FunctionSite` that holds what a guide needs to draw them: the layer,
  its inputs in this call and the ``u`` it received.

The record travels in ``msg["infer"]`` under one key (Pyro's channel for per-site metadata,
which ``poutine.replay`` carries from a guide's trace to the model's); read it with
:func:`inducing_site` and :func:`function_site`, never by the key.

A layer guide runs its own model, so the sites of its trace also name the guide that drew them
(:func:`drawn_site`). A model replayed on such a trace (``pyro.infer.SVI(model, guide)``,
``poutine.replay``) must be the guide's model: each layer checks that the record of its site in
the replayed trace is its own (:func:`check_replayed_guide`), and refuses a guide built for
another model, which would otherwise train that other model (its layers drew the values) or
fail later on a shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from pyro.poutine.replay_messenger import ReplayMessenger
from pyro.poutine.runtime import _PYRO_STACK

from ..validation import pyro_name

if TYPE_CHECKING:
    from .layer import GPLayer

__all__ = ["FunctionSite", "InducingSite", "check_replayed_guide", "drawn_by", "drawn_site",
           "function_site", "inducing_site", "layer_site", "tag"]

_KEY = "pyro_dgp_site"
_GUIDE_KEY = "pyro_dgp_guide"


@dataclass(frozen=True)
class InducingSite:
    """``<layer>.u``: inducing outputs of ``layer``, event shape ``(D_out, M)``."""

    layer: GPLayer


@dataclass(frozen=True)
class FunctionSite:
    """``<layer>.f``: function values of ``layer``, event shape ``(D_out,)``, per point.

    :ivar inputs: ``(..., N, D_in)`` the layer's inputs in this call.
    :ivar inducing: ``(..., D_out, M)`` the ``u`` the layer received in this call.
    :ivar given_u_only: ``u`` is also the next layer's inducing inputs, so a guide must draw
        ``f`` given a drawn ``u`` (a collapsed ``f`` would lose its link to that input).
    """

    layer: GPLayer
    inputs: torch.Tensor
    inducing: torch.Tensor
    given_u_only: bool = False


def tag(record: InducingSite | FunctionSite) -> dict:
    """The ``infer`` dict of a layer site carrying ``record``."""
    return {_KEY: record}


def layer_site(msg: dict) -> InducingSite | FunctionSite | None:
    """The record of a Pyro message or trace node, ``None`` for a site that is not a layer's."""
    return (msg.get("infer") or {}).get(_KEY)


def inducing_site(msg: dict) -> InducingSite | None:
    """The :class:`InducingSite` of a ``<layer>.u`` message or node, else ``None``."""
    record = layer_site(msg)
    return record if isinstance(record, InducingSite) else None


def function_site(msg: dict) -> FunctionSite | None:
    """The :class:`FunctionSite` of a ``<layer>.f`` message or node, else ``None``."""
    record = layer_site(msg)
    return record if isinstance(record, FunctionSite) else None


def drawn_site(msg: dict, guide) -> InducingSite | FunctionSite | None:
    """The record of a message (:func:`layer_site`); at a layer site, also records in it that
    ``guide`` (a guide running its own model, which it names as ``guide.model``) draws it."""
    record = layer_site(msg)
    if record is not None:
        msg["infer"][_GUIDE_KEY] = guide
    return record


def drawn_by(msg: dict):
    """The guide that drew a layer site of a guide's trace (:func:`drawn_site`), else
    ``None``."""
    return (msg.get("infer") or {}).get(_GUIDE_KEY)


def check_replayed_guide(layer: GPLayer, name: str) -> None:
    """Refuse to run ``layer`` (site prefix ``name``) on the draws of a layer guide built for
    another model, in every trace replayed around this call (a dictionary look-up per site
    and replayed trace).

    The layer's own site in the trace must carry a record of ``layer`` itself; where the trace
    has no site of this layer but sites a guide drew, ``layer`` must be a module of that
    guide's model (a model with other layers than the guide's).

    :raises TypeError: naming the guide, its model and this layer, and what to do.
    """
    for frame in _PYRO_STACK:
        if isinstance(frame, ReplayMessenger) and frame.trace is not None:
            _check_trace(layer, name, frame.trace.nodes)


def _check_trace(layer: GPLayer, name: str, nodes: dict) -> None:
    own = [nodes[site] for site in (f"{name}.u", f"{name}.f") if site in nodes]
    for node in own:
        record, guide = layer_site(node), drawn_by(node)
        if guide is not None and record is not None and record.layer is not layer:
            raise _other_model(guide, layer, name)
    if own:
        return
    # no site of this layer: a guide's model without it, or draws of global sites only
    guide = next((g for g in map(drawn_by, nodes.values()) if g is not None), None)
    model = None if guide is None else guide.model  # every guide of drawn_site has one
    if isinstance(model, torch.nn.Module) and not any(m is layer for m in model.modules()):
        raise _other_model(guide, layer, name)


def _describe(module) -> str:
    name = pyro_name(module)
    return f"{type(module).__name__} '{name}'" if name else f"a {type(module).__name__}"


def _other_model(guide, layer: GPLayer, name: str) -> TypeError:
    # a TypeError: Pyro's traces re-raise a ValueError with their shape tables appended
    return TypeError(
        f"{_describe(guide)}: this guide was built for the model {_describe(guide.model)}, but "
        "runs here with another model (pyro.infer.SVI(model, guide), or poutine.replay on its "
        f"trace), whose layer '{name}' is {_describe(layer)}: the guide's draws would train its "
        "own model, not this one. Build the guide on the model you pass to SVI: "
        "guides.MeanField(model); a copy of a model needs its guide copied or saved with it: "
        "copy.deepcopy((model, guide)), torch.save((model, guide), path), or state_dict() "
        "of each loaded into a freshly built pair.")
