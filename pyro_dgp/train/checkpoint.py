"""Checkpoints of a run (random streams, atomic writes) and saved fits of a model with its
guide."""

from __future__ import annotations

import inspect
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyro
import torch

from ..gp.avdgp import PAPER_HIDDEN_DIMS, avdgp_regression
from ..gp.deep_gp import DeepGP
from ..guides.registry import GUIDES, has_local_inducing, make_guide

__all__ = ["ARCHITECTURES", "atomic_save", "check_fit_config", "load_fit", "model_from_config",
           "read_checkpoint", "read_fit", "rng_state", "safe_load", "save_fit", "set_rng_state"]

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

    :raises FileNotFoundError: when there is no file at ``path``.
    :raises ValueError: naming the file, as unsafe when it holds objects the loader refuses
        (nothing in it runs, and the message gives no way to load it anyway), when it cannot
        be read as a torch file at all (corrupt, truncated, or some other kind of file), or
        when it holds something other than a dict.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        reason = _loader_reason(err)
        if _REFUSAL.search(reason):
            raise ValueError(
                f"refusing to load {os.fspath(path)!r}: the file is unsafe: it holds objects "
                "other than tensors and plain data (a reference to a function or class that "
                "loading would call), which could run code; checkpoints and fits written by "
                f"pyro_dgp hold none. Loader's reason: {reason}") from None
        raise _unreadable(path, reason) from None
    except OSError as err:
        if err.filename is None:  # raised while reading the archive, not while opening it
            raise _unreadable(path, _loader_reason(err)) from None
        raise ValueError(f"cannot read {os.fspath(path)!r}: {err.strerror}") from None
    except Exception as err:  # noqa: BLE001 (a damaged file fails anywhere in the reader)
        raise _unreadable(path, _loader_reason(err)) from None
    if not isinstance(state, dict):
        raise ValueError(f"{os.fspath(path)!r} holds a {type(state).__name__}, not a checkpoint "
                         "or a saved fit (a dict written by pyro_dgp)")
    return state


#: what the weights-only unpickler says when it refuses an object it could build but will not
#: (a global outside its allow-list), as opposed to bytes that are no pickle it understands
_REFUSAL = re.compile(r"\bglobal\b|allowlist|must be imported", re.IGNORECASE)


def _loader_reason(err: Exception) -> str:
    """The loader's own reason, one line, without torch's advice around it (which would
    suggest loading the file unsafely): the unpickler's error that torch wrapped where there
    is one, else the text after ``WeightsUnpickler error:``, else the message's first line
    that is not that advice."""
    inner = err.__cause__ or err.__context__
    if isinstance(inner, pickle.UnpicklingError) and str(inner).strip():
        text = str(inner)
    else:
        text = str(err)
        _, found, tail = text.partition("WeightsUnpickler error:")
        text = tail if found else text
    lines = [line.split(" Please use ")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not _ADVICE.search(line)]
    reason = lines[0] if lines else ""
    return f"{type(err).__name__}: {reason}" if reason else type(err).__name__


#: torch's advice around a weights-only refusal: how to load the file anyway
_ADVICE = re.compile(r"weights.only|trusted source|trust the source|add_safe_globals|"
                     r"documentation of torch\.load", re.IGNORECASE)


def _unreadable(path: Path, reason: str) -> ValueError:
    return ValueError(f"cannot read {os.fspath(path)!r} (corrupt or not a checkpoint): the "
                      f"file is no torch.save file pyro_dgp can load ({reason})")


