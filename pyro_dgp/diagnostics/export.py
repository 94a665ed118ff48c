"""ArviZ export (``xarray.DataTree`` via ``arviz_base.from_dict``) and comparison of guides.

:func:`to_datatree` draws ``S`` i.i.d. samples from a guide exactly as
:func:`~pyro_dgp.prediction.predictive.predict` does (the guide traced once by
:func:`~pyro_dgp.guides.draws.trace_draws`, vectorised, under ``torch.no_grad()``, seeded without
touching the global random state) and stores them in ArviZ groups:

``posterior``
    ``<layer>.u``: the inducing outputs of every GP layer, dims ``(chain, draw, <layer>_unit,
    <layer>_inducing)`` (``(chain, draw, obs, <layer>_unit, <layer>_inducing)`` for a layer
    with one ``u`` per point, :class:`~pyro_dgp.AmortizedGPLayer`), in the layer's own
    parameterisation (whitened ``v`` with ``u = L v`` when the layer is whitened; see the group
    attribute ``whitened``). Plus every other global
    latent site the guide samples (Bayesian hyperparameters, ``PyroSample``), dims ``(chain,
    draw, <site>_dim<k>...)``.
``layers``
    per layer, at the data ``X`` (dim ``obs``) or at ``grid`` (dim ``grid``): ``<layer>.f`` the
    sampled function values, ``<layer>.f_mean`` / ``<layer>.f_var`` the marginal Gaussian each
    value was drawn from (the one the guide attached,
    :func:`~pyro_dgp.likelihoods.marginal.source_of`). With ``paths`` (default: on a grid)
    the values of a draw are one composition of functions, each layer's ``f`` drawn jointly
    over the points given the draw's ``u`` (:func:`~pyro_dgp.guides.protocol.sample_paths`,
    ``O(G^3)`` per layer and draw for ``G`` points); otherwise each point is drawn from its own
    marginal (the guide's estimator, as for predictions). Group attribute ``sample_paths``
    (1 or 0) says which. Dims
    ``(chain, draw, obs, <layer>_unit)``, and ``<layer>.prior_var`` = ``k_l(x, x)`` at the
    layer's own inputs in that draw, dims ``(chain, draw, obs)`` (plus ``<layer>_unit`` where
    each output has its own kernel). A layer with per-point
    inducing inputs (:class:`~pyro_dgp.AmortizedGPLayer`) adds ``<layer>.inducing_inputs``,
    the ``Z_n = A(P(F_n))`` at which the guide placed each point's ``u_n``, dims ``(chain,
    draw, obs, <layer>_inducing, <layer>_input)``. Group attributes
    ``<layer>.kl`` hold ``KL(q(u^l) || p(u^l))`` (see :func:`~pyro_dgp.diagnostics.kl.layer_kl`),
    ``layer_order`` the layers first to last.
``posterior_predictive``, ``log_likelihood``, ``observed_data``
    per observation site of the model (``y`` for a :class:`~pyro_dgp.DeepGP`), dims ``(chain,
    draw, obs)``. ``log_likelihood`` is ``log int p(y_i | f) N(f; loc_s, var_s) df`` with the
    last layer's Gaussian of draw ``s`` (the per-draw term of the predictive mixture of
    :func:`~pyro_dgp.prediction.predictive.predict`, so ``logsumexp_s - log S`` is
    ``predict(...).log_prob(y)``; an ``AR2P``/``AR2PP`` guide's draws here take its nodes by
    resampling from their weights, a Monte Carlo version of its weighted ``predict``).
    For a likelihood that scores a sampled ``f`` (a hand-written ``dist.Normal(f, s)``) it is
    ``log p(y_i | f_s)``. Only with ``y``, except ``posterior_predictive`` which is also drawn
    without ``y``.
``constant_data``
    ``X`` (dims ``obs, input_dim``) and, with a grid, ``grid`` (dims ``grid, input_dim``).

SVI draws are i.i.d., so they form one chain. Root attributes: the guide's class name, the
model's point-estimated hyperparameters (``hyper.<path>``, plain floats or lists), and
``num_samples``. A DataTree is written to and read from NetCDF-4 or Zarr by
:func:`save_datatree` and :func:`load_datatree`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import arviz_base
import numpy as np
import torch
import xarray as xr
from pyro import poutine
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..errors import user_errors_first
from ..gp.sites import function_site, layer_site
from ..guides.draws import (
    check_guide_of,
    function_sites,
    global_draws,
    observation_log_prob,
    observation_sites,
    set_up_guide,
    trace_draws,
    trace_model,
)
from ..guides.protocol import protocol_of
from ..likelihoods.marginal import source_of
from ..rng import seeded
from ..validation import check_inputs, check_positive_int
from .kl import layer_kl

__all__ = ["to_datatree", "save_datatree", "load_datatree", "point_hyperparameters"]


# --------------------------------------------------------------------------------- helpers
def dim_name(name: str) -> str:
    """A dimension-safe version of a site or layer name (``a.b-c`` -> ``a_b_c``)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _per_draw(value: torch.Tensor, event_dim: int, S: int) -> torch.Tensor | None:
    """``(S, 1, *event)`` (or anything broadcasting to one value per draw) -> ``(S, *event)``;
    ``None`` for a site with more than one value per draw (a local latent)."""
    event = value.shape[value.dim() - event_dim :] if event_dim else torch.Size()
    batch = value.shape[: value.dim() - event_dim]
    n = math.prod(batch)
    if n == S:
        return value.reshape((S,) + event)
    if n == 1:
        return value.reshape(event).expand((S,) + event)
    return None


