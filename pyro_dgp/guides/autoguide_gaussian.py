"""Reading and writing the Gaussian of a Pyro autoguide over the inducing sites.

Pyro's Gaussian autoguides keep their parameters in two layouts: ``AutoNormal`` per site
(``locs.<site>``, ``scales.<site>``), and the ``AutoContinuous`` family over one latent vector
(``AutoDiagonalNormal``: ``loc``, ``scale``; ``AutoMultivariateNormal``: ``loc``,
``scale_tril``; ``AutoLowRankMultivariateNormal``: ``loc``, ``cov_factor``, ``cov_diag``), whose
blocks follow the prototype trace's order of latent sites. Inducing sites have real support,
so the unconstrained latent of a ``.u`` site is the site's value itself.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import constraints
from pyro.infer import autoguide

from .gaussian import LayerGaussian
from .params import copy_into

__all__ = ["autoguide_joint_gaussian", "autoguide_layer_gaussians", "set_autoguide_gaussian",
           "set_autoguide_joint", "set_autoguide_low_rank"]


def _real_support(site) -> bool:
    c = site["fn"].support
    while hasattr(c, "base_constraint"):
        c = c.base_constraint
    return c is constraints.real or c is constraints.real_vector


def _latent_blocks(inner) -> dict[str, slice]:
    """``{site: slice}``: each latent site's entries in an ``AutoContinuous`` latent vector."""
    out, pos = {}, 0
    for name, _ in inner.prototype_trace.iter_stochastic_nodes():
        size = math.prod(inner._unconstrained_shapes[name])
        out[name] = slice(pos, pos + size)
        pos += size
    return out


def _gaussian_base(inner):
    """The Gaussian of an ``AutoContinuous`` guide's latent vector, or ``None`` (a flow)."""
    try:
        base = inner.get_posterior()
    except (NotImplementedError, AttributeError):
        return None
    while isinstance(base, torch.distributions.Independent):
        base = base.base_dist
    kinds = (torch.distributions.Normal, torch.distributions.LowRankMultivariateNormal,
             torch.distributions.MultivariateNormal)
    return base if isinstance(base, kinds) else None


def autoguide_layer_gaussians(inner, names: list[str]) -> dict[str, LayerGaussian]:
    """``{u_site: LayerGaussian}`` of the inducing sites ``names`` where ``inner`` is a known
    Gaussian; a site is left out where it is not (e.g. a normalising flow)."""
    out = {}
    if isinstance(inner, autoguide.AutoNormal):
        for name in names:
            site = inner.prototype_trace.nodes.get(name)
            if site is None or not _real_support(site):
                continue
            loc, scale = inner._get_loc_and_scale(name)
            M = site["value"].shape[-1]
            out[name] = LayerGaussian(loc.reshape(-1),
                                      row_trils=torch.diag_embed(scale.reshape(-1, M)))
        return out
    if not isinstance(inner, autoguide.AutoContinuous) or inner.prototype_trace is None:
        return out
    base = _gaussian_base(inner)
    if base is None:
        return out
    mean = base.loc.reshape(-1)
    for name, sl in _latent_blocks(inner).items():
        site = inner.prototype_trace.nodes[name]
        if name not in names or not _real_support(site):
            continue
        if isinstance(base, torch.distributions.Normal):
            M = site["value"].shape[-1]
            g = LayerGaussian(mean[sl], row_trils=torch.diag_embed(
                base.scale.reshape(-1)[sl].reshape(-1, M)))
        elif isinstance(base, torch.distributions.LowRankMultivariateNormal):
            # rows of [W | diag(sqrt d)], whose product is W W^T + diag d
            g = LayerGaussian(mean[sl], rows=torch.cat(
                [base.cov_factor[sl], torch.diag(base.cov_diag[sl].sqrt())], -1))
        else:  # the joint lower-triangular factor: the block's columns end at its own
            g = LayerGaussian(mean[sl], rows=base.scale_tril[sl, : sl.stop])
        out[name] = g
    return out


def autoguide_joint_gaussian(inner, names: list[str]) -> LayerGaussian | None:
    """The joint Gaussian of the sites ``names`` (in that order) of an ``AutoContinuous``
    guide, with its correlations, as a :class:`LayerGaussian` over the concatenated sites;
    ``None`` where ``inner`` is not one (its sites are then independent or not Gaussian)."""
    if not isinstance(inner, autoguide.AutoContinuous) or inner.prototype_trace is None:
        return None
    base = _gaussian_base(inner)
    if base is None or isinstance(base, torch.distributions.Normal):
        return None
    blocks = _latent_blocks(inner)
    idx = torch.cat([torch.arange(blocks[n].start, blocks[n].stop) for n in names])
    if isinstance(base, torch.distributions.LowRankMultivariateNormal):
        factor = torch.cat([base.cov_factor, torch.diag(base.cov_diag.sqrt())], -1)
    else:
        factor = base.scale_tril
    return LayerGaussian(base.loc.reshape(-1)[idx], rows=factor[idx])


