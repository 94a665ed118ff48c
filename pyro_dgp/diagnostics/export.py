"""ArviZ export (``xarray.DataTree`` via ``arviz_base.from_dict``) and comparison of guides.

:func:`to_datatree` draws ``S`` i.i.d. samples from a guide exactly as
:func:`~pyro_dgp.predict` does (the guide traced once under ``pyro.plate("_predictive_samples",
S, dim=-2)``, vectorised, under ``torch.no_grad()``, seeded without touching the global random
state) and stores them in ArviZ groups:

``posterior``
    ``<layer>.u``: the inducing outputs of every GP layer, dims ``(chain, draw, <layer>_unit,
    <layer>_inducing)``, in the layer's own parameterisation (whitened ``v`` with ``u = L v``
    when the layer is whitened; see the group attribute ``whitened``). Plus every other global
    latent site the guide samples (Bayesian hyperparameters, ``PyroSample``), dims ``(chain,
    draw, <site>_dim<k>...)``.
``layers``
    per layer, at the data ``X`` (dim ``obs``) or at ``grid`` (dim ``grid``): ``<layer>.f`` the
    sampled function values, ``<layer>.f_mean`` / ``<layer>.f_var`` the Gaussian each value was
    drawn from (the marginal the guide attached, :func:`~pyro_dgp.layer.marginal_of`), dims
    ``(chain, draw, obs, <layer>_unit)``, and ``<layer>.prior_var`` = ``k_l(x, x)`` at the
    layer's own inputs in that draw, dims ``(chain, draw, obs)``. Group attributes
    ``<layer>.kl`` hold ``KL(q(u^l) || p(u^l))`` (see :func:`pyro_dgp.diagnostics.layer_kl`),
    ``layer_order`` the layers first to last.
``posterior_predictive``, ``log_likelihood``, ``observed_data``
    per observation site of the model (``y`` for a :class:`~pyro_dgp.DeepGP`), dims ``(chain,
    draw, obs)``. ``log_likelihood`` is ``log int p(y_i | f) N(f; loc_s, var_s) df`` with the
    last layer's Gaussian of draw ``s`` (the per-draw term of the predictive mixture of
    :func:`~pyro_dgp.predict`, so ``logsumexp_s - log S`` is ``predict(...).log_prob(y)``).
    For a likelihood that scores a sampled ``f`` (a hand-written ``dist.Normal(f, s)``) it is
    ``log p(y_i | f_s)``. Only with ``y``, except ``posterior_predictive`` which is also drawn
    without ``y``.
``constant_data``
    ``X`` (dims ``obs, input_dim``) and, with a grid, ``grid`` (dims ``grid, input_dim``).

SVI draws are i.i.d., so they form one chain. Root attributes: the guide's class name, the
model's point-estimated hyperparameters (``hyper.<path>``, plain floats or lists), and
``num_samples``.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import arviz_base
import numpy as np
import pyro
import torch
import xarray as xr
from pyro import poutine
from pyro.distributions import Delta, MaskedDistribution
from pyro.poutine.util import site_is_subsample

from ..gp.sites import function_site, inducing_site, layer_site
from ..guides.base import shared_draws
from ..likelihoods.base import _Expected
from ..likelihoods.marginal import source_of
from ..prediction.mixture import set_up_guide
from ..rng import seeded
from ..validation import check_inputs, check_positive_int

__all__ = [
    "to_datatree",
    "save_datatree",
    "load_datatree",
    "compare_guides",
    "loo",
    "variational_pareto_k",
    "VariationalPSIS",
    "point_hyperparameters",
]

SAMPLE_PLATE = "_predictive_samples"


# --------------------------------------------------------------------------------- helpers
def dim_name(name: str) -> str:
    """A dimension-safe version of a site or layer name (``a.b-c`` -> ``a_b_c``)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def _draws(value: torch.Tensor, event_dim: int, S: int) -> torch.Tensor | None:
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


def _unwrap(fn):
    while isinstance(fn, MaskedDistribution):
        fn = fn.base_dist
    return fn


def _trace_guide(guide, args, S: int, replay_trace=None):
    fn = guide if replay_trace is None else poutine.replay(guide, trace=replay_trace)
    with pyro.plate(SAMPLE_PLATE, S, dim=-2), shared_draws(guide):  # f^l: sample paths
        return poutine.trace(fn).get_trace(*args)