def _layer_name(f_name: str) -> str:
    return f_name.rsplit(".", 1)[0]


def point_hyperparameters(model, max_size: int = 64) -> dict[str, float | list]:
    """The model's point-estimated (``PyroParam``) hyperparameters as plain floats or lists.

    Keys are module paths with GP layers named by their site prefix, e.g.
    ``layer1.kernel.kernels.0.lengthscale`` or ``likelihood.variance``. Inducing inputs and
    any parameter with more than ``max_size`` entries are left out.
    """
    if not isinstance(model, torch.nn.Module):
        return {}
    from ..gp.layer import GPLayer

    renames = {path: m.name for path, m in model.named_modules() if isinstance(m, GPLayer) and path}
    out = {}
    with torch.no_grad():
        for path, module in model.named_modules():
            for pname in getattr(module, "_pyro_params", {}):
                if pname == "inducing_points":
                    continue
                value = getattr(module, pname)
                if not isinstance(value, torch.Tensor) or value.numel() > max_size:
                    continue
                key = f"{path}.{pname}" if path else pname
                for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0])):
                    if key.startswith(old + "."):
                        key = new + key[len(old) :]
                        break
                v = _np(value).astype(float)
                out[key] = float(v) if v.ndim == 0 else v.reshape(-1).tolist()
    return out


def _guide_attrs(guide) -> dict:
    return protocol_of(guide).export_attrs()


# ------------------------------------------------------------------------------ to_datatree
@dataclass
class _Draws:
    """The traced draws behind a DataTree: the guide's at ``X``, the guide's at the layers'
    evaluation points (``X`` or a grid), and the observation sites of the model replayed on
    the draws with a posterior-predictive draw of each."""

    guide_trace: Trace
    layer_trace: Trace
    observations: list[tuple[str, dict]]
    predictive: dict[str, torch.Tensor]


class _Parts:
    """The arguments of ``arviz_base.from_dict``, filled group by group."""

    def __init__(self, X: torch.Tensor):
        self.data: dict[str, dict] = {"posterior": {}, "layers": {}, "constant_data": {}}
        self.dims: dict[str, list[str]] = {}
        self.coords: dict[str, np.ndarray] = {
            "obs": np.arange(X.shape[-2]),
            "input_dim": np.arange(X.shape[-1]),
        }
        self.attrs: dict[str, dict] = {"/": {}, "posterior": {}, "layers": {}}
        self.add("constant_data", "X", _np(X), ["obs", "input_dim"])

    def add(self, group: str, name: str, value: np.ndarray, dims: list[str]) -> None:
        self.data.setdefault(group, {})[name] = value
        self.dims[name] = dims