def set_autoguide_joint(inner, names: list[str], loc: torch.Tensor,
                        scale_tril: torch.Tensor) -> bool:
    """Set the joint of the sites ``names`` of an ``AutoMultivariateNormal`` to ``N(loc,
    scale_tril scale_tril^T)``, independent of its other latents; ``False`` (nothing set)
    for any other guide."""
    if not isinstance(inner, autoguide.AutoMultivariateNormal):
        return False
    blocks = _latent_blocks(inner)
    idx = torch.cat([torch.arange(blocks[n].start, blocks[n].stop) for n in names])
    cov = inner.get_posterior().covariance_matrix.detach().clone()
    cov[idx, :] = 0
    cov[:, idx] = 0
    cov[idx[:, None], idx[None, :]] = scale_tril @ scale_tril.mT
    new_loc = inner.loc.detach().clone()
    new_loc[idx] = loc
    _write_mvn(inner, new_loc, torch.linalg.cholesky(cov))
    return True


def set_autoguide_low_rank(inner, names: list[str], q) -> bool:
    """Set an ``AutoLowRankMultivariateNormal`` whose latents are exactly the sites ``names``
    to the ``LowRankMultivariateNormal`` ``q`` of the same rank (it holds ``W = F s``,
    ``d = s^2``); ``False`` (nothing set) for any other guide."""
    if not isinstance(inner, autoguide.AutoLowRankMultivariateNormal):
        return False
    if list(_latent_blocks(inner)) != list(names) or q.cov_factor.shape[-1] != inner.rank:
        raise ValueError(f"set_q: AutoLowRankMultivariateNormal (rank {inner.rank}) is set "
                         "from a LowRankMultivariateNormal of the same rank over all its sites")
    scale = q.cov_diag.sqrt()
    copy_into(inner, "loc", q.loc)
    copy_into(inner, "scale", scale)
    copy_into(inner, "cov_factor", q.cov_factor / scale.unsqueeze(-1))
    return True


def _write_mvn(inner, loc: torch.Tensor, L: torch.Tensor) -> None:
    """``AutoMultivariateNormal`` holds ``L = diag(scale) U``, ``U`` unit lower triangular."""
    scale = L.diagonal()
    copy_into(inner, "loc", loc)
    copy_into(inner, "scale", scale)
    copy_into(inner, "scale_tril", L / scale.unsqueeze(-1))


def set_autoguide_gaussian(inner, name: str, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
    """Set ``q`` of site ``name`` of ``inner`` to ``N(loc, scale_tril scale_tril^T)``,
    independent of its other latents (``AutoNormal``, ``AutoDiagonalNormal``: diagonal
    ``scale_tril`` only; ``AutoMultivariateNormal``: any).

    :raises ValueError: where ``inner`` cannot represent it."""
    what = type(inner).__name__
    diagonal = torch.equal(scale_tril, torch.diag_embed(scale_tril.diagonal()))
    if isinstance(inner, autoguide.AutoNormal | autoguide.AutoDiagonalNormal) and not diagonal:
        raise ValueError(f"set_q: {what} has a diagonal covariance; q of '{name}' is not "
                         "diagonal")
    if isinstance(inner, autoguide.AutoNormal):
        shape = inner.prototype_trace.nodes[name]["value"].shape
        copy_into(inner.locs, name, loc.reshape(shape))
        copy_into(inner.scales, name, scale_tril.diagonal().reshape(shape))
        return
    sl = _latent_blocks(inner)[name] if isinstance(inner, autoguide.AutoContinuous) else None
    if isinstance(inner, autoguide.AutoDiagonalNormal):
        copy_into(inner, "loc", torch.cat([inner.loc[: sl.start], loc, inner.loc[sl.stop :]]))
        scale = inner.scale.detach().clone()
        scale[sl] = scale_tril.diagonal()
        copy_into(inner, "scale", scale)
        return
    if isinstance(inner, autoguide.AutoMultivariateNormal):
        set_autoguide_joint(inner, [name], loc, scale_tril)
        return
    raise ValueError(f"set_q: setting q is supported for AutoNormal, AutoDiagonalNormal and "
                     f"AutoMultivariateNormal, not {what}")
