"""Pareto-smoothed importance sampling (PSIS) of variational fits: PSIS-LOO of a guide's
draws and comparison of guides (Vehtari, Gelman and Gabry 2017), and the variational Pareto-k
diagnostic of ``q`` itself (Yao, Vehtari, Simpson and Gelman 2018)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import xarray as xr
from pyro.distributions import Delta
from pyro.poutine.util import site_is_subsample

from ..gp.sites import function_site, inducing_site
from ..guides.draws import (
    check_guide_of,
    global_draws,
    observation_log_prob,
    set_up_guide,
    trace_draws,
    trace_model,
    unmasked,
)
from ..guides.protocol import protocol_of
from ..infer.elbo import per_draw_sum
from ..rng import seeded
from ..validation import check_inputs, check_positive_int
from .compare import GuideComparisonWarning, annotate_comparison
from .tables import whole

__all__ = [
    "MIN_PSIS_DRAWS",
    "GuideComparisonWarning",
    "VariationalPSIS",
    "check_psis_draws",
    "compare_guides",
    "guide_log_density",
    "loo",
    "pareto_smooth",
    "variational_pareto_k",
]


#: the fewest draws PSIS can smooth: it fits a generalised Pareto distribution to the largest
#: M of S importance weights, M = floor(S / 5) for S r_eff <= 225 (3 sqrt(S / r_eff) beyond),
#: and ArviZ's fit needs M >= 5, so S >= 25
MIN_PSIS_DRAWS = 25


def check_psis_draws(num_draws: int, where: str, hint: str = "") -> None:
    """A ``ValueError`` naming ``num_samples`` where ``num_draws < MIN_PSIS_DRAWS``."""
    if num_draws < MIN_PSIS_DRAWS:
        raise ValueError(
            f"{where} needs at least {MIN_PSIS_DRAWS} draws for Pareto-smoothed importance "
            f"sampling (it fits the largest S/5 of S weights, and the fit needs 5), got "
            f"{num_draws}: use num_samples >= {MIN_PSIS_DRAWS}{hint}")


def loo(dt: xr.DataTree, var_name: str | None = None, pointwise: bool = True):
    """``arviz_stats.loo`` of one guide's DataTree, robust to draw-independent points.

    Where the last layer's Gaussian does not depend on the draw (a one-layer model with a
    collapsed guide: ``u`` is integrated out), every draw gives the same ``log p(y_i)`` and
    Pareto smoothing cannot fit a tail; the exact answer there is uniform weights (k = 0),
    which is what this passes to ``arviz_stats.loo`` for those points.

    :raises ValueError: when points that need smoothing have fewer than
        :data:`MIN_PSIS_DRAWS` draws (``to_datatree(..., num_samples=...)``).
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
    n = ll.sizes["chain"] * ll.sizes["draw"]
    if not bool(flat.all()):  # some points' weights are smoothed
        check_psis_draws(n, "loo of a DataTree", " in to_datatree")
    if not bool(flat.any()):
        return arviz_stats.loo(dt, pointwise=pointwise, var_name=var_name)
    obs_dims = [d for d in ll.dims if d not in sample]
    stacked = ll.stack(_point=obs_dims)
    keep = ~flat.stack(_point=obs_dims).values
    lw = xr.full_like(stacked, -math.log(n))
    k = xr.zeros_like(stacked.isel(chain=0, draw=0, drop=True))
    if keep.any():
        part_lw, part_k = stacked.isel(_point=keep).azstats.psislw(r_eff=1.0, dim=list(sample))
        lw[..., keep] = part_lw.transpose(*stacked.dims).values
        k[keep] = part_k.values
    lw = lw.unstack("_point").transpose(*ll.dims)
    k = k.unstack("_point")
    return arviz_stats.loo(dt, pointwise=pointwise, var_name=var_name, log_weights=lw, pareto_k=k)


