"""Compositional-uncertainty diagnostics of deep GP fits (REFERENCE.md §3, seed 003).

- :func:`layer_summary`: per layer the posterior mean and variance of ``f^l`` at the inputs,
  the prior variance ``k_l(x, x)`` at that layer's own inputs, their ratio (the *collapse
  indicator*: near 0 means the layer became deterministic, as mean-field fits of compositional
  data do, seed 003 §5) and ``KL(q(u^l) || p(u^l))``.
- :func:`layer_kl`: that KL, in closed form where ``q(u^l)`` is Gaussian, by Monte Carlo
  otherwise.
- Plots (PNG files): :func:`plot_layer_paths` (posterior sample paths of each layer against its
  own input and of the composition against ``x``, like seed 003 Fig. 5),
  :func:`plot_layer_variance` (posterior and prior variance of each layer against ``x``),
  :func:`plot_hyperparameters` (a forest plot of Bayesian hyperparameters with
  ``arviz_plots.plot_forest``, and of the point estimates), :func:`plot_diagnostics` (all).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from pyro.distributions import constraints
from pyro.infer import autoguide

from ..gp.kl import gaussian_kl_to_layer_prior
from ..gp.sites import function_site
from ..prediction.mixture import set_up_guide
from ..rng import seeded
from .export import _trace_guide, f_sites, to_datatree

__all__ = [
    "layer_kl",
    "layer_variance",
    "layer_summary",
    "plot_layer_paths",
    "plot_layer_variance",
    "plot_hyperparameters",
    "plot_diagnostics",
]

SAMPLE_DIMS = ("chain", "draw")


# ------------------------------------------------------------------------------------ KL
def _gaussian_kl(loc: torch.Tensor, layer, rows=None, tril=None,
                 random_Z: bool = False) -> float:
    """``KL(q || p(u))`` for the flattened ``(D * M,)`` inducing outputs of ``layer``
    (row-major ``(D, M)``; the prior is block diagonal over the D rows), with ``Cov q`` given
    by per-row Cholesky factors ``tril (D, M, M)`` (a block-diagonal ``q``) or by any factor's
    rows ``rows (D M, K)``, ``Cov q = rows rows^T``.

    ``Cov q`` itself is never formed and refactorised: that squares the factor's condition
    number and fails (or loses the small eigenvalues' digits) once training has made the
    factor ill-conditioned. Where a triangular factor of a block is needed it comes from a QR
    decomposition of the block's rows, ``rows_b rows_b^T = r^T r``.

    With ``random_Z`` the layer's prior is batched over draws of its inducing inputs (set by
    ``layer.given_inducing_inputs``) and the KL is averaged over them."""
    with torch.no_grad():
        if tril is not None:
            blocks = tril
            logdet = 2 * tril.diagonal(dim1=-2, dim2=-1).abs().log().sum()
            rows = torch.block_diag(*tril)
        else:
            logdet = 2 * _triangular_of_rows(rows).diagonal().abs().log().sum()
            blocks = None
        if not random_Z:
            return float(gaussian_kl_to_layer_prior([layer], loc.reshape(-1), rows,
                                                    logdet_S=logdet))
        prior = layer.prior().base_dist  # batch (S, 1, D), event M
        D, M = prior.loc.shape[-2:]
        p_loc = prior.loc.reshape(-1, D, M)
        p_tril = prior.scale_tril.reshape(-1, D, M, M)
        if blocks is None:  # triangular factors of the diagonal blocks S_dd of S
            blocks = _triangular_of_rows(rows.reshape(D, M, -1))
        # gaussian_kl_to_layer_prior's formula, batched over the draws of Z: that function
        # takes a (DM, T) factor, which over S draws would cost S D M T memory (1.3 GB for
        # S = 256, D = 8, M = 100) where the per-row blocks cost S D M^2.
        # 0.5 [tr(K^-1 S) + (mu - m)^T K^-1 (mu - m) - DM + log|K| - log|S|], K block diagonal
        A = torch.linalg.solve_triangular(p_tril, blocks, upper=False)
        diff = torch.linalg.solve_triangular(
            p_tril, (loc.reshape(D, M) - p_loc).unsqueeze(-1), upper=False)
        logdet_K = 2 * p_tril.diagonal(dim1=-2, dim2=-1).log().sum((-2, -1))
        kl = 0.5 * (A.square().sum((-3, -2, -1)) + diff.square().sum((-3, -2, -1)) - D * M
                    + logdet_K - logdet)
        return float(kl.mean())


def _triangular_of_rows(rows: torch.Tensor) -> torch.Tensor:
    """``(..., n, n)`` lower-triangular ``L`` with ``L L^T = rows rows^T`` for ``rows
    (..., n, K)``, ``K >= n``, from the QR decomposition ``rows^T = Q r`` (``L = r^T``, its
    diagonal of either sign); singular (a zero on the diagonal) where ``K < n``."""
    n, K = rows.shape[-2:]
    if K < n:  # rank-deficient: pad to a square factor, whose log det is -inf
        rows = torch.cat([rows, rows.new_zeros(rows.shape[:-1] + (n - K,))], -1)
    return torch.linalg.qr(rows.mT, mode="r")[1].mT


def _real_support(site) -> bool:
    c = site["fn"].support
    while hasattr(c, "base_constraint"):
        c = c.base_constraint
    return c is constraints.real or c is constraints.real_vector


def _completed_gaussians(inner, names: list[str]) -> dict:
    """``{u_site: (loc (n,), {"tril": (D, M, M)} or {"rows": (n, K)})}``: the Gaussian
    marginals of a Pyro autoguide where known, each by a factor of its covariance (see
    :func:`_gaussian_kl`): per-row triangular blocks for a diagonal ``q``, else the block's rows
    of the joint factor."""
    out = {}
    if isinstance(inner, autoguide.AutoNormal):
        for name in names:
            try:
                loc, scale = inner._get_loc_and_scale(name)
            except AttributeError:
                continue
            site = inner.prototype_trace.nodes.get(name)
            if site is not None and _real_support(site):
                M = site["value"].shape[-1]
                out[name] = (loc.reshape(-1), {"tril": torch.diag_embed(scale.reshape(-1, M))})
        return out
    if not isinstance(inner, autoguide.AutoContinuous) or inner.prototype_trace is None:
        return out
    try:
        post = inner.get_posterior()
    except (NotImplementedError, AttributeError):
        return out
    base = post
    while isinstance(base, torch.distributions.Independent):
        base = base.base_dist
    low_rank = isinstance(base, torch.distributions.LowRankMultivariateNormal)
    if not (isinstance(base, torch.distributions.Normal) or low_rank
            or isinstance(base, torch.distributions.MultivariateNormal)):
        return out  # e.g. a normalising flow: not Gaussian
    mean = base.loc.reshape(-1)
    pos = 0
    for name, site in inner.prototype_trace.iter_stochastic_nodes():
        size = math.prod(inner._unconstrained_shapes[name])
        if name in names and _real_support(site):
            sl = slice(pos, pos + size)
            if isinstance(base, torch.distributions.Normal):
                M = site["value"].shape[-1]
                factor = {"tril": torch.diag_embed(base.scale.reshape(-1)[sl].reshape(-1, M))}
            elif low_rank:  # rows of [W | diag(sqrt d)], whose product is W W^T + diag d
                factor = {"rows": torch.cat(
                    [base.cov_factor[sl], torch.diag(base.cov_diag[sl].sqrt())], -1)}
            else:  # the joint lower-triangular factor: the block's columns end at its own
                factor = {"rows": base.scale_tril[sl, : sl.stop]}
            out[name] = (mean[sl], factor)
        pos += size
    return out


def _layers_of(trace) -> list[tuple[str, object]]:
    return [(n.rsplit(".", 1)[0], function_site(s).layer) for n, s in f_sites(trace)]


def layer_kl(
    model, guide, X: torch.Tensor, trace=None, num_samples: int = 256, seed: int | None = 0
) -> dict[str, float]:
    """``{layer: KL(q(u^l) || p(u^l))}`` for every GP layer of ``model``.

    Closed form where the guide's marginal ``q(u^l)`` is a known Gaussian: :class:`MeanField`
    (its ``q_params``), :class:`Coupled` and :class:`Chain` (each layer's block), and completed
    Pyro autoguides ``AutoNormal``, ``AutoMultivariateNormal``,
    ``AutoLowRankMultivariateNormal``, ``AutoDiagonalNormal`` (the block of
    ``get_posterior()``; a joint guide's per-layer marginal). Otherwise a Monte Carlo
    estimate ``mean_s [log q(u^l_s) - log p(u^l_s)]`` over draws of the guide, where the guide
    trace has a per-layer density at ``<layer>.u``; ``nan`` where it has none (e.g. a flow,
    whose density is joint over the layers).

    :param trace: a guide trace under ``pyro.plate("_predictive_samples", S, dim=-2)`` to reuse
        (as :func:`~pyro_dgp.arviz.to_datatree` does); else one is drawn (``num_samples``).
    """
    from ..guides import JointGaussian, MeanField

    if trace is None:
        set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
        with torch.no_grad(), seeded(seed, X.device):
            trace = _trace_guide(guide, (X,), num_samples)
    layers = _layers_of(trace)
    names = [f"{n}.u" for n, _ in layers]
    gaussians, closed_form = {}, {}
    if isinstance(guide, MeanField):
        for site in guide.layer_sites:
            loc, tril = guide.q_params(site)
            gaussians[site.name] = (loc.reshape(-1), {"tril": tril})
    elif isinstance(guide, JointGaussian):  # Coupled, Chain: each layer's block, factored
        with torch.no_grad():
            for site in guide.layer_sites:
                closed_form[site.name] = float(gaussian_kl_to_layer_prior(
                    [site.layer], *guide.marginal_factor(site)))
    elif hasattr(guide, "inner"):
        gaussians = _completed_gaussians(guide.inner, names)
    out = {}
    below = None
    for (lname, layer), uname in zip(layers, names, strict=True):
        # inducing points as inducing locations: this layer's prior is p(u | Z = u_below^T),
        # so its KL is the expectation over the guide's draws of u_below (seed 003 eq. 23)
        Z = None
        if below is not None and below[1].feeds_inducing_inputs:
            Z = _drop_plate_dim(trace.nodes[f"{below[0]}.u"]["value"]).mT
        with layer.given_inducing_inputs(Z):
            if uname in closed_form:
                out[lname] = closed_form[uname]
            elif uname in gaussians:
                loc, factor = gaussians[uname]
                out[lname] = _gaussian_kl(loc, layer, **factor, random_Z=Z is not None)
            else:
                out[lname] = _mc_kl(trace, lname, layer)
        below = (lname, layer)
    return out


def _drop_plate_dim(u: torch.Tensor) -> torch.Tensor:
    """``(S, 1, D, M)`` draws of a ``.u`` site under the sample plate at dim -2 -> ``(S, D, M)``."""
    return u.reshape((-1,) + u.shape[-2:])


def _mc_kl(trace, lname: str, layer) -> float:
    """``mean_s [log q(u^l_s) - log p(u^l_s)]`` from a guide trace; ``nan`` where the trace has
    no per-layer density (``q`` joint over layers, e.g. a flow or a joint Gaussian)."""
    draws = _mc_kl_draws(trace, lname, layer)
    return float("nan") if draws is None else float(draws.mean())


def _mc_kl_draws(trace, lname: str, layer) -> torch.Tensor | None:
    """``(S,)`` per-draw ``log q(u^l_s) - log p(u^l_s)`` of :func:`_mc_kl` (their spread gives
    its standard error), or ``None``."""
    from .export import _unwrap

    name = f"{lname}.u"
    usite = trace.nodes.get(name)
    if usite is None or usite["type"] != "sample":
        return None
    sites = [usite]
    base = _unwrap(usite["fn"])
    while hasattr(base, "base_dist"):
        base = base.base_dist
    if type(base).__name__ == "Delta":
        # AutoNormal-style: an auxiliary '<name>_unconstrained' site holds the density, the
        # Delta its log-Jacobian
        aux = trace.nodes.get(f"{name}_unconstrained")
        if aux is None or aux["type"] != "sample":
            return None
        sites.append(aux)
    with torch.no_grad():
        try:
            log_q = sum(s["fn"].log_prob(s["value"]).reshape(-1) for s in sites)
        except NotImplementedError:
            return None
        u = usite["value"]
        # (S, 1, D, M): the batch of a prior over random inducing inputs is (S, 1) too
        u = u.reshape((-1, 1) + u.shape[-2:])
        log_p = layer.prior().log_prob(u).reshape(-1)
    return log_q - log_p


# -------------------------------------------------------------------------- per-layer stats
def _as_datatree(source, guide=None, X=None, **kwargs) -> xr.DataTree:
    if isinstance(source, xr.DataTree):
        return source
    if isinstance(source, tuple):
        source, guide, X = source
    if guide is None or X is None:
        raise TypeError("pass a DataTree, a tuple (model, guide, X), or model, guide, X")
    kwargs.setdefault("seed", 0)
    return to_datatree(source, guide, X, **kwargs)


def layer_variance(source, guide=None, X=None, **kwargs) -> xr.Dataset:
    """Per layer and input point: ``<layer>.post_mean``, ``<layer>.post_var`` (over the guide's
    draws: ``mean_s var_s + var_s mean_s`` from the attached Gaussians, or the variance of the
    sampled values), ``<layer>.prior_var`` (``k_l(x, x)`` at the layer's inputs, averaged over
    draws) and ``<layer>.var_ratio`` = posterior / prior variance.

    :param source: a DataTree from :func:`~pyro_dgp.arviz.to_datatree`, or a tuple
        ``(model, guide, X)``, or ``model`` with ``guide`` and ``X`` (extra keyword arguments
        go to ``to_datatree``).
    """
    dt = _as_datatree(source, guide, X, **kwargs)
    ds = dt["layers"].to_dataset()
    out = {}
    for lname in _layer_order(dt):
        f = ds[f"{lname}.f"]
        if f"{lname}.f_mean" in ds and f"{lname}.f_var" in ds:
            m, v = ds[f"{lname}.f_mean"], ds[f"{lname}.f_var"]
            post_mean = m.mean(SAMPLE_DIMS)
            post_var = v.mean(SAMPLE_DIMS) + m.var(SAMPLE_DIMS)
        else:
            post_mean, post_var = f.mean(SAMPLE_DIMS), f.var(SAMPLE_DIMS)
        prior_var = ds[f"{lname}.prior_var"].mean(SAMPLE_DIMS)
        out[f"{lname}.post_mean"] = post_mean
        out[f"{lname}.post_var"] = post_var
        out[f"{lname}.prior_var"] = prior_var
        out[f"{lname}.var_ratio"] = post_var / prior_var
    return xr.Dataset(out)


def _layer_order(dt) -> list[str]:
    order = dt["layers"].attrs.get("layer_order")
    if order is None:
        names = [str(v)[: -len(".f")] for v in dt["layers"].data_vars if str(v).endswith(".f")]
        return names
    return [order] if isinstance(order, str) else [str(o) for o in order]


def layer_summary(source, guide=None, X=None, **kwargs):
    """One row per layer (first to last), a ``pandas.DataFrame`` with columns

    - ``f_mean``, ``f_var``: posterior mean and variance of ``f^l``, averaged over the input
      points and the layer's units;
    - ``prior_var``: ``k_l(x, x)`` at the layer's own inputs, averaged likewise;
    - ``var_ratio``: the mean over points and units of posterior / prior variance (the
      collapse indicator: near 0 means the layer is deterministic under q; seed 003 shows
      mean-field guides collapse the inner layers of compositional fits), with
      ``var_ratio_median`` and ``var_ratio_max``;
    - ``kl``: ``KL(q(u^l) || p(u^l))`` (:func:`layer_kl`; ``nan`` if not computed).

    :param source: a DataTree, or ``(model, guide, X)`` (or ``model, guide, X``).
    """
    import pandas as pd

    dt = _as_datatree(source, guide, X, **kwargs)
    lv = layer_variance(dt)
    attrs = dt["layers"].attrs
    rows = []
    for lname in _layer_order(dt):
        ratio = lv[f"{lname}.var_ratio"].values
        rows.append(
            {
                "layer": lname,
                "f_mean": float(lv[f"{lname}.post_mean"].mean()),
                "f_var": float(lv[f"{lname}.post_var"].mean()),
                "prior_var": float(lv[f"{lname}.prior_var"].mean()),
                "var_ratio": float(np.mean(ratio)),
                "var_ratio_median": float(np.median(ratio)),
                "var_ratio_max": float(np.max(ratio)),
                "kl": float(attrs.get(f"{lname}.kl", float("nan"))),
            }
        )
    return pd.DataFrame(rows).set_index("layer")


# ------------------------------------------------------------------------------------ plots
def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "cairo", "ps"):
        try:
            matplotlib.use("Agg", force=False)
        except Exception:  # pragma: no cover - backend already fixed by the user
            pass
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
    composition ``f^L`` against ``x`` (seed 003 Fig. 5). Needs 1-D inputs; evaluate on a grid
    (``to_datatree(..., grid=...)``) for smooth paths. :returns: the PNG path."""
    plt = _plt()
    x, _ = _inputs_1d(dt)
    ds = dt["layers"].to_dataset()
    names = _layer_order(dt)
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
    names = _layer_order(dt)
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