def read_checkpoint(path: str | os.PathLike, map_location=None) -> dict:
    """A training checkpoint written by :func:`~pyro_dgp.fit` (``checkpoint=path``), loaded
    with :func:`safe_load`; a ``ValueError`` naming the file when it is a saved fit or lacks
    what resuming needs."""
    state = safe_load(path, map_location=map_location)
    missing = [k for k in _CHECKPOINT_KEYS if k not in state]
    if missing and "config" in state:
        raise ValueError(f"{os.fspath(path)!r} is a fit saved by save_fit / `pyro-dgp fit`, not "
                         "a training checkpoint: training resumes from the checkpoint file "
                         "fit writes (`checkpoint=`; the CLI's OUTPUT/checkpoint.pt)")
    if missing:
        raise ValueError(f"{os.fspath(path)!r} is not a training checkpoint of pyro_dgp: it "
                         f"lacks {missing}")
    return state


_CHECKPOINT_KEYS = ("step", "model", "guide", "optimizer", "rng", "losses")


def read_fit(path: str | os.PathLike, map_location=None) -> dict:
    """A fit written by :func:`save_fit`, loaded with :func:`safe_load` and its config
    checked; a ``ValueError`` naming the file when it is a training checkpoint or lacks a
    part."""
    state = safe_load(path, map_location=map_location)
    name = os.fspath(path)
    if "config" not in state and all(k in state for k in _CHECKPOINT_KEYS):
        beside = Path(path).with_name("fit.pt")
        which = (f"pass {os.fspath(beside)!r}, written beside it" if beside.exists() else
                 "pass the fit.pt that `pyro-dgp fit` writes to its --output folder")
        raise ValueError(f"{name!r} is a training checkpoint (for resuming with --resume / "
                         "resume=True), not a fit saved by `pyro-dgp fit` or save_fit: "
                         f"{which}")
    missing = [k for k in ("config", "model", "guide") if k not in state]
    if missing:
        raise ValueError(f"{name!r} is not a fit saved by `pyro-dgp fit` or save_fit: it lacks "
                         f"{missing}")
    check_fit_config(state["config"], where=name)
    return state