def _trace_model(model, guide_trace, args, S: int):
    with pyro.plate(SAMPLE_PLATE, S, dim=-2):
        return poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args)


def _without_local_sites(trace):
    """A copy of ``trace`` without the ``.f`` sites and other per-point sites, for replaying
    the global draws (``u``, hyperparameters, an autoguide's latent) on other inputs."""
    out = trace.copy()
    for name, site in list(out.nodes.items()):
        if site["type"] != "sample":
            continue
        local = any(f.dim is not None and f.dim == -1 for f in site["cond_indep_stack"])
        if function_site(site) is not None or local or site_is_subsample(site):
            out.remove_node(name)
    return out


def f_sites(trace) -> list[tuple[str, dict]]:
    """The ``<layer>.f`` sites of a trace, in the order the model samples them."""
    return [(n, s) for n, s in trace.nodes.items() if s["type"] == "sample" and function_site(s) is not None]


def _layer_name(f_name: str) -> str:
    return f_name.rsplit(".", 1)[0]


def observation_sites(model_trace, guide_trace) -> list[tuple[str, dict]]:
    """Sites of the model that the guide does not provide and that are not layer sites: the
    observations (observed when ``y`` was given, sampled otherwise)."""
    out = []
    for n, s in model_trace.nodes.items():
        if s["type"] != "sample" or site_is_subsample(s) or layer_site(s) is not None:
            continue
        if s["infer"].get("_deterministic") or s["infer"].get("is_auxiliary"):
            continue  # pyro.deterministic and pyro.factor: observed sites, not observations
        if s["is_observed"] or n not in guide_trace.nodes:
            out.append((n, s))
    return out


def pointwise_log_lik(site) -> torch.Tensor:
    """Per-draw, per-point ``log p(y_i | draw)``: the Gaussian-integrated last layer where the
    site scores an expectation (:class:`~pyro_dgp.likelihoods._Expected`), else the site's own
    ``log_prob``. Batch shape as the site's."""
    fn = _unwrap(site["fn"])
    value = site["value"]
    if isinstance(fn, _Expected):  # under the draws' own noise, if Bayesian
        return fn.predictive_log_prob(value)
    return fn.log_prob(value)


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
    attrs = {"guide": type(guide).__name__}
    inner = getattr(guide, "inner", None)
    if inner is not None:
        attrs["inner_guide"] = type(inner).__name__
        attrs["guide"] = f"{type(guide).__name__}({type(inner).__name__})"
    if hasattr(guide, "collapsed"):
        attrs["collapsed"] = int(bool(guide.collapsed))
    return attrs


