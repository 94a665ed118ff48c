"""Named initialisations of a DSVI deep GP for the initialisation study (``uci.py --init``).

Each entry gives the keyword arguments of :meth:`pyro_dgp.DeepGP.regression`, the
``inner_variance`` of :class:`pyro_dgp.guides.MeanField` (the initial ``q(u)`` variance of the
inner layers, whitened) and ``fit``'s ``lr_decay``. ``dsvi`` is the set-up of Salimbeni and
Deisenroth 2017; the others change one thing from it, except ``gpytorch``, the starting values
of GPyTorch's DeepGP example (``0.693 = softplus(0)`` for noise, kernel variance and
lengthscales; ``q(u) = N(0, I)`` in every layer; learned linear means), and ``narrow``,
GPyTorch's start with the inner layers' ``q(u)`` variance at 0.01 (the joint guides' start).
"""

from __future__ import annotations

DSVI = {"noise_variance": 0.01, "kernel_variance": 2.0, "lengthscale": 2.0, "ard": True,
        "train_mean": False, "inner_variance": 1e-5, "lr_decay": 1.0}

INITS = {
    "dsvi": {},
    "noise05": {"noise_variance": 0.05},
    "unit": {"kernel_variance": 1.0, "lengthscale": 1.0},
    "softplus0": {"noise_variance": 0.693, "kernel_variance": 0.693, "lengthscale": 0.693},
    "isotropic": {"ard": False},
    "trainmean": {"train_mean": True},
    "qprior": {"inner_variance": 1.0},
    "decay": {"lr_decay": 0.1},
    "gpytorch": {"noise_variance": 0.693, "kernel_variance": 0.693, "lengthscale": 0.693,
                 "train_mean": True, "inner_variance": 1.0},
}
INITS["narrow"] = {**INITS["gpytorch"], "inner_variance": 0.01}

#: the keys that are DeepGP.regression's
MODEL_KEYS = ("noise_variance", "kernel_variance", "lengthscale", "ard", "train_mean")


def resolve(name: str) -> dict:
    """Every knob of the initialisation ``name`` (``dsvi``'s where it keeps them)."""
    return {**DSVI, **INITS[name]}
