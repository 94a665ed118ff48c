"""Plots (PNG files) of a DataTree of :func:`~pyro_dgp.diagnostics.export.to_datatree`.

- :func:`plot_layer_paths`: posterior sample paths of each layer against its own input, and
  of the composition against ``x`` (the view of compositional uncertainty of Ustyuzhaninov
  et al. 2020);
- :func:`plot_layer_variance`: posterior and prior variance of each layer against ``x``;
- :func:`plot_hyperparameters`: a forest plot of Bayesian hyperparameters with
  ``arviz_plots.plot_forest``, or of the point estimates;
- :func:`plot_diagnostics`: all of them into one directory.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import xarray as xr

from .layers import layer_order, layer_variance

__all__ = ["plot_diagnostics", "plot_hyperparameters", "plot_layer_paths", "plot_layer_variance"]


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
    """Per layer, posterior variance of ``f^l`` against ``x`` (each unit) with the prior
    variance ``k_l(x, x)`` dashed; log scale. Needs 1-D inputs. :returns: the PNG path."""
    plt = _plt()
    x, _ = _inputs_1d(dt)
    lv = layer_variance(dt)
    names = layer_order(dt)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
    order = np.argsort(x)
    for ax, lname in zip(axes[0], names, strict=True):
        pv = lv[f"{lname}.post_var"].values  # (point, unit)
        for k in range(min(pv.shape[-1], 5)):
            ax.plot(x[order], pv[order, k], lw=1.2, label=f"posterior (unit {k})")
        ax.plot(x[order], lv[f"{lname}.prior_var"].values[order], "k--", lw=1, label="prior")
        ax.set_yscale("log")
        ax.set_title(f"Var {lname}.f")
        ax.set_xlabel("x")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi)


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


def plot_diagnostics(dt: xr.DataTree, directory: str | os.PathLike, prefix: str = "") -> dict:
    """All the plots into ``directory``: ``{"paths", "variance", "hyperparameters"}`` -> PNG
    paths (the first two only for 1-D inputs)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    x_dims = dt["constant_data"]["X"].shape[-1]
    if x_dims == 1:
        out["paths"] = plot_layer_paths(dt, directory / f"{prefix}layer_paths.png")
        out["variance"] = plot_layer_variance(dt, directory / f"{prefix}layer_variance.png")
    out["hyperparameters"] = plot_hyperparameters(dt, directory / f"{prefix}hyperparameters.png")
    return out


def _save(fig, path, dpi) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    plt.close(fig)
    return path
