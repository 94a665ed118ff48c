"""Plots (PNG files) of a DataTree of :func:`~pyro_dgp.diagnostics.export.to_datatree`.

- :func:`plot_layer_paths`: posterior sample paths of each layer against its own input, and
  of the composition against ``x`` (the view of compositional uncertainty of Ustyuzhaninov
  et al. 2020);
- :func:`plot_layer_variance`: posterior and prior variance of each layer against ``x``, or
  against each input for inputs of several dims;
- :func:`plot_predictive`: the predictive mean and standard deviation of the observations at
  the inputs: over the plane of 2-D inputs, against each input otherwise;
- :func:`plot_hyperparameters`: a forest plot of Bayesian hyperparameters with
  ``arviz_plots.plot_forest``, or of the point estimates;
- :func:`plot_diagnostics`: all that apply into one directory (:func:`skipped_plots` says
  which do not, and why).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from .layers import layer_order, layer_variance

__all__ = ["MAX_INPUT_PANELS", "plot_diagnostics", "plot_hyperparameters", "plot_layer_paths",
           "plot_layer_variance", "plot_predictive", "skipped_plots"]

#: inputs shown, one panel each, by the plots against each input of many-dim inputs
MAX_INPUT_PANELS = 4


def _plt():
    """pyplot, on the user's backend: a library does not switch it (a notebook's inline
    backend must stay). Without a display matplotlib itself falls back to a headless backend;
    the command line, which only writes files, selects Agg itself."""
    import matplotlib.pyplot as plt

    return plt


def _inputs_1d(dt) -> tuple[np.ndarray, str]:
    cd = dt["constant_data"].to_dataset()
    where = dt["layers"].attrs.get("evaluated_at", "obs")
    x = cd["grid"].values if where == "grid" else cd["X"].values
    if x.shape[-1] != 1:
        raise ValueError(
            f"layer plots against the input need 1-D inputs, got {x.shape[-1]} input dims"
        )
    return x[:, 0], where


def plot_layer_paths(
    dt: xr.DataTree, path: str | os.PathLike, num_paths: int = 20, unit: int = 0, dpi: int = 100
) -> Path:
    """Posterior sample paths, one panel per layer (``f^l`` against its own input: ``x`` for
    the first layer, ``f^{l-1}`` (its unit ``unit``) for the others) and a last panel with the
    composition ``f^L`` against ``x`` (as Ustyuzhaninov et al. 2020 show them). Needs 1-D
    inputs. A DataTree whose ``layers`` group holds per-point draws (``sample_paths`` 0: no
    grid and ``paths=False``) is plotted with a warning: those lines are not functions.
    :returns: the PNG path."""
    plt = _plt()
    x, _ = _inputs_1d(dt)
    if not dt["layers"].attrs.get("sample_paths", 1):
        warnings.warn("plot_layer_paths: the DataTree's layers were drawn per point, not as "
                      "sample paths; build it with to_datatree(..., grid=...) or paths=True",
                      UserWarning, stacklevel=2)
    ds = dt["layers"].to_dataset()
    names = layer_order(dt)
    panels = len(names) + (1 if len(names) > 1 else 0)
    fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 3.2), squeeze=False)
    axes = axes[0]
    draws = ds[f"{names[0]}.f"].sizes["draw"]
    idx = np.linspace(0, draws - 1, min(num_paths, draws)).astype(int)
    prev = None
    for ax, lname in zip(axes, names, strict=False):
        f = ds[f"{lname}.f"].isel(chain=0).values  # (draw, point, unit)
        u = min(unit, f.shape[-1] - 1)
        for s in idx:
            inp = x if prev is None else prev[s, :, min(unit, prev.shape[-1] - 1)]
            order = np.argsort(inp)
            ax.plot(inp[order], f[s, order, u], lw=0.8, alpha=0.6)
        ax.set_title(f"{lname}" + (f" (unit {u})" if f.shape[-1] > 1 else ""))
        ax.set_xlabel("x" if prev is None else f"{names[names.index(lname) - 1]}.f")
        ax.set_ylabel(f"{lname}.f")
        prev = f
    if len(names) > 1:
        ax = axes[-1]
        order = np.argsort(x)
        for s in idx:
            ax.plot(x[order], prev[s, order, 0], lw=0.8, alpha=0.6)
        if "observed_data" in dt.children and dt["layers"].attrs.get("evaluated_at") == "obs":
            for var in dt["observed_data"].data_vars:
                ax.plot(x, dt["observed_data"][var].values, "k.", ms=3)
        ax.set_title("composition")
        ax.set_xlabel("x")
        ax.set_ylabel(f"{names[-1]}.f")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_layer_variance(dt: xr.DataTree, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Per layer, posterior variance of ``f^l`` (each unit, up to 5) with the prior variance
    ``k_l(x, x)`` dashed; log scale. Against ``x`` for 1-D inputs (lines); for inputs of
    ``D > 1`` dims, one row of panels per input (the first :data:`MAX_INPUT_PANELS`), each
    point's variances against that input (dots). :returns: the PNG path."""
    x = _layer_inputs(dt)
    if x.shape[-1] == 1:
        return _layer_variance_curves(dt, x[:, 0], path, dpi)
    plt = _plt()
    lv = layer_variance(dt)
    names = layer_order(dt)
    rows = min(x.shape[-1], MAX_INPUT_PANELS)
    fig, axes = plt.subplots(rows, len(names), figsize=(3.6 * len(names), 2.8 * rows),
                             squeeze=False)
    for d in range(rows):
        for ax, lname in zip(axes[d], names, strict=True):
            pv = lv[f"{lname}.post_var"].values  # (point, unit)
            for k in range(min(pv.shape[-1], 5)):
                ax.plot(x[:, d], pv[:, k], ".", ms=3, label=f"posterior (unit {k})")
            ax.plot(x[:, d], _prior_variance(lv, lname), "k+", ms=3, label="prior")
            ax.set_yscale("log")
            ax.set_title(f"Var {lname}.f")
            ax.set_xlabel(f"x[{d}]")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