# ------------------------------------------------------------------------------ to_datatree
def to_datatree(
    model,
    guide,
    X: torch.Tensor,
    y: torch.Tensor | None = None,
    num_samples: int = 100,
    grid: torch.Tensor | None = None,
    seed: int | None = None,
    kl: bool = True,
) -> xr.DataTree:
    """An ArviZ ``DataTree`` of ``num_samples`` guide draws (see the module docstring).

    :param model: a :class:`~pyro_dgp.DeepGP` or any Pyro model made of
        :class:`~pyro_dgp.GPLayer`\\ s, called as ``model(X)`` / ``model(X, y)``.
    :param guide: any guide of the library, a completed autoguide included.
    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` observations or ``None``.
    :param grid: ``(G, D)`` inputs at which the ``layers`` group is evaluated instead of ``X``
        (with the same draws of the global latents: they are replayed).
    :param seed: draw from this seed without touching the global random state; with the same
        seed and ``batch_size >= N`` the draws are those of :func:`~pyro_dgp.predict`.
    :param kl: compute ``KL(q(u^l) || p(u^l))`` per layer into the ``layers`` attributes.
    """
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    args = (X,) if y is None else (X, y)
    if grid is not None:
        check_inputs(grid, X.shape[-1], "grid")
    set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
    with torch.no_grad(), seeded(seed, X.device):
        gtrace = _trace_guide(guide, (X,), S)
        mtrace = _trace_model(model, gtrace, args, S)
        obs = observation_sites(mtrace, gtrace)
        ltrace = gtrace
        if grid is not None:
            ltrace = _trace_guide(guide, (grid,), S, replay_trace=_without_local_sites(gtrace))
        predictive = {}
        for name, site in obs:
            fn = site["fn"]
            predictive[name] = fn.sample() if site["is_observed"] else site["value"]

    fs = f_sites(gtrace)
    if not fs:
        raise ValueError("the guide produced no '<layer>.f' site: is the model made of GPLayers?")
    N = X.shape[-2]
    data: dict[str, dict] = {"posterior": {}, "layers": {}, "constant_data": {}}
    dims: dict[str, list[str]] = {}
    coords: dict[str, np.ndarray] = {
        "obs": np.arange(N),
        "input_dim": np.arange(X.shape[-1]),
    }
    data["constant_data"]["X"] = _np(X)
    dims["X"] = ["obs", "input_dim"]

    # posterior: inducing outputs, from what the model's layers actually received
    u_names, layer_names, whitened = set(), [], {}
    for fname, site in fs:
        layer = function_site(site).layer
        lname = _layer_name(fname)
        layer_names.append(lname)
        d = dim_name(lname)
        u = function_site(site).inducing
        u = u.expand((S,) + u.shape[-2:]) if u.dim() == 2 else u.reshape((S,) + u.shape[-2:])
        var = f"{lname}.u"
        u_names.add(var)
        data["posterior"][var] = _np(u)[None]
        dims[var] = [f"{d}_unit", f"{d}_inducing"]
        coords[f"{d}_unit"] = np.arange(layer.output_dim)
        coords[f"{d}_inducing"] = np.arange(layer.num_inducing)
        whitened[lname] = int(layer.whiten)
    for name, site in gtrace.nodes.items():
        if (
            site["type"] != "sample"
            or site["is_observed"]
            or site_is_subsample(site)
            or layer_site(site) is not None
            or name in u_names
            or (site.get("infer") or {}).get("is_auxiliary")
        ):
            continue
        event_dim = len(site["fn"].event_shape)
        v = _draws(site["value"], event_dim, S)
        if v is None:
            continue
        data["posterior"][name] = _np(v)[None]
        dims[name] = [f"{dim_name(name)}_dim{k}" for k in range(event_dim)]

    # layers: f^l at X or at the grid
    where = "obs" if grid is None else "grid"
    if grid is not None:
        coords["grid"] = np.arange(grid.shape[-2])
        data["constant_data"]["grid"] = _np(grid)
        dims["grid"] = ["grid", "input_dim"]
    for fname, site in f_sites(ltrace):
        layer = function_site(site).layer
        lname = _layer_name(fname)
        d = dim_name(lname)
        value = site["value"]
        shape = value.shape[-2:]
        value = value.expand((S,) + shape)
        data["layers"][f"{lname}.f"] = _np(value)[None]
        source = source_of(site["value"])
        if source is not None:
            loc, fvar = source.loc, source.var
            data["layers"][f"{lname}.f_mean"] = _np(loc.expand((S,) + shape))[None]
            data["layers"][f"{lname}.f_var"] = _np(fvar.expand((S,) + shape))[None]
        # outside the model's call a PyroSample kernel hyperparameter is a fresh sample
        # statement: replaying the guide's trace gives each draw its own value
        with torch.no_grad(), poutine.replay(trace=ltrace):
            kxx = layer.kernel(function_site(site).inputs, diag=True)
        data["layers"][f"{lname}.prior_var"] = _np(kxx.expand(S, shape[0]))[None]
        for suffix in ("f", "f_mean", "f_var"):
            dims[f"{lname}.{suffix}"] = [where, f"{d}_unit"]
        dims[f"{lname}.prior_var"] = [where]

    # observations
    if obs:
        data["posterior_predictive"] = {}
    if y is not None:
        data["log_likelihood"], data["observed_data"] = {}, {}
    for name, site in obs:
        if site["fn"].event_shape:
            raise ValueError(
                f"observation site '{name}' has event shape {tuple(site['fn'].event_shape)}; "
                "to_datatree supports one scalar observation per data point"
            )
        dims[name] = ["obs"]
        data["posterior_predictive"][name] = _np(predictive[name].expand(S, N))[None]
        if site["is_observed"]:
            with torch.no_grad():
                lp = pointwise_log_lik(site)
            data["log_likelihood"][name] = _np(lp.expand(S, N))[None]
            data["observed_data"][name] = _np(site["value"].expand(N))

    root = {**_guide_attrs(guide), "num_samples": S}
    root.update({f"hyper.{k}": v for k, v in point_hyperparameters(model).items()})
    layer_attrs = {"layer_order": list(layer_names), "evaluated_at": where}
    if kl:
        from .layers import layer_kl

        for lname, value in layer_kl(model, guide, X, trace=gtrace).items():
            layer_attrs[f"{lname}.kl"] = float(value)
    attrs = {
        "/": root,
        "posterior": {
            "whitened": [whitened[n] for n in layer_names],
            "layer_order": list(layer_names),
        },
        "layers": layer_attrs,
    }
    return arviz_base.from_dict(data, dims=dims, coords=coords, attrs=attrs)


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


