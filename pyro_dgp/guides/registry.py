"""Guides by name, for the command line and the benchmark harness.

Most guides fit a model whose layers have global inducing outputs (``GPLayer``); the
amortized guides (:data:`LOCAL_INDUCING_GUIDES`) fit only a model of
``AmortizedGPLayer``\\ s, whose inducing outputs are one per data point (e.g.
:func:`~pyro_dgp.gp.avdgp.avdgp_regression`). :func:`make_guide` refuses a pairing that
does not fit, naming the guides that do.
"""

from __future__ import annotations

import torch
from pyro.infer import autoguide

from ..gp.layer import GPLayer
from .amortized import Amortized
from .chain import Chain
from .completed import complete, inducing_only
from .coupled import Coupled
from .meanfield import MeanField
from .mixture import Mixture
from .semi_implicit import SemiImplicit

__all__ = ["GUIDES", "LOCAL_INDUCING_GUIDES", "SEMI_IMPLICIT_GUIDES", "has_local_inducing",
           "make_guide"]

_AUTO = {
    "autonormal": autoguide.AutoNormal,
    "automvn": autoguide.AutoMultivariateNormal,
    "autolowrank": autoguide.AutoLowRankMultivariateNormal,
    "autoiaf": autoguide.AutoIAFNormal,
}

#: name -> the amortization rule of :class:`~pyro_dgp.guides.Amortized`
_AMORTIZED = {"amortized-ar1": "AR1", "amortized-ar2": "AR2", "amortized-ar2p": "AR2P",
              "amortized-ar2pp": "AR2PP"}

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
    "ssivi": "structured semi-implicit: neural mixing per layer, conditioned on the layer "
             "below (SSIVI)",
    "sivi": "semi-implicit over the same family with the looser SIVI bound",
    "ssivi-tril": "SSIVI whose components carry correlations: covariance T diag(sigma^2) T^T, "
                  "T learned per layer",
    "mixture": "a mixture of 4 mean-field Gaussians with learned weights, trained by the "
               "stratified ELBO (Morningstar et al. 2021)",
    "amortized-ar1": "amortized encoder per layer, per-point inducing points, own U per path "
                     "(AVDGP AR1; needs an AmortizedGPLayer model)",
    "amortized-ar2": "amortized, U shared by the paths at their mean input (AVDGP AR2; needs "
                     "an AmortizedGPLayer model)",
    "amortized-ar2p": "amortized, learned quadrature nodes and weights (AVDGP AR2P; needs an "
                      "AmortizedGPLayer model)",
    "amortized-ar2pp": "AR2P trained with the predictive objective (AVDGP AR2PP; needs an "
                       "AmortizedGPLayer model)",
}

#: the semi-implicit guides (no Gaussian ``q(u)``, no tractable ``log q``)
SEMI_IMPLICIT_GUIDES = frozenset({"ssivi", "sivi", "ssivi-tril"})

#: the guides that need a model of ``AmortizedGPLayer``\ s (and refuse any other)
LOCAL_INDUCING_GUIDES = frozenset(_AMORTIZED)


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


def _check_fits(name: str, model) -> None:
    local = has_local_inducing(model)
    if local is None or local == (name in LOCAL_INDUCING_GUIDES):
        return
    if local:
        raise ValueError(
            f"make_guide: the model's layers are AmortizedGPLayers (one u per data point), "
            f"which guide {name!r} does not support; choose one of "
            f"{sorted(LOCAL_INDUCING_GUIDES)}")
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
    if name not in GUIDES:
        raise ValueError(f"unknown guide {name!r}; choose from {sorted(GUIDES)}")
    _check_fits(name, model)
    if name in _AMORTIZED:
        return Amortized(model, rule=_AMORTIZED[name])
    if name in SEMI_IMPLICIT_GUIDES:
        return SemiImplicit(model, structured=name != "sivi",
                            component_scale="tril" if name == "ssivi-tril" else "diagonal")
    if name in _AUTO:
        return complete(_AUTO[name](inducing_only(model)), model)
    return {
        "meanfield": lambda: MeanField(model),
        "meanfield-sampled": lambda: MeanField(model, collapsed=False),
        "coupled": lambda: Coupled(model),
        "coupled-per-point": lambda: Coupled(model, per_point=True),
        "coupled-lowrank": lambda: Coupled(model, rank=10),
        "chain": lambda: Chain(model),
        "chain-per-point": lambda: Chain(model, per_point=True),
        "mixture": lambda: Mixture(model),
    }[name]()
