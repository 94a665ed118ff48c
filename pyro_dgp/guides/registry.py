"""Guides by name, for the command line and the benchmark harness."""

from __future__ import annotations

from pyro.infer import autoguide

from .chain import Chain
from .completed import complete, inducing_only
from .coupled import Coupled
from .meanfield import MeanField

__all__ = ["GUIDES", "make_guide"]

_AUTO = {
    "autonormal": autoguide.AutoNormal,
    "automvn": autoguide.AutoMultivariateNormal,
    "autolowrank": autoguide.AutoLowRankMultivariateNormal,
    "autoiaf": autoguide.AutoIAFNormal,
}

#: name -> one-line description
GUIDES = {
    "meanfield": "mean-field Gaussian per layer, collapsed estimator (DSVI)",
    "meanfield-sampled": "mean-field Gaussian per layer, sampled-u estimator",
    "coupled": "one Gaussian over all layers' inducing outputs (full covariance), last layer "
               "collapsed; per-point draws while N T^2 <= 1e9",
    "coupled-per-point": "coupled, always drawing the inducing outputs per data point",
    "coupled-lowrank": "one Gaussian over all layers, low-rank-plus-diagonal covariance",
    "chain": "chain-structured Gaussian q(u1) prod q(ul | ul-1), last layer collapsed; "
             "per-point draws while N T^2 <= 1e9",
    "chain-per-point": "chain, always drawing the inducing outputs per data point",
    "autonormal": "Pyro AutoNormal over the inducing outputs, completed",
    "automvn": "Pyro AutoMultivariateNormal over all inducing outputs, completed",
    "autolowrank": "Pyro AutoLowRankMultivariateNormal, completed",
    "autoiaf": "Pyro AutoIAFNormal (normalising flow), completed",
}


def make_guide(name: str, model):
    """A fresh guide of ``model`` by name (see :data:`GUIDES`)."""
    if not isinstance(name, str):
        raise TypeError(f"make_guide: name must be a str (one of {sorted(GUIDES)}), got "
                        f"{type(name).__name__}; the call is make_guide(name, model)")
    if name == "meanfield":
        return MeanField(model)
    if name == "meanfield-sampled":
        return MeanField(model, collapsed=False)
    if name == "coupled":
        return Coupled(model)
    if name == "coupled-per-point":
        return Coupled(model, per_point=True)
    if name == "coupled-lowrank":
        return Coupled(model, rank=10)
    if name == "chain":
        return Chain(model)
    if name == "chain-per-point":
        return Chain(model, per_point=True)
    if name in _AUTO:
        return complete(_AUTO[name](inducing_only(model)), model)
    raise ValueError(f"unknown guide {name!r}; choose from {sorted(GUIDES)}")
