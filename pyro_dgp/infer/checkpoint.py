"""Saving and loading fitted models with their guides."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..gp.deep_gp import DeepGP
from ..guides.registry import make_guide

__all__ = ["save_fit", "load_fit"]


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
