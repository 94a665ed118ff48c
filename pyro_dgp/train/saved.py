"""Saved fits: a model with its guide, written with the config that rebuilds them, and the
registry of the model builders such a config names.

A saved fit's ``config["model"]`` names its builder under ``"architecture"`` (default
``"dsvi"``), its ``"task"`` (``"regression"`` or ``"classification"``) and the builder's
keyword arguments. Two builders are registered: ``"dsvi"``, :meth:`DeepGP.regression
<pyro_dgp.gp.DeepGP.regression>` (``classification`` for that task), and ``"avdgp"``, the
architecture of Meng and Zhang 2024 (:func:`~pyro_dgp.gp.avdgp.avdgp_regression`); others are
added with :func:`register_model`. The command line's ``--model`` takes the same names.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..gp.avdgp import PAPER_HIDDEN_DIMS, PAPER_NUM_INDUCING, avdgp_regression
from ..gp.deep_gp import DeepGP
from ..guides.registry import GUIDES, has_local_inducing, make_guide
from .checkpoint import CHECKPOINT_KEYS, atomic_save, safe_load

__all__ = ["DEFAULT_MODEL", "MODELS", "ModelBuilder", "check_fit_config", "load_fit",
           "model_from_config", "read_fit", "register_model", "save_fit"]

#: the builder of a config that names none
DEFAULT_MODEL = "dsvi"
#: the options of a config that are not the builder's keyword arguments
_CONFIG_KEYS = {"architecture", "task"}
_TASKS = ("regression", "classification")


@dataclass(frozen=True)
class ModelBuilder:
    """One registered model builder.

    ``build(X_train (N, D), y_train (N,), task, **options) -> DeepGP``; ``options``: the
    keyword arguments a config may give it (for a classification, ``"likelihood"`` is the
    task's and not an option); ``num_layers(options) -> int``: the layers a config describes;
    ``per_point_inducing``: whether its layers have per-point (amortized) inducing points;
    ``sizes``: the sizes a user picks on the command line (``num_layers``, ``num_inducing``,
    ``hidden_dim``) that it takes, none for an architecture of fixed sizes; ``about``: what it
    is, in a few words.
    """

    name: str
    build: Callable[..., DeepGP]
    options: frozenset[str]
    num_layers: Callable[[Mapping], int]
    per_point_inducing: bool = False
    sizes: frozenset[str] = frozenset()
    about: str = ""


#: the registered builders, by name
MODELS: dict[str, ModelBuilder] = {}


def register_model(name: str, build: Callable[..., DeepGP], *, options: Collection[str],
                   num_layers: Callable[[Mapping], int], per_point_inducing: bool = False,
                   sizes: Collection[str] = (), about: str = "") -> ModelBuilder:
    """Register ``build`` under ``name`` (:class:`ModelBuilder` says what each part is), for
    :func:`save_fit`, :func:`load_fit` and the command line's ``--model``.

    :raises ValueError: for a name already registered.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_model: name must be a non-empty string, got {name!r}")
    if name in MODELS:
        raise ValueError(f"register_model: {name!r} is already registered (to "
                         f"{MODELS[name].build.__qualname__}); pick another name")
    entry = ModelBuilder(name, build, frozenset(options), num_layers, per_point_inducing,
                         frozenset(sizes), about)
    MODELS[name] = entry
    return entry


def _keyword_options(builder) -> frozenset[str]:
    """The keyword-only arguments of ``builder``."""
    return frozenset(name for name, p in inspect.signature(builder).parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _build_dsvi(X: torch.Tensor, y: torch.Tensor, task: str, **options) -> DeepGP:
    build = DeepGP.classification if task == "classification" else DeepGP.regression
    return build(X, y, **options)


def _build_avdgp(X: torch.Tensor, y: torch.Tensor, task: str, **options) -> DeepGP:
    likelihood = "probit" if task == "classification" else "gaussian"
    return avdgp_regression(X, y, likelihood=likelihood, **options)


register_model("dsvi", _build_dsvi, options=_keyword_options(DeepGP.regression),
               num_layers=lambda options: options.get("num_layers", 2),
               sizes=("num_layers", "num_inducing", "hidden_dim"),
               about="DeepGP.regression: global inducing points, the DSVI initialisation")
register_model("avdgp", _build_avdgp,
               options=_keyword_options(avdgp_regression) - {"likelihood"},
               num_layers=lambda options: len(options.get("hidden_dims", PAPER_HIDDEN_DIMS)) + 1,
               per_point_inducing=True,
               about=f"the architecture of Meng and Zhang 2024 (widths {PAPER_HIDDEN_DIMS}, "
                     f"M = {PAPER_NUM_INDUCING})")


def _builder_of(model_config: Mapping, where: str) -> ModelBuilder:
    """The registered builder that ``model_config`` names; a ``ValueError`` otherwise."""
    name = model_config.get("architecture", DEFAULT_MODEL)
    if name not in MODELS:
        raise ValueError(f"{where}model architecture must be one of {tuple(MODELS)}, got "
                         f"{name!r}")
    return MODELS[name]


def read_fit(path: str | os.PathLike, map_location=None) -> dict:
    """A fit written by :func:`save_fit`, loaded with :func:`safe_load` and its config
    checked; a ``ValueError`` naming the file when it is a training checkpoint or lacks a
    part."""
    state = safe_load(path, map_location=map_location)
    name = os.fspath(path)
    if "config" not in state and all(k in state for k in CHECKPOINT_KEYS):
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
    builder = _builder_of(model, f"{where}: ")
    if model.get("task", "regression") not in _TASKS:
        raise ValueError(f"{where}: model task must be 'regression' or 'classification', got "
                         f"{model.get('task')!r}")
    accepted = set(builder.options)
    if model.get("task") == "classification":
        accepted.discard("likelihood")  # set by the task
    unknown = sorted(set(model) - accepted - _CONFIG_KEYS)
    if unknown:
        raise ValueError(f"{where}: the model config has {unknown}, which the {builder.name} "
                         f"builder does not take (it takes {sorted(accepted)})")


def save_fit(path: str | os.PathLike, model: DeepGP, guide, config: dict) -> None:
    """Write the model's and guide's state with the ``config`` that rebuilds them.

    ``config`` holds under ``"model"`` the registered builder's name (``"architecture"``,
    :data:`MODELS`; default ``"dsvi"``: :meth:`DeepGP.regression`, or ``classification``
    with ``"task"``) and its keyword arguments, and the guide name under ``"guide"``;
    rebuilding also needs the training inputs (they fix k-means and PCA initial values, which
    the saved state then overwrites). The model's number of inputs ``D`` is saved too, so
    that loading on ``(N, D')`` inputs with ``D' != D`` is refused by name.

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
    builder = _builder_of(cfg, "save_fit: ")
    if bool(has_local_inducing(model)) != builder.per_point_inducing:
        said = "per-point" if builder.per_point_inducing else "global"
        has = "per-point (amortized)" if has_local_inducing(model) else "global"
        fits = [name for name, entry in MODELS.items()
                if entry.per_point_inducing == bool(has_local_inducing(model))]
        raise ValueError(f"save_fit: config['model'] describes a {builder.name} model "
                         f"({said} inducing points), but the model's layers have {has} "
                         f"inducing points (for this model, \"architecture\": one of {fits})")
    per_output = [layer.name for layer in model.layers if getattr(layer, "kernel_outputs", None)]
    said = bool(cfg.get("kernel_per_output", False))
    if "kernel_per_output" in builder.options and bool(per_output) != said:
        raise ValueError(f"save_fit: config['model'] has kernel_per_output={said}, but the "
                         f"model's layers {per_output or 'all'} have "
                         f"{'a kernel per output' if per_output else 'shared kernels'}")
    layers = builder.num_layers(cfg)
    if layers != len(model.layers):
        raise ValueError(f"save_fit: config['model'] describes {layers} layers, the model has "
                         f"{len(model.layers)}")


def model_from_config(config: dict, X_train: torch.Tensor, y_train: torch.Tensor) -> DeepGP:
    """The model that ``config`` (a saved fit's ``config["model"]``) describes, built on
    the training data: its ``"architecture"`` (a name of :data:`MODELS`, default ``"dsvi"``),
    its ``"task"`` (``"regression"`` or ``"classification"``) and the builder's keyword
    arguments."""
    builder = _builder_of(config, "")
    options = {k: v for k, v in config.items() if k not in _CONFIG_KEYS}
    return builder.build(X_train, y_train, config.get("task", "regression"), **options)


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
