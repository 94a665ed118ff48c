"""Checkpoints of a run (random streams, atomic writes) and saved fits of a model with its
guide."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pyro
import torch

from ..gp.deep_gp import DeepGP
from ..guides.registry import make_guide

__all__ = ["atomic_save", "load_fit", "rng_state", "safe_load", "save_fit", "set_rng_state"]


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
    ``classification``) under ``"model"`` and the guide name under ``"guide"``; rebuilding also
    needs the training inputs (they fix k-means and PCA initial values, which the saved state
    then overwrites).
    """
    atomic_save(Path(path), {"config": config, "model": model.state_dict(),
                             "guide": guide.state_dict()})


def load_fit(path: str | os.PathLike, X_train: torch.Tensor, y_train: torch.Tensor):
    """Rebuild ``(model, guide, config)`` saved by :func:`save_fit` on the same training data."""
    state = safe_load(path, map_location=X_train.device)
    config = state["config"]
    kwargs = dict(config["model"])
    task = kwargs.pop("task", "regression")
    build = DeepGP.classification if task == "classification" else DeepGP.regression
    model = build(X_train, y_train, **kwargs)
    model.load_state_dict(state["model"])
    guide = make_guide(config["guide"], model)
    with torch.no_grad():
        guide(X_train[:2], y_train[:2])  # build lazily-created parameters before loading
    guide.load_state_dict(state["guide"])
    return model, guide, config