def compare_guides(datatrees: dict, method: str = "stacking", var_name: str | None = None, *,
                   heldout: dict | None = None, elbos: dict | None = None, level: float = 0.95):
    """PSIS-LOO comparison of guides of one model (Vehtari, Gelman and Gabry 2017), with the
    ELBO and the calibration of each guide's predictive beside it.

    :param datatrees: ``{name: to_datatree(model, guide, X, y)}``, two or more, on the same
        data.
    :param method: the model weights of ``arviz_stats.compare`` (``"stacking"``,
        ``"bb-pseudo-bma"``, ``"pseudo-bma"``).
    :param var_name: the observed variable, when the DataTrees hold several.
    :param heldout: ``{name: to_datatree(model, guide, X_test, y_test)}`` for every guide, all
        at the same test points: adds the held-out columns, and calibration is then judged on
        them instead of in-sample.
    :param elbos: ``{name: ELBO}``, a float or a :func:`~pyro_dgp.evaluate_elbo` estimate (its
        ``stderr`` goes to ``elbo_se``); a guide not in it takes the DataTree's root attributes
        ``elbo`` and ``elbo_se`` if set.
    :param level: the nominal coverage of the central predictive interval.
    :returns: a ``pandas.DataFrame`` (printed whole) ordered best first by PSIS-LOO, as
        ``arviz_stats.compare`` (``rank`` (0 is best), ``elpd``, ``p``, ``elpd_diff``,
        ``weight``, ``se``, ``dse``, ``warning``), plus ``elbo``, ``elbo_se`` (NaN unknown);
        ``pareto_k_max`` and ``n_bad_k``, the points whose k-hat exceeds
        ``min(1 - 1/log10(S), 0.7)`` for ``S`` draws (Vehtari et al. 2017, 2024);
        ``coverage``, ``coverage_se``, ``crps``, ``crps_se`` in-sample, from each DataTree's
        ``posterior_predictive`` draws against ``observed_data`` (NaN without them); with
        ``heldout``, ``heldout_coverage``, ``heldout_coverage_se``, ``heldout_crps``,
        ``heldout_crps_se``, ``heldout_elpd`` (sum over test points of the log density of the
        ``S``-draw predictive mixture), ``heldout_elpd_se``; and ``notes``, the messages that
        name the guide (empty when none). The estimators and their Monte Carlo errors are
        those of :mod:`pyro_dgp.diagnostics.compare` (coverage by the non-randomised PIT,
        CRPS by its energy form, Gneiting and Raftery 2007). ``table.attrs["warnings"]`` holds
        every message, ``table.attrs["preferred"]`` the guide each criterion prefers.
    :warns GuideComparisonWarning: for each guide with k-hat above the limit at some points
        (its LOO is unreliable), and when the guide that elpd_loo or the ELBO prefers has a
        coverage further from ``level``, a higher CRPS or, held out, a lower log predictive
        density than the guide that criterion prefers, by more than twice the standard error
        of the difference (paired over the points for CRPS and elpd).
    """
    import arviz_stats

    if not isinstance(datatrees, dict):
        raise TypeError(f"datatrees must be a dict {{name: DataTree}}, got "
                        f"{type(datatrees).__name__}")
    if len(datatrees) < 2:
        raise ValueError("compare_guides needs at least two DataTrees")
    with warnings.catch_warnings():
        # reported per guide, by name, as a GuideComparisonWarning
        warnings.filterwarnings("ignore", "Estimated shape parameter of Pareto", UserWarning)
        elpds = {}
        for name, dt in datatrees.items():
            try:
                elpds[name] = loo(dt, var_name=var_name)
            except ValueError as err:  # which guide's DataTree
                raise ValueError(f"compare_guides, {name!r}: {err}") from None
    with warnings.catch_warnings():
        # arviz-stats 0.8 sorts with pandas' deprecated `inplace=True` (Pandas4Warning under
        # pandas >= 3.1): a note about arviz-stats' own code that the user can do nothing about
        warnings.filterwarnings("ignore", "The inplace keyword", DeprecationWarning)
        table = arviz_stats.compare(elpds, method=method)
    return whole(annotate_comparison(table, elpds, datatrees, heldout=heldout, elbos=elbos,
                                     level=level, var_name=var_name))


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
    capabilities = protocol_of(guide)
    if not capabilities.tractable_log_q:
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
    layers_log_q = capabilities.layers_log_q(guide_trace, S)
    if layers_log_q is not None:
        terms.append(layers_log_q)
        sites = [(n, s) for n, s in sites if inducing_site(s) is None]
    for name, site in sites:
        fn = unmasked(site["fn"])
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
        terms.append(per_draw_sum(lp, S))
    if not terms:
        raise ValueError(f"{type(guide).__name__}: the guide sampled no global latent")
    total = torch.stack(terms).sum(0)
    if not bool(torch.isfinite(total).all()):
        raise ValueError(f"{type(guide).__name__}: log q is not finite for some draws")
    return total


def variational_pareto_k(model, guide, X: torch.Tensor, y: torch.Tensor, *,
                         num_samples: int = 1000, seed: int | None = 0) -> VariationalPSIS:
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

    :param seed: draw from this seed without touching the global random state (``None``: from
        the global random state).
    :returns: :class:`VariationalPSIS` (``.k``, ``.log_weights``, ``.ess``, ``.elbo``,
        ``.log_marginal``).
    """
    check_inputs(X)
    S = check_positive_int(num_samples, "num_samples")
    check_guide_of(model, guide, "variational_pareto_k")
    set_up_guide(guide, (X,), seed, X.device)  # not inside the seeded draws: it uses the RNG
    with torch.no_grad(), seeded(seed, X.device):
        guide_trace = trace_draws(guide, (X,), S)
        log_q = guide_log_density(guide, guide_trace, S)
        model_trace = trace_model(model, global_draws(guide_trace), (X, y), S)
        log_p = sum(_model_log_terms(model_trace, guide_trace, S), torch.zeros_like(log_q))
    log_w = (log_p - log_q).detach().cpu().numpy().astype(np.float64)
    if not np.all(np.isfinite(log_w)):
        raise ValueError("non-finite importance weights: check the model and guide")
    check_psis_draws(S, "variational_pareto_k")
    smoothed, k = pareto_smooth(log_w)
    return VariationalPSIS(log_w, smoothed, k)


def _model_log_terms(model_trace, guide_trace, S: int) -> list[torch.Tensor]:
    """The ``(S,)`` terms of ``log p(y, theta_s)`` of the model replayed on the guide's global
    draws: the prior of every latent the guide drew (and of every layer's ``u``), and each
    observation's ``log p(y_i | draw)`` (:func:`~pyro_dgp.guides.draws.observation_log_prob`),
    scaled as the model scales them. The ``<layer>.f`` values the model drew itself are left
    out: ``p(f | u, f_prev)`` is also their proposal, so it cancels in the weight."""
    terms = []
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site) or function_site(site) is not None:
            continue
        drawn = name in guide_trace.nodes
        if site["is_observed"] and not drawn:
            lp = observation_log_prob(site)
        elif drawn and not site["is_observed"] or inducing_site(site) is not None:
            lp = site["fn"].log_prob(site["value"])
        else:
            continue
        terms.append(site["scale"] * per_draw_sum(lp, S))
    return terms


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
