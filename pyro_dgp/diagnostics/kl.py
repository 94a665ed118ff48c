"""``KL(q(u^l) || p(u^l))`` per GP layer: in closed form where the guide family has it, by
Monte Carlo over the guide's draws otherwise."""

from __future__ import annotations

import torch
from pyro.distributions import Delta

from ..gp.sites import function_site
from ..guides.draws import check_guide_of, function_sites, set_up_guide, trace_draws, unmasked
from ..guides.protocol import protocol_of
from ..rng import seeded

__all__ = ["layer_kl", "monte_carlo_kl", "monte_carlo_kl_draws"]


def layer_kl(
    model, guide, X: torch.Tensor, trace=None, num_samples: int = 256, seed: int | None = 0
) -> dict[str, float]:
    """``{layer: KL(q(u^l) || p(u^l))}`` for every GP layer of ``model``.

    Closed form where the guide family's marginal ``q(u^l)`` is Gaussian (its
    ``guide.layer_kl``: mean-field, coupled and chain guides, and completed Pyro autoguides
    with a Gaussian posterior, whose per-layer block of ``get_posterior()`` is the marginal of
    a joint guide). Otherwise a Monte Carlo estimate ``mean_s [log q(u^l_s) - log p(u^l_s)]``
    over draws of the guide (:func:`monte_carlo_kl`), where the guide trace has a per-layer
    density at ``<layer>.u``; ``nan`` where it has none (e.g. a flow, whose density is joint
    over the layers).

    With inducing points as inducing locations (Ustyuzhaninov et al. 2020) a layer's prior is
    ``p(u^l | Z^l = u^{l-1})``, so its KL is the expectation over the guide's draws of the
    layer below's ``u``.

    :param trace: a guide trace of :func:`~pyro_dgp.guides.draws.trace_draws` to reuse (as
        :func:`~pyro_dgp.diagnostics.export.to_datatree` does); else one is drawn
        (``num_samples``, from ``seed``).
    """
    check_guide_of(model, guide, "layer_kl")
    if trace is None:
        set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
        with torch.no_grad(), seeded(seed, X.device):
            trace = trace_draws(guide, (X,), num_samples)
    out = {}
    below = None
    for fname, site in function_sites(trace):
        lname, layer = fname.rsplit(".", 1)[0], function_site(site).layer
        Z = None
        if below is not None and below[1].feeds_inducing_inputs:
            Z = _drop_plate_dim(trace.nodes[f"{below[0]}.u"]["value"]).mT
        with layer.given_inducing_inputs(Z):
            out[lname] = _closed_form_kl(guide, lname, Z is not None)
            if out[lname] is None:
                out[lname] = monte_carlo_kl(trace, lname, layer)
        below = (lname, layer)
    return out


def _closed_form_kl(guide, lname: str, random_inducing: bool) -> float | None:
    """The guide family's closed-form ``KL(q(u^l) || p(u^l))``, or ``None`` where it has none
    (a non-Gaussian ``q``, or a guide that is not a layer guide)."""
    if not protocol_of(guide).is_layer_guide:
        return None
    try:
        return float(guide.layer_kl(guide.site(lname), random_inducing=random_inducing))
    except NotImplementedError:
        return None


def _drop_plate_dim(u: torch.Tensor) -> torch.Tensor:
    """``(S, 1, D, M)`` draws of a ``.u`` site under the sample plate at dim -2 -> ``(S, D, M)``."""
    return u.reshape((-1,) + u.shape[-2:])


def monte_carlo_kl(trace, lname: str, layer) -> float:
    """``mean_s [log q(u^l_s) - log p(u^l_s)]`` from a guide trace; ``nan`` where the trace has
    no per-layer density (``q`` joint over layers, e.g. a flow or a joint Gaussian)."""
    draws = monte_carlo_kl_draws(trace, lname, layer)
    return float("nan") if draws is None else float(draws.mean())


def monte_carlo_kl_draws(trace, lname: str, layer) -> torch.Tensor | None:
    """``(S,)`` per-draw ``log q(u^l_s) - log p(u^l_s)`` of :func:`monte_carlo_kl` (their
    spread gives its standard error), or ``None``."""
    name = f"{lname}.u"
    usite = trace.nodes.get(name)
    if usite is None or usite["type"] != "sample":
        return None
    sites = [usite]
    base = unmasked(usite["fn"])
    while hasattr(base, "base_dist"):
        base = base.base_dist
    if isinstance(base, Delta):
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