@user_errors_first
def to_datatree(
    model,
    guide,
    X: torch.Tensor,
    y: torch.Tensor | None = None,
    num_samples: int = 100,
    grid: torch.Tensor | None = None,
    seed: int | None = 0,
    kl: bool = True,
    paths: bool | None = None,
) -> xr.DataTree:
    """An ArviZ ``DataTree`` of ``num_samples`` guide draws (see the module docstring).

    :param model: a :class:`~pyro_dgp.DeepGP` or any Pyro model made of
        :class:`~pyro_dgp.GPLayer`\\ s, called as ``model(X)`` / ``model(X, y)``.
    :param guide: any guide of the library, a completed autoguide included.
    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` observations or ``None``.
    :param grid: ``(G, D)`` inputs at which the ``layers`` group is evaluated instead of ``X``
        (with the same draws of the global latents: they are replayed).
    :param seed: draw from this seed without touching the global random state (``None``:
        from the global random state); with the same seed and ``chunk_rows >= N`` the draws are
        those of :func:`~pyro_dgp.prediction.predictive.predict`.
    :param kl: compute ``KL(q(u^l) || p(u^l))`` per layer into the ``layers`` attributes.
    :param paths: draw the ``layers`` group as sample paths (module docstring); default: on a
        ``grid`` only. Needs a layer guide of the library.
    """
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    if grid is not None:
        check_inputs(grid, X.shape[-1], "grid")
    paths = grid is not None if paths is None else bool(paths)
    draws = _draw(model, guide, X, y, grid, S, seed, paths)
    if not function_sites(draws.guide_trace):
        raise ValueError("the guide produced no '<layer>.f' site: is the model made of GPLayers?")
    parts = _Parts(X)
    _posterior_group(parts, draws.guide_trace, S)
    _layers_group(parts, draws.layer_trace, grid, S)
    parts.attrs["layers"]["sample_paths"] = int(paths)
    _observation_groups(parts, draws, y is not None, S, X.shape[-2])
    parts.attrs["/"] = {**_guide_attrs(guide), "num_samples": S}
    parts.attrs["/"].update({f"hyper.{k}": v for k, v in point_hyperparameters(model).items()})
    if kl:
        for lname, value in layer_kl(model, guide, X, trace=draws.guide_trace).items():
            parts.attrs["layers"][f"{lname}.kl"] = float(value)
    return arviz_base.from_dict(parts.data, dims=parts.dims, coords=parts.coords,
                                attrs=parts.attrs)


def _draw(model, guide, X, y, grid, S: int, seed: int | None, paths: bool) -> _Draws:
    """The guide's ``S`` draws at ``X``, the model replayed on them, a posterior-predictive
    draw of each observation site, and the layers' draws at ``X`` or ``grid`` (the same global
    draws replayed, as paths if ``paths``)."""
    check_guide_of(model, guide, "to_datatree")
    set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
    with torch.no_grad(), seeded(seed, X.device):
        guide_trace = trace_draws(guide, (X,), S)
        model_trace = trace_model(model, guide_trace, (X,) if y is None else (X, y), S)
        observations = observation_sites(model_trace, guide_trace)
        predictive = {name: site["fn"].sample() if site["is_observed"] else site["value"]
                      for name, site in observations}
        layer_trace = guide_trace
        if grid is not None or paths:
            layer_trace = trace_draws(guide, (X if grid is None else grid,), S,
                                      replay=global_draws(guide_trace), paths=paths)
    return _Draws(guide_trace, layer_trace, observations, predictive)


def _posterior_group(parts: _Parts, trace: Trace, S: int) -> None:
    """``posterior``: every layer's inducing outputs, from what the model's layers actually
    received, then the guide's other global latents."""
    layer_names, whitened = [], []
    for fname, site in function_sites(trace):
        record = function_site(site)
        lname = _layer_name(fname)
        d = dim_name(lname)
        u = record.inducing
        dims = [f"{d}_unit", f"{d}_inducing"]
        if getattr(record.layer, "local_inducing", False):  # one u per point (amortized)
            u = u.reshape((S, len(parts.coords["obs"])) + u.shape[-2:])
            dims = ["obs", *dims]
        elif u.dim() == 2:
            u = u.expand((S,) + u.shape[-2:])
        else:
            u = u.reshape((S,) + u.shape[-2:])
        parts.add("posterior", f"{lname}.u", _np(u)[None], dims)
        parts.coords[f"{d}_unit"] = np.arange(record.layer.output_dim)
        parts.coords[f"{d}_inducing"] = np.arange(record.layer.num_inducing)
        layer_names.append(lname)
        whitened.append(int(record.layer.whiten))
    parts.attrs["posterior"] = {"whitened": whitened, "layer_order": list(layer_names)}
    parts.attrs["layers"]["layer_order"] = list(layer_names)
    u_names = {f"{lname}.u" for lname in layer_names}
    for name, site in trace.nodes.items():
        if name in u_names or not _is_global_latent(site):
            continue
        event_dim = len(site["fn"].event_shape)
        v = _per_draw(site["value"], event_dim, S)
        if v is not None:
            parts.add("posterior", name, _np(v)[None],
                      [f"{dim_name(name)}_dim{k}" for k in range(event_dim)])


def _is_global_latent(site: dict) -> bool:
    """A latent sample site of a guide trace that is not a layer's nor auxiliary (it may
    still be local: :func:`_per_draw` tells)."""
    return not (
        site["type"] != "sample"
        or site["is_observed"]
        or site_is_subsample(site)
        or layer_site(site) is not None
        or (site.get("infer") or {}).get("is_auxiliary")
    )


