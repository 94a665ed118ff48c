"""Guides by name, for the command line and the benchmark harness."""

from __future__ import annotations

from pyro.infer import autoguide

from .complete import complete, inducing_only
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
    "autonormal": "Pyro AutoNormal over the inducing outputs, completed",
    "automvn": "Pyro AutoMultivariateNormal over all inducing outputs, completed",
    "autolowrank": "Pyro AutoLowRankMultivariateNormal, completed",
    "autoiaf": "Pyro AutoIAFNormal (normalising flow), completed",
}


def make_guide(name: str, model):
    """A fresh guide of ``model`` by name (see :data:`GUIDES`)."""
    if name == "meanfield":
        return MeanField(model)
    if name == "meanfield-sampled":
        return MeanField(model, collapsed=False)
    if name in _AUTO:
        return complete(_AUTO[name](inducing_only(model)), model)
    raise ValueError(f"unknown guide {name!r}; choose from {sorted(GUIDES)}")
