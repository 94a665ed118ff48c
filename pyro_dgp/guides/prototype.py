"""What a guide knows of a model: its GP layers, from one prototype run of the model."""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from ..gp.layer import GPLayer
from ..gp.sites import inducing_site, layer_site

__all__ = ["LayerSite", "example_args", "is_vectorising", "prototype_sites"]


class LayerSite:
    """What a guide knows of one layer: its ``.u`` site name and the layer module."""

    def __init__(self, name: str, layer: GPLayer, index: int, is_last: bool):
        self.name, self.layer, self.index, self.is_last = name, layer, index, is_last

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.layer.output_dim, self.layer.num_inducing])


def example_args(model) -> tuple:
    """Arguments for a prototype run of ``model`` before any data are seen: the model's own
    ``example_args()`` (a :class:`~pyro_dgp.DeepGP` gives one input row of zeros).

    :raises ValueError: naming the model where it has none.
    """
    method = getattr(model, "example_args", None)
    if method is None:
        raise ValueError(
            f"{type(model).__name__} has no example_args(): call the guide once with data "
            "(guide(X, y)) to create its parameters, or give the model an example_args() "
            "method returning arguments for one prototype run"
        )
    return tuple(method())


def is_vectorising(frame) -> bool:
    """Whether a plate frame only vectorises draws (particles, predictive samples)."""
    return frame.name.startswith("_") or frame.name == "num_particles_vectorized"


def prototype_sites(model, *args, **kwargs):
    """Trace ``model`` once, isolated from any enclosing handlers.

    :returns: ``(layer_sites, other_latents)``: the layers in the order the model samples their
        ``.u`` sites, and the names of other unobserved sites outside every plate.
    """
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    us = [(n, s) for n, s in trace.nodes.items() if s["type"] == "sample" and inducing_site(s)]
    if not us:
        raise ValueError("the model has no GP layer (no '<layer>.u' site): nothing to guide")
    layer_sites = [
        LayerSite(n, inducing_site(s).layer, i, i == len(us) - 1) for i, (n, s) in enumerate(us)
    ]
    others = [
        n
        for n, s in trace.nodes.items()
        if s["type"] == "sample"
        and layer_site(s) is None
        and not s["is_observed"]
        and not s["cond_indep_stack"]
        and not site_is_subsample(s)
    ]
    return layer_sites, others