def _layers_group(parts: _Parts, trace: Trace, grid: torch.Tensor | None, S: int) -> None:
    """``layers``: every layer's function values, the Gaussians they were drawn from and the
    prior variance, at ``X`` or at ``grid``."""
    where = "obs" if grid is None else "grid"
    if grid is not None:
        parts.coords["grid"] = np.arange(grid.shape[-2])
        parts.add("constant_data", "grid", _np(grid), ["grid", "input_dim"])
    for fname, site in function_sites(trace):
        record = function_site(site)
        lname = _layer_name(fname)
        dims = [where, f"{dim_name(lname)}_unit"]
        shape = site["value"].shape[-2:]
        parts.add("layers", f"{lname}.f", _np(site["value"].expand((S,) + shape))[None], dims)
        source = source_of(site["value"])
        if source is not None:
            parts.add("layers", f"{lname}.f_mean", _np(source.loc.expand((S,) + shape))[None],
                      dims)
            parts.add("layers", f"{lname}.f_var", _np(source.var.expand((S,) + shape))[None],
                      dims)
        # outside the model's call a PyroSample kernel hyperparameter is a fresh sample
        # statement: replaying the guide's trace gives each draw its own value
        with torch.no_grad(), poutine.replay(trace=trace):
            kxx = record.layer.prior_variance(record.inputs)  # (..., N, D_out)
        if record.layer.kernel_outputs:  # a kernel per output: a prior variance per unit
            parts.add("layers", f"{lname}.prior_var", _np(kxx.expand((S,) + shape))[None], dims)
        else:
            parts.add("layers", f"{lname}.prior_var", _np(kxx[..., 0].expand(S, shape[0]))[None],
                      [where])
        Z = getattr(trace.nodes.get(f"{lname}.u", {}).get("fn"), "inducing_inputs", None)
        if Z is not None:  # (..., n, M, D_in): one set per point (and per draw, for AR1)
            Z = Z.expand(torch.broadcast_shapes(Z.shape[:-2], (S, shape[0])) + Z.shape[-2:])
            d = dim_name(lname)
            parts.add("layers", f"{lname}.inducing_inputs", _np(Z)[None],
                      [where, f"{d}_inducing", f"{d}_input"])
            parts.coords[f"{d}_input"] = np.arange(Z.shape[-1])
    parts.attrs["layers"]["evaluated_at"] = where


def _observation_groups(parts: _Parts, draws: _Draws, observed: bool, S: int, N: int) -> None:
    """``posterior_predictive`` of every observation site and, with ``y``, its
    ``log_likelihood`` (per draw and point) and ``observed_data``."""
    if draws.observations:
        parts.data["posterior_predictive"] = {}
    if observed:
        parts.data["log_likelihood"], parts.data["observed_data"] = {}, {}
    for name, site in draws.observations:
        if site["fn"].event_shape:
            raise ValueError(
                f"observation site '{name}' has event shape {tuple(site['fn'].event_shape)}; "
                "to_datatree supports one scalar observation per data point"
            )
        value = draws.predictive[name].expand(S, N)
        parts.add("posterior_predictive", name, _np(value)[None], ["obs"])
        if site["is_observed"]:
            with torch.no_grad():
                lp = observation_log_prob(site)
            parts.add("log_likelihood", name, _np(lp.expand(S, N))[None], ["obs"])
            parts.add("observed_data", name, _np(site["value"].expand(N)), ["obs"])


# ------------------------------------------------------------------------------- files
def _is_zarr(path: Path, engine: str | None) -> bool:
    return engine == "zarr" or (engine is None and path.suffix == ".zarr")


def _need_zarr():
    try:
        import zarr  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "saving/loading a DataTree as Zarr needs the 'zarr' package (pip install zarr); "
            "or use a NetCDF path (.nc, h5netcdf engine)"
        ) from err


def save_datatree(dt: xr.DataTree, path: str | os.PathLike, engine: str | None = None) -> Path:
    """Write ``dt`` as NetCDF-4 (h5netcdf engine) or, for a ``.zarr`` path or
    ``engine="zarr"``, as a Zarr store (needs ``zarr``). :returns: the path."""
    path = Path(path)
    if _is_zarr(path, engine):
        _need_zarr()
        dt.to_zarr(path, mode="w")
    else:
        dt.to_netcdf(path, engine="h5netcdf", mode="w")
    return path


def load_datatree(path: str | os.PathLike, engine: str | None = None) -> xr.DataTree:
    """Read a DataTree written by :func:`save_datatree` fully into memory."""
    path = Path(path)
    if _is_zarr(path, engine):
        _need_zarr()
        return xr.load_datatree(path, engine="zarr")
    return xr.load_datatree(path, engine="h5netcdf")