# ------------------------------------------------------------------------------ comparison
def loo(dt: xr.DataTree, var_name: str | None = None, pointwise: bool = True):
    """``arviz_stats.loo`` of one guide's DataTree, robust to draw-independent points.

    Where the last layer's Gaussian does not depend on the draw (a one-layer model with a
    collapsed guide: ``u`` is integrated out), every draw gives the same ``log p(y_i)`` and
    Pareto smoothing cannot fit a tail; the exact answer there is uniform weights (k = 0),
    which is what this passes to ``arviz_stats.loo`` for those points.
    """
    import arviz_stats

    if "log_likelihood" not in dt.children:
        raise ValueError("the DataTree has no log_likelihood group: build it with y")
    group = dt["log_likelihood"]
    if var_name is None:
        names = [str(v) for v in group.data_vars]
        if len(names) != 1:
            raise ValueError(f"several observed variables {names}: pass var_name")
        var_name = names[0]
    ll = group[var_name]
    sample = ("chain", "draw")
    spread = ll.max(sample) - ll.min(sample)
    flat = spread <= 1e-10 * (1 + abs(ll).max(sample))
    if not bool(flat.any()):
        return arviz_stats.loo(dt, pointwise=pointwise, var_name=var_name)
    obs_dims = [d for d in ll.dims if d not in sample]
    stacked = ll.stack(_point=obs_dims)
    keep = ~flat.stack(_point=obs_dims).values
    n = ll.sizes["chain"] * ll.sizes["draw"]
    lw = xr.full_like(stacked, -math.log(n))
    k = xr.zeros_like(stacked.isel(chain=0, draw=0, drop=True))
    if keep.any():
        part_lw, part_k = stacked.isel(_point=keep).azstats.psislw(r_eff=1.0, dim=list(sample))
        lw[..., keep] = part_lw.transpose(*stacked.dims).values
        k[keep] = part_k.values
    lw = lw.unstack("_point").transpose(*ll.dims)
    k = k.unstack("_point")
    return arviz_stats.loo(dt, pointwise=pointwise, var_name=var_name, log_weights=lw, pareto_k=k)


def compare_guides(datatrees: dict, method: str = "stacking", var_name: str | None = None):
    """PSIS-LOO comparison of guides of one model: ``arviz_stats.compare`` of :func:`loo` of
    each ``{name: to_datatree(model, guide, X, y)}``.

    :returns: a ``pandas.DataFrame`` ordered best first (column ``rank``: 0 is best; ``elpd``,
        ``elpd_diff``, ``weight``, ``se``...), as :func:`arviz_stats.compare`.
    """
    import arviz_stats

    if len(datatrees) < 2:
        raise ValueError("compare_guides needs at least two DataTrees")
    elpds = {name: loo(dt, var_name=var_name) for name, dt in datatrees.items()}
    return arviz_stats.compare(elpds, method=method)


class VariationalPSIS:
    """Result of :func:`variational_pareto_k`.

    :ivar k: the Pareto shape estimate k-hat (< 0.7: q usable for importance sampling / close
        to the posterior; > 0.7: unreliable, Yao et al. 2018).
    :ivar log_weights: ``(S,)`` raw log importance weights ``log p(y, u) - log q(u)``.
    :ivar smoothed_log_weights: ``(S,)`` normalised Pareto-smoothed log weights.
    :ivar ess: effective sample size of the smoothed weights.
    :ivar elbo: ``mean(log_weights)`` (an ELBO estimate); :ivar log_marginal: the importance
        sampling estimate ``logsumexp(log_weights) - log S`` of ``log p(y)``.
    """

    def __init__(self, log_weights: np.ndarray, smoothed: np.ndarray, k: float):
        self.log_weights, self.smoothed_log_weights, self.k = log_weights, smoothed, float(k)
        w = np.exp(smoothed - np.max(smoothed))
        w /= w.sum()
        self.ess = float(1.0 / np.sum(w**2))
        self.elbo = float(np.mean(log_weights))
        m = float(np.max(log_weights))
        self.log_marginal = m + float(np.log(np.mean(np.exp(log_weights - m))))

    def __float__(self) -> float:
        return self.k

    def __repr__(self) -> str:
        return (
            f"VariationalPSIS(k={self.k:.3f}, ess={self.ess:.1f}, elbo={self.elbo:.3f}, "
            f"log_marginal={self.log_marginal:.3f}, S={len(self.log_weights)})"
        )


