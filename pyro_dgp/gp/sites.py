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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .layer import GPLayer

__all__ = ["FunctionSite", "InducingSite", "function_site", "inducing_site", "layer_site",
           "tag"]

_KEY = "pyro_dgp_site"


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
