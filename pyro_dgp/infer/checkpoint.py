"""Checkpoints of a run (random streams, atomic writes) and saved fits of a model with its
guide."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pyro
import torch

from ..gp.avdgp import avdgp_regression
from ..gp.deep_gp import DeepGP
from ..guides.registry import make_guide

__all__ = ["ARCHITECTURES", "atomic_save", "load_fit", "model_from_config", "rng_state",
           "safe_load", "save_fit", "set_rng_state"]

#: the builders a saved fit names under ``config["model"]["architecture"]`` (default
#: ``"dsvi"``): ``DeepGP.regression`` (``classification`` with ``"task"``), or the amortized
#: architecture of Meng and Zhang 2024 (:func:`~pyro_dgp.gp.avdgp.avdgp_regression`)
ARCHITECTURES = ("dsvi", "avdgp")


def rng_state(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step draws from: Pyro's (torch CPU, Python, NumPy), the
    minibatch generator's and, for data on a GPU, that GPU's (the guides draw there)."""
    pyro_state = pyro.util.get_rng_state()
    # NumPy's state holds an array: stored as a tensor, so the file loads with weights_only
    name, keys, pos, has_gauss, cached = pyro_state["numpy"]
    pyro_state["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    state = {"pyro": pyro_state, "batches": generator.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, generator: torch.Generator, device: torch.device) -> None:
    # generator states must be CPU byte tensors, whatever map_location moved them to
    name, keys, pos, has_gauss, cached = state["pyro"]["numpy"]
    numpy_state = (name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached)
    pyro_state = dict(state["pyro"], torch=state["pyro"]["torch"].cpu(), numpy=numpy_state)
    pyro.util.set_rng_state(pyro_state)
    generator.set_state(state["batches"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def atomic_save(path: Path, payload: dict) -> None:
    """``torch.save`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written checkpoint


def safe_load(path: str | os.PathLike, map_location=None) -> dict:
    """``torch.load`` of a checkpoint or saved fit with ``weights_only=True``: tensors, numbers,
    strings and plain containers only, so a file from someone else cannot run code.

    :raises ValueError: naming the file, when it holds anything else (nothing in it runs)."""
    try:
        return torch.load(Path(path), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"refusing to load {os.fspath(path)!r}: it holds objects other than tensors and "
            "plain data, which could run code when loaded (checkpoints and fits written by "
            f"pyro_dgp hold none). Loader's reason: {str(err).splitlines()[0]}"
        ) from None


def save_fit(path: str | os.PathLike, model: DeepGP, guide, config: dict) -> None:
    """Write the model's and guide's state with the ``config`` that rebuilds them.

    ``config`` holds the keyword arguments of :meth:`DeepGP.regression` (or
    ``classification``, or with ``"architecture": "avdgp"`` of
    :func:`~pyro_dgp.gp.avdgp.avdgp_regression`) under ``"model"`` and the guide name under
    ``"guide"``; rebuilding also needs the training inputs (they fix k-means and PCA initial
    values, which the saved state then overwrites).
    """
    atomic_save(Path(path), {"config": config, "model": model.state_dict(),
                             "guide": guide.state_dict()})


def model_from_config(config: dict, X_train: torch.Tensor, y_train: torch.Tensor) -> DeepGP:
    """The model that ``config`` (a saved fit's ``config["model"]``) describes, built on
    the training data: its ``"architecture"`` (:data:`ARCHITECTURES`, default ``"dsvi"``),
    its ``"task"`` (``"regression"`` or ``"classification"``) and the builder's keyword
    arguments."""
    kwargs = dict(config)
    task = kwargs.pop("task", "regression")
    architecture = kwargs.pop("architecture", "dsvi")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"model architecture must be one of {ARCHITECTURES}, got "
                         f"{architecture!r}")
    if architecture == "avdgp":
        likelihood = "probit" if task == "classification" else "gaussian"
        return avdgp_regression(X_train, y_train, likelihood=likelihood, **kwargs)
    build = DeepGP.classification if task == "classification" else DeepGP.regression
    return build(X_train, y_train, **kwargs)


def load_fit(path: str | os.PathLike, X_train: torch.Tensor, y_train: torch.Tensor):
    """Rebuild ``(model, guide, config)`` saved by :func:`save_fit` on the same training data."""
    state = safe_load(path, map_location=X_train.device)
    config = state["config"]
    model = model_from_config(config["model"], X_train, y_train)
    model.load_state_dict(state["model"])
    guide = make_guide(config["guide"], model)
    with torch.no_grad():
        guide(X_train[:2], y_train[:2])  # build lazily-created parameters before loading
    guide.load_state_dict(state["guide"])
    return model, guide, config
