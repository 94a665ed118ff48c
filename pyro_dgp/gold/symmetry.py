"""The reflection symmetry of two-layer deep GPs, and a gold standard made exactly symmetric.

A two-layer deep GP whose first layer has a zero mean function and whose second layer has an
even mean function (``m(-h) = m(h)``, e.g. zero), an even kernel (``k(-a, -b) = k(a, b)``: every
stationary kernel) and inducing inputs ``Z^2`` that negation permutes (``-Z^2 = P Z^2`` for a
permutation ``P``) has a posterior that is invariant under the reflection

    f^1 -> -f^1,    f^2 -> f^2(-.),

whatever its data: ``f^2(f^1(x))`` is unchanged, and both maps keep the prior (a zero-mean
Gaussian is symmetric; ``h -> f^2(-h)`` is again a GP of mean ``m`` and kernel ``k``). In the
coordinates the samplers and the guides use: ``u^1 -> -u^1`` (whitened or not: its prior mean is
0), the first layer's standard normals at the data ``e^1 -> -e^1`` (:mod:`.posterior`), and
``u^2 -> P u^2`` as function values at ``Z^2``, i.e. ``v^2 -> L^-1 P L v^2`` whitened
(``L L^T = K_ZZ``; that map is orthogonal, so the whitened prior is kept too). The two-mode toy
(:func:`~pyro_dgp.gold.two_mode_model`) and the symmetric toy
(:func:`~pyro_dgp.gold.symmetric_model`) are such models: each mode of ``f^1`` (rising or
falling) has mass exactly one half.

NUTS's chains sit in the mode they start in, and stacking cannot weigh two modes that predict
alike (:mod:`.chains`), so for such a model :func:`symmetrised` adds the reflection of every
chain, each group and its mirror image sharing the group's weight: the gold standard
``(p + p o R) / 2``, which is the posterior ``p`` itself where ``p`` is invariant under ``R``.
"""

from __future__ import annotations

import dataclasses

import torch

from .chains import ChainGroups
from .nuts import GoldStandard
from .posterior import white_site

__all__ = ["check_reflection_symmetric", "reflect_draws", "reflection_permutation",
           "symmetrised"]


def reflection_permutation(Z: torch.Tensor, name: str = "layer") -> torch.Tensor:
    """``(M,)`` the permutation ``P`` of the inducing inputs ``Z`` ``(M, D)`` with
    ``Z[P] = -Z``.

    :raises ValueError: naming the layer ``name``, where negation does not permute ``Z``."""
    distance = torch.cdist(-Z, Z)  # (M, M): row i, the distance of -Z_i to each Z_j
    perm = distance.argmin(-1)
    scale = 1e-9 * max(1.0, float(Z.abs().max()))
    if bool((distance.gather(-1, perm[:, None]) > scale).any()) or perm.unique().numel() != len(
            perm):
        raise ValueError(f"the inducing inputs of {name} are not symmetric about 0 (-Z must "
                         f"be a permutation of Z), got {Z.reshape(-1).tolist()}")
    return perm


def check_reflection_symmetric(model, num_checks: int = 16, seed: int = 0) -> None:
    """Check that ``model`` has the module docstring's symmetry: two layers, a zero mean
    function in the first (at its inducing inputs), an even mean function and an even kernel
    in the second (at its inducing inputs and ``num_checks`` random points, seeded), and
    ``Z^2`` permuted by negation.

    :raises ValueError: naming what breaks the symmetry."""
    layers = model.layers
    if len(layers) != 2:
        raise ValueError(f"the reflection symmetry is of two-layer deep GPs, got {len(layers)} "
                         "layers")
    first, second = layers
    g = torch.Generator(device=first.inducing_points.device).manual_seed(seed)
    with torch.no_grad():
        Z1, Z2 = first.inducing_points, second.inducing_points
        if bool(first.mean_function(Z1).abs().gt(0).any()):
            raise ValueError(f"layer '{first.name}' has a mean function other than zero: "
                             "f^1 -> -f^1 changes its prior")
        reflection_permutation(Z2, f"layer '{second.name}'")
        h = torch.cat([Z2, torch.randn(num_checks, Z2.shape[-1], generator=g, dtype=Z2.dtype,
                                       device=Z2.device)])
        if not torch.allclose(second.mean_function(-h), second.mean_function(h)):
            raise ValueError(f"layer '{second.name}' has a mean function that is not even: "
                             "f^2 -> f^2(-.) changes its prior")
        if not torch.allclose(second.kernel(-h), second.kernel(h)):
            raise ValueError(f"layer '{second.name}' has a kernel that is not even "
                             "(k(-a, -b) != k(a, b)): f^2 -> f^2(-.) changes its prior")


def reflect_draws(model, draws: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reflection (module docstring) of draws ``{site: (*batch, *event)}`` of the
    samplers' sites: ``"<layer1>.u"``, ``"<layer2>.u"`` and, under the posterior target,
    ``"<layer1>.f_white"``. Other sites are refused."""
    first, second = model.layers
    perm = reflection_permutation(second.inducing_points, f"layer '{second.name}'")
    out = {}
    with torch.no_grad():
        for site, value in draws.items():
            if site in (f"{first.name}.u", white_site(first.name)):
                out[site] = -value
            elif site == f"{second.name}.u":  # (*batch, D, M): P acts on M
                if second.whiten:
                    L = second.kzz_cholesky()
                    u = (value @ L.mT)[..., perm]  # each row P L v, as function values
                    out[site] = torch.linalg.solve_triangular(L, u.mT, upper=False).mT
                else:
                    out[site] = value[..., perm]
            else:
                raise ValueError(f"reflect_draws: no reflection of site {site!r} (sites "
                                 f"'{first.name}.u', '{second.name}.u', "
                                 f"'{white_site(first.name)}')")
    return out


def symmetrised(gold: GoldStandard) -> GoldStandard:
    """``gold`` with the reflection of each chain added (chain ``C + c`` mirrors chain ``c``
    for ``c < C``), each group of chains and its mirror sharing the group's weight: the
    mixture ``(p + p o R) / 2`` (module docstring). Each mirror group's diagnostics are its
    group's. Checks the symmetry first (:func:`check_reflection_symmetric`).

    :raises ValueError: the model is not symmetric, or ``gold`` has no groups (``S < 4``)."""
    check_reflection_symmetric(gold.model)
    if gold.chain_groups is None:
        raise ValueError("symmetrised needs a gold standard with its chains grouped (at least "
                         "4 draws per chain)")
    C = gold.num_chains
    mirror = reflect_draws(gold.model, gold.samples)
    samples = {k: torch.cat([v, mirror[k]]) for k, v in gold.samples.items()}
    old = gold.chain_groups
    groups = [list(g) for g in old.groups] + [[c + C for c in g] for g in old.groups]
    weights = torch.cat([old.weights, old.weights]) / 2
    doubled = ChainGroups(groups, weights, old.r_hat * 2, old.ess_per_chain * 2,
                          old.khat * 2, torch.cat([old.elpd_loo, old.elpd_loo], -1))
    return dataclasses.replace(
        gold, samples=samples, chain_groups=doubled,
        settings={**gold.settings, "symmetrised": True})
