"""Compositional uncertainty of deep GP fits, per layer (Ustyuzhaninov et al. 2020).

- :func:`layer_variance`: per layer and point the posterior mean and variance of ``f^l``, the
  prior variance ``k_l(x, x)`` at that layer's own inputs, and their ratio (the *collapse
  indicator*: near 0 means the layer became deterministic, as mean-field fits of
  compositional data do).
- :func:`layer_summary`: the same averaged per layer, with ``KL(q(u^l) || p(u^l))``
  (:func:`~pyro_dgp.diagnostics.kl.layer_kl`).

Both read a DataTree of :func:`~pyro_dgp.diagnostics.export.to_datatree`:
``layer_summary(to_datatree(model, guide, X))``.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from ..deprecation import warn_renamed
from ..guides.draws import check_guide_of
from .export import to_datatree
from .tables import whole

__all__ = ["SAMPLE_DIMS", "layer_order", "layer_summary", "layer_variance"]

#: the dims of an ArviZ group over the guide's draws
SAMPLE_DIMS = ("chain", "draw")


def _as_datatree(dt, guide, X, where: str, kwargs: dict) -> xr.DataTree:
    """``dt`` itself; the old form ``(model, guide, X)`` (or a tuple of them) built into one by
    ``to_datatree``, warned."""
    if isinstance(dt, xr.DataTree) and guide is None and X is None and not kwargs:
        return dt
    model = dt
    if isinstance(dt, tuple):
        model, guide, X = dt
    if isinstance(model, xr.DataTree):
        raise TypeError(f"{where} takes a DataTree alone: {sorted(kwargs)} are arguments of "
                        f"to_datatree, which drew it")
    if guide is None or X is None:
        raise TypeError(f"{where} takes a DataTree: {where}(to_datatree(model, guide, X, "
                        f"...)), got {type(dt).__name__}")
    warn_renamed(f"{where}(model, guide, X, ...)",
                 f"{where}(to_datatree(model, guide, X, ...))")
    check_guide_of(model, guide, where)
    return to_datatree(model, guide, X, **kwargs)


def layer_variance(dt: xr.DataTree, guide=None, X=None, **kwargs) -> xr.Dataset:
    """Per layer and input point: ``<layer>.post_mean``, ``<layer>.post_var`` (over the guide's
    draws: ``mean_s var_s + var_s mean_s`` from the attached Gaussians, or the variance of the
    sampled values), ``<layer>.prior_var`` (``k_l(x, x)`` at the layer's inputs, averaged over
    draws) and ``<layer>.var_ratio`` = posterior / prior variance.

    :param dt: a DataTree from :func:`~pyro_dgp.diagnostics.export.to_datatree`. (Deprecated:
        ``model, guide, X`` with keyword arguments of ``to_datatree``, or a tuple of them.)
    """
    dt = _as_datatree(dt, guide, X, "layer_variance", kwargs)
    ds = dt["layers"].to_dataset()
    out = {}
    for lname in layer_order(dt):
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


def layer_order(dt: xr.DataTree) -> list[str]:
    """The layers of a DataTree of :func:`~pyro_dgp.diagnostics.export.to_datatree`, first
    to last."""
    order = dt["layers"].attrs.get("layer_order")
    if order is None:
        names = [str(v)[: -len(".f")] for v in dt["layers"].data_vars if str(v).endswith(".f")]
        return names
    return [order] if isinstance(order, str) else [str(o) for o in order]


def layer_summary(dt: xr.DataTree, guide=None, X=None, **kwargs):
    """One row per layer (first to last), a ``pandas.DataFrame`` (printed whole) with columns

    - ``f_mean``, ``f_var``: posterior mean and variance of ``f^l``, averaged over the input
      points and the layer's units;
    - ``prior_var``: ``k_l(x, x)`` at the layer's own inputs, averaged likewise;
    - ``var_ratio``: the mean over points and units of posterior / prior variance (the
      collapse indicator: near 0 means the layer is deterministic under q; mean-field guides
      collapse the inner layers of compositional fits, Ustyuzhaninov et al. 2020), with
      ``var_ratio_median`` and ``var_ratio_max``;
    - ``kl``: ``KL(q(u^l) || p(u^l))`` (:func:`~pyro_dgp.diagnostics.kl.layer_kl`; ``nan``
      if not computed).

    :param dt: a DataTree from :func:`~pyro_dgp.diagnostics.export.to_datatree`:
        ``layer_summary(to_datatree(model, guide, X))``. (Deprecated: ``model, guide, X`` with
        keyword arguments of ``to_datatree``, or a tuple of them.)
    """
    import pandas as pd

    dt = _as_datatree(dt, guide, X, "layer_summary", kwargs)
    lv = layer_variance(dt)
    attrs = dt["layers"].attrs
    rows = []
    for lname in layer_order(dt):
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
    return whole(pd.DataFrame(rows).set_index("layer"))