def check_fit_config(config, where: str = "config") -> None:
    """That ``config`` can rebuild a model and guide (:func:`model_from_config`,
    ``make_guide``): a dict with the builder's keyword arguments under ``"model"`` and a guide
    name under ``"guide"``; a ``ValueError`` naming what is missing or wrong."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}: the fit's config must be a dict, got {type(config).__name__}")
    if not isinstance(config.get("model"), Mapping):
        raise ValueError(f"{where}: the fit's config needs under \"model\" a dict of the model "
                         "builder's keyword arguments, e.g. {'num_layers': 2, 'num_inducing': "
                         f"100}} ({{}} for the defaults); got {config.get('model')!r}")
    if config.get("guide") not in GUIDES:
        raise ValueError(f"{where}: the fit's config needs under \"guide\" the guide's name, one "
                         f"of {sorted(GUIDES)}; got {config.get('guide')!r}")
    model = config["model"]
    architecture = model.get("architecture", "dsvi")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{where}: model architecture must be one of {ARCHITECTURES}, got "
                         f"{architecture!r}")
    if model.get("task", "regression") not in ("regression", "classification"):
        raise ValueError(f"{where}: model task must be 'regression' or 'classification', got "
                         f"{model.get('task')!r}")
    builder = avdgp_regression if architecture == "avdgp" else DeepGP.regression
    accepted = {name for name, p in inspect.signature(builder).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    if architecture == "avdgp" or model.get("task") == "classification":
        accepted.discard("likelihood")  # set by the task
    unknown = sorted(set(model) - accepted - {"architecture", "task"})
    if unknown:
        raise ValueError(f"{where}: the model config has {unknown}, which the {architecture} "
                         f"builder does not take (it takes {sorted(accepted)})")


def save_fit(path: str | os.PathLike, model: DeepGP, guide, config: dict) -> None:
    """Write the model's and guide's state with the ``config`` that rebuilds them.

    ``config`` holds the keyword arguments of :meth:`DeepGP.regression` (or
    ``classification``, or with ``"architecture": "avdgp"`` of
    :func:`~pyro_dgp.gp.avdgp.avdgp_regression`) under ``"model"`` and the guide name under
    ``"guide"``; rebuilding also needs the training inputs (they fix k-means and PCA initial
    values, which the saved state then overwrites). The model's number of inputs ``D`` is
    saved too, so that loading on ``(N, D')`` inputs with ``D' != D`` is refused by name.

    :raises TypeError: for a model :func:`load_fit` cannot rebuild (not a ``DeepGP``).
    :raises ValueError: for a config it cannot rebuild from, or one that describes another
        model (its number of layers, global versus per-point inducing points).
    """
    if not isinstance(model, DeepGP):
        raise TypeError(
            f"save_fit saves a DeepGP that load_fit rebuilds from config (DeepGP.regression / "
            f"classification, or avdgp_regression); got a {type(model).__name__}. Save another "
            "model's state yourself: torch.save({'model': model.state_dict(), 'guide': "
            "guide.state_dict()}, path)")
    check_fit_config(config, where="save_fit")
    _check_plain(config, "config")
    _check_config_describes(model, config)
    atomic_save(Path(path), {"config": config, "model": model.state_dict(),
                             "guide": guide.state_dict(), "input_dim": model.input_dim})


def _check_plain(value, where: str) -> None:
    """That ``value`` is plain data (what a weights-only load reads back)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"save_fit: {where} has the key {key!r}; keys must be strings")
            _check_plain(item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise ValueError(f"save_fit: {where} is a {type(value).__name__}; a saved fit's config "
                         "holds plain data only (strings, numbers, lists, dicts), which "
                         "load_fit reads back without running code")


def _check_config_describes(model: DeepGP, config: dict) -> None:
    """That rebuilding from ``config`` gives a model of ``model``'s layers."""
    cfg = config["model"]
    avdgp = cfg.get("architecture", "dsvi") == "avdgp"
    if bool(has_local_inducing(model)) != avdgp:
        said, has, fits = (("an avdgp model (per-point inducing points)", "global", "dsvi")
                           if avdgp else ("a dsvi model (global inducing points)",
                                          "per-point (amortized)", "avdgp"))
        raise ValueError(f"save_fit: config['model'] describes {said}, but the model's layers "
                         f"have {has} inducing points (for this model, \"architecture\": "
                         f"{fits!r})")
    layers = (len(cfg.get("hidden_dims", PAPER_HIDDEN_DIMS)) + 1 if avdgp
              else cfg.get("num_layers", 2))
    if layers != len(model.layers):
        raise ValueError(f"save_fit: config['model'] describes {layers} layers, the model has "
                         f"{len(model.layers)}")


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


def load_fit(path: str | os.PathLike, X_train: torch.Tensor, y_train: torch.Tensor, *,
             state: dict | None = None):
    """Rebuild ``(model, guide, config)`` saved by :func:`save_fit` on the same training data
    (``X_train (N, D)``, ``y_train (N,)``); ``state``: the file as :func:`read_fit` already
    read it (on the CPU), not read again.

    :raises ValueError: naming the file, when it is no saved fit (a training checkpoint, say),
        or when ``X_train`` has another number of inputs ``D`` than the fit.
    """
    if state is None:
        state = read_fit(path, map_location=X_train.device)
    config = state["config"]
    saved_dim = state.get("input_dim")
    if saved_dim is not None and X_train.shape[-1] != saved_dim:
        raise ValueError(f"the fit in {os.fspath(path)!r} has {saved_dim} inputs, X_train has "
                         f"{X_train.shape[-1]} columns: load it with the data it was fitted to")
    model = model_from_config(config["model"], X_train, y_train)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise ValueError(f"the fit in {os.fspath(path)!r} does not match the model its config "
                         f"builds on these data ({X_train.shape[-1]} inputs): "
                         f"{str(err).splitlines()[-1].strip()}") from None
    guide = make_guide(config["guide"], model)
    with torch.no_grad():
        guide(X_train[:2], y_train[:2])  # build lazily-created parameters before loading
    guide.load_state_dict(state["guide"])
    return model, guide, config