def _prior_variance(lv, lname: str) -> np.ndarray:
    """``(N,)`` a layer's prior variance per point (averaged over units where each output has
    its own kernel)."""
    prior = lv[f"{lname}.prior_var"].values
    return prior if prior.ndim == 1 else prior.mean(-1)


def _layer_inputs(dt) -> np.ndarray:
    """``(N, D)`` the inputs the ``layers`` group was evaluated at (the grid, or ``X``)."""
    cd = dt["constant_data"].to_dataset()
    where = dt["layers"].attrs.get("evaluated_at", "obs")
    return cd["grid"].values if where == "grid" else cd["X"].values


def _layer_variance_curves(dt, x: np.ndarray, path, dpi) -> Path:
    """:func:`plot_layer_variance` of 1-D inputs ``x (N,)``: lines against ``x``."""
    plt = _plt()
    lv = layer_variance(dt)
    names = layer_order(dt)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
    order = np.argsort(x)
    for ax, lname in zip(axes[0], names, strict=True):
        pv = lv[f"{lname}.post_var"].values  # (point, unit)
        for k in range(min(pv.shape[-1], 5)):
            ax.plot(x[order], pv[order, k], lw=1.2, label=f"posterior (unit {k})")
        ax.plot(x[order], _prior_variance(lv, lname)[order], "k--", lw=1, label="prior")
        ax.set_yscale("log")
        ax.set_title(f"Var {lname}.f")
        ax.set_xlabel("x")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_predictive(dt: xr.DataTree, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Mean and standard deviation over the guide's draws of each observation site's
    ``posterior_predictive`` at the inputs ``X``: for 2-D inputs two maps over the input
    plane (points coloured by the value); otherwise both against each input (the first
    :data:`MAX_INPUT_PANELS`), the observed values beside the mean where the DataTree has
    them. :returns: the PNG path.

    :raises ValueError: the DataTree has no ``posterior_predictive`` group."""
    if "posterior_predictive" not in dt.children:
        raise ValueError("plot_predictive needs a DataTree with a posterior_predictive group "
                         "(to_datatree of a model with an observation site)")
    plt = _plt()
    x = dt["constant_data"]["X"].values
    names = [str(v) for v in dt["posterior_predictive"].data_vars]
    draws = {n: dt["posterior_predictive"][n].values.reshape(-1, x.shape[0]) for n in names}
    observed = ({str(v): dt["observed_data"][v].values for v in dt["observed_data"].data_vars}
                if "observed_data" in dt.children else {})
    if x.shape[-1] == 2:
        fig, axes = plt.subplots(len(names), 2, figsize=(8, 3.4 * len(names)), squeeze=False)
        for row, name in zip(axes, names, strict=True):
            for ax, (label, value) in zip(row, _mean_sd(draws[name]), strict=True):
                dots = ax.scatter(x[:, 0], x[:, 1], c=value, s=12, cmap="viridis")
                fig.colorbar(dots, ax=ax)
                ax.set_title(f"{label} of {name}")
                ax.set_xlabel("x[0]")
                ax.set_ylabel("x[1]")
    else:
        cols = min(x.shape[-1], MAX_INPUT_PANELS)
        fig, axes = plt.subplots(2 * len(names), cols, figsize=(3.6 * cols, 5.6 * len(names)),
                                 squeeze=False)
        for i, name in enumerate(names):
            for j, (label, value) in enumerate(_mean_sd(draws[name])):
                for d, ax in enumerate(axes[2 * i + j]):
                    if label == "mean" and name in observed:
                        ax.plot(x[:, d], observed[name], "k.", ms=2, label="observed")
                    ax.plot(x[:, d], value, ".", ms=3, label=label)
                    ax.set_title(f"{label} of {name}")
                    ax.set_xlabel(f"x[{d}]")
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


def _mean_sd(draws: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``[("mean", (N,)), ("sd", (N,))]`` over the draws ``(S, N)``."""
    return [("mean", draws.mean(0)), ("sd", draws.std(0))]


def plot_hyperparameters(dt: xr.DataTree, path: str | os.PathLike, dpi: int = 100) -> Path:
    """A forest plot of the hyperparameters: ``arviz_plots.plot_forest`` of the Bayesian ones
    (posterior variables other than the inducing outputs), else a matplotlib dot plot of the
    point estimates stored in the root attributes (``hyper.*``, log scale). :returns: path."""
    bayes = [str(v) for v in dt["posterior"].data_vars if not str(v).endswith(".u")]
    if bayes:
        try:
            import arviz_plots

            pc = arviz_plots.plot_forest(dt, var_names=bayes, combined=True, backend="matplotlib")
            path = Path(path)
            pc.savefig(path, dpi=dpi)
            return path
        except Exception:  # noqa: BLE001 - fall back to the point-estimate plot below
            pass
    plt = _plt()
    labels, values = [], []
    for key, value in dt.attrs.items():
        if not str(key).startswith("hyper."):
            continue
        vals = np.atleast_1d(np.asarray(value, dtype=float))
        for k, v in enumerate(vals):
            labels.append(key[len("hyper.") :] + (f"[{k}]" if vals.size > 1 else ""))
            values.append(v)
    for name in bayes:
        draws = dt["posterior"][name].values.reshape(dt["posterior"][name].shape[:2] + (-1,))
        for k in range(draws.shape[-1]):
            labels.append(f"{name}[{k}] (posterior mean)")
            values.append(float(draws[..., k].mean()))
    fig, ax = plt.subplots(figsize=(6, 0.3 * max(len(labels), 3) + 1))
    if values:
        vals = np.asarray(values)
        ax.plot(vals, np.arange(len(vals)), "o")
        ax.set_yticks(np.arange(len(vals)), labels, fontsize=7)
        if np.all(vals > 0):
            ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no hyperparameters", ha="center", va="center")
    ax.set_title("hyperparameters")
    fig.tight_layout()
    return _save(fig, path, dpi)


def skipped_plots(dt: xr.DataTree) -> dict[str, str]:
    """``{name: why}`` of the plots of :func:`plot_diagnostics` that do not apply to ``dt``."""
    x_dims = dt["constant_data"]["X"].shape[-1]
    skipped = {}
    if x_dims != 1:
        skipped["paths"] = (f"layer sample paths are curves against a 1-D input; these inputs "
                            f"have {x_dims} dims")
    if x_dims == 1:
        skipped["predictive"] = ("for 1-D inputs the last panel of the layer paths shows the "
                                 "fit against x")
    elif "posterior_predictive" not in dt.children:
        skipped["predictive"] = "the DataTree has no posterior_predictive group"
    return skipped


def plot_diagnostics(dt: xr.DataTree, directory: str | os.PathLike, prefix: str = "") -> dict:
    """The plots that apply into ``directory``: ``{"paths", "variance", "predictive",
    "hyperparameters"}`` -> PNG paths. ``paths`` needs 1-D inputs; ``predictive`` is written
    for inputs of 2 or more dims (for 1-D ones the layer paths show the fit against ``x``);
    :func:`skipped_plots` names those left out and why."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    skipped = skipped_plots(dt)
    out = {}
    if "paths" not in skipped:
        out["paths"] = plot_layer_paths(dt, directory / f"{prefix}layer_paths.png")
    out["variance"] = plot_layer_variance(dt, directory / f"{prefix}layer_variance.png")
    if "predictive" not in skipped:
        out["predictive"] = plot_predictive(dt, directory / f"{prefix}predictive.png")
    out["hyperparameters"] = plot_hyperparameters(dt, directory / f"{prefix}hyperparameters.png")
    return out


def _save(fig, path, dpi) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    plt.close(fig)
    return path
