"""Checkpoints of a run (random streams, atomic writes) and saved fits of a model with its
guide."""

from __future__ import annotations

import os
from pathlib import Path

import pyro
import torch

from ..gp.deep_gp import DeepGP
from ..guides.registry import make_guide

__all__ = ["atomic_save", "load_fit", "rng_state", "save_fit", "set_rng_state"]


def rng_state(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step draws from: Pyro's (torch CPU, Python, NumPy), the
    minibatch generator's and, for data on a GPU, that GPU's (the guides draw there)."""
    state = {"pyro": pyro.util.get_rng_state(), "batches": generator.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, generator: torch.Generator, device: torch.device) -> None:
    # generator states must be CPU byte tensors, whatever map_location moved them to
    pyro_state = dict(state["pyro"], torch=state["pyro"]["torch"].cpu())
    pyro.util.set_rng_state(pyro_state)
    generator.set_state(state["batches"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def atomic_save(path: Path, payload: dict) -> None:
    """``torch.save`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written checkpoint


def save_fit(path: str | os.PathLike, model: DeepGP, guide, config: dict) -> None:
    """Write the model's and guide's state with the ``config`` that rebuilds them.

    ``config`` holds the keyword arguments of :meth:`DeepGP.regression` (or
    ``classification``) under ``"model"`` and the guide name under ``"guide"``; rebuilding also
    needs the training inputs (they fix k-means and PCA initial values, which the saved state
    then overwrites).
    """
    torch.save(
        {"config": config, "model": model.state_dict(), "guide": guide.state_dict()}, Path(path)
    )


def load_fit(path: str | os.PathLike, X_train: torch.Tensor, y_train: torch.Tensor):
    """Rebuild ``(model, guide, config)`` saved by :func:`save_fit` on the same training data."""
    state = torch.load(Path(path), map_location=X_train.device, weights_only=False)
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