def guide_log_density(guide, guide_trace, S: int) -> torch.Tensor:
    """``(S,)`` log q of each draw of the global latents in ``guide_trace``: the sum of
    ``log_prob`` over the guide's sample sites other than the layer function values (auxiliary
    sites and transformed ``Delta`` sites included, as Pyro's ELBOs count them). A guide whose
    ``<layer>.u`` sites do not score ``q`` itself (the joint guides ``Coupled`` and ``Chain``
    score ``log p(u^l)`` plus their closed-form KL) gives the joint density of its layers'
    draws through ``layers_log_q(guide_trace, S)``.

    :raises ValueError: when the guide has no tractable density (``tractable_log_q = False`` on
        the guide, a site whose distribution has no ``log_prob``, or a point mass).
    """
    if getattr(guide, "tractable_log_q", True) is False:
        raise ValueError(
            f"{type(guide).__name__} has no tractable log q(u) (implicit / semi-implicit "
            "guide): the variational Pareto-k diagnostic needs log q"
        )
    terms = []
    sites = [
        (n, s)
        for n, s in guide_trace.nodes.items()
        if s["type"] == "sample"
        and not s["is_observed"]
        and not site_is_subsample(s)
        and function_site(s) is None
    ]
    has_aux = any((s.get("infer") or {}).get("is_auxiliary") for _, s in sites)
    layers_log_q = getattr(guide, "layers_log_q", None)
    if layers_log_q is not None:
        terms.append(layers_log_q(guide_trace, S))
        sites = [(n, s) for n, s in sites if inducing_site(s) is None]
    for name, site in sites:
        fn = _unwrap(site["fn"])
        base = fn
        while hasattr(base, "base_dist") and not isinstance(base, Delta):
            base = base.base_dist
        if isinstance(base, Delta) and not has_aux:
            raise ValueError(
                f"{type(guide).__name__}: site '{name}' is a point mass (Delta) with no "
                "auxiliary density: q has no density, the variational Pareto-k is undefined"
            )
        try:
            lp = site["fn"].log_prob(site["value"])
        except NotImplementedError as err:
            raise ValueError(
                f"{type(guide).__name__}: site '{name}' has no tractable log-density "
                f"({type(fn).__name__}); the variational Pareto-k diagnostic needs log q"
            ) from err
        terms.append(_per_draw_sum(lp, S))
    if not terms:
        raise ValueError(f"{type(guide).__name__}: the guide sampled no global latent")
    total = torch.stack(terms).sum(0)
    if not bool(torch.isfinite(total).all()):
        raise ValueError(f"{type(guide).__name__}: log q is not finite for some draws")
    return total


def _per_draw_sum(lp: torch.Tensor, S: int) -> torch.Tensor:
    """Sum a log-density of batch shape ``(S, n)`` (or broadcastable) over all but draws."""
    if lp.dim() == 0:
        return lp.expand(S)
    if lp.dim() == 1:  # (n,) without the sample dim: the same for every draw
        return lp.sum().expand(S)
    return lp.sum(-1).reshape(-1).expand(S)


def variational_pareto_k(
    model,
    guide,
    X: torch.Tensor,
    y: torch.Tensor,
    num_samples: int = 1000,
    seed: int | None = None,
) -> VariationalPSIS:
    """PSIS diagnostic of the variational approximation (Yao, Vehtari, Simpson & Gelman 2018).

    ``S`` draws ``theta_s ~ q`` are weighted by ``log w_s = log p(y, theta_s) - log q(theta_s)``
    and a generalised Pareto distribution is fitted to the largest weights; its shape k-hat
    says how far q is from the posterior for importance sampling purposes (k < 0.5 good,
    0.5-0.7 usable, > 0.7 unreliable).

    What ``theta`` is: the guide's global latents (every layer's inducing outputs ``u``, plus
    Bayesian hyperparameters if any), drawn from the guide; ``log q`` is the guide's own density
    of that draw (:func:`guide_log_density`). The model is then replayed on those draws and
    **draws its own function values** ``f^l ~ p(f^l | u^l, f^{l-1})`` for the inner layers
    (the sampled-u estimator, whatever estimator the guide uses in training), while the last
    layer is integrated out per point (Rao-Blackwellised):

        log w_s = log p(u_s) + sum_i log int p(y_i | f) N(f; m_i(u^L_s, f^{L-1}_s),
                  v_i(u^L_s, f^{L-1}_s)) df - log q(u_s)

    - One layer: exact, ``log w = log p(y, u) - log q(u)`` for the model as the Pyro program
      defines it (function values conditionally independent across points given ``u``), so
      k-hat diagnoses q(u) against the exact posterior ``p(u | y)``.
    - L > 1 layers: it is the exact importance weight of the extended proposal
      ``q(u) prod_{l<L} p(f^l | u^l, f^{l-1})`` against the posterior ``p(u, f^{1..L-1} | y)``
      (the ``p(f | u)`` factors cancel); ``E_q[w] = p(y)``, but the diagnostic is of
      ``q(u)`` *augmented with the prior conditionals of the inner layers*, which can only be
      worse than q(u) alone, not of ``q(u)`` against ``p(u | y)`` (that would need
      ``p(y | u)``, an intractable integral over the inner layers).
    - A likelihood that scores a sampled ``f`` (hand-written ``dist.Normal(f, s)``) is not
      integrated: the last layer is then part of the extended proposal too.

    Guides without a tractable ``log q`` (implicit or semi-implicit ones, point masses) raise
    ``ValueError``. Pass the full data: a minibatch is scaled by the model's ``num_data``.

    :returns: :class:`VariationalPSIS` (``.k``, ``.log_weights``, ``.ess``, ``.elbo``,
        ``.log_marginal``).
    """
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
    with torch.no_grad(), seeded(seed, X.device):
        gtrace = _trace_guide(guide, (X,), S)
        log_q = guide_log_density(guide, gtrace, S)
        mtrace = _trace_model(model, _without_local_sites(gtrace), (X, y), S)
        log_p = torch.zeros_like(log_q)
        for name, site in mtrace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site) or function_site(site) is not None:
                continue
            scale = site["scale"]
            if site["is_observed"] and name not in gtrace.nodes:
                lp = pointwise_log_lik(site)
            elif name in gtrace.nodes and not site["is_observed"] or inducing_site(site) is not None:
                lp = site["fn"].log_prob(site["value"])
            else:
                continue
            log_p = log_p + scale * _per_draw_sum(lp, S)
    log_w = _np(log_p - log_q).astype(np.float64)
    if not np.all(np.isfinite(log_w)):
        raise ValueError("non-finite importance weights: check the model and guide")
    smoothed, k = pareto_smooth(log_w)
    return VariationalPSIS(log_w, smoothed, k)


def pareto_smooth(log_w: np.ndarray) -> tuple[np.ndarray, float]:
    """``(normalised smoothed log-weights (S,), k-hat)`` of raw log-weights ``(S,)``.

    ArviZ's PSIS returns NaN weights with k-hat 0.1 once one weight dominates the tail (raw
    log-weights spread over ~1000 nats, as early in a deep model's fit): a "good" k for the
    worst case. There k-hat is reported as ``inf`` with a warning, and the raw weights kept.
    """
    from arviz_stats.base import array_stats

    log_w = np.asarray(log_w, dtype=np.float64)
    with np.errstate(all="ignore"):  # its failure is detected and reported below
        smoothed, k = array_stats.psislw(-(log_w - log_w.max()), r_eff=1.0)  # negates its input
    smoothed, k = np.asarray(smoothed, dtype=np.float64), float(k)
    if not (np.all(np.isfinite(smoothed)) and np.isfinite(k)):
        top = np.sort(log_w)[-2:]
        warnings.warn(
            f"Pareto smoothing failed: the largest importance weight dominates (log-weights "
            f"span {log_w.max() - log_w.min():.0f} nats, the top two differ by "
            f"{top[1] - top[0]:.0f}); k-hat is reported as inf",
            UserWarning, stacklevel=3)
        smoothed, k = log_w, math.inf
    return smoothed - np.logaddexp.reduce(smoothed), k
