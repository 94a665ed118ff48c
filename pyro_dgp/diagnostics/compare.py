"""Calibration of guides' predictive draws, set beside PSIS-LOO and the ELBO.

PSIS-LOO (Vehtari, Gelman and Gabry 2017) and the ELBO can both prefer a guide whose
predictive intervals are too narrow. :func:`predictive_scores` scores one DataTree's
``posterior_predictive`` draws ``y_rep[s, i]`` against its ``observed_data`` ``y_i``; as the
guide's draws ``theta_s`` are i.i.d. from ``q`` and ``y_rep[s, i] ~ p(y_i | theta_s)``, the
``S`` values of point ``i`` are i.i.d. draws of the guide's predictive ``p_q(y_i)``.

``coverage``
    the probability that the randomised PIT ``u_i = (r_i + V) / (S + 1)`` (``r_i`` the rank of
    ``y_i`` among the ``S + 1`` values, ties broken at random, ``V ~ U(0, 1)``) falls in
    ``[(1 - level) / 2, (1 + level) / 2]``: ``u_i`` is uniform on ``[lo_i, lo_i + eq_i + 1] /
    (S + 1)`` (``lo_i`` draws below ``y_i``, ``eq_i`` equal to it), and the coverage of point
    ``i`` is the share of that range inside the interval (the non-randomised PIT of Czado,
    Gneiting and Held 2009). For a calibrated predictive ``r_i`` is uniform, so
    ``E[coverage_i] = level`` exactly, with no ``O(1/S)`` bias of empirical quantiles. Monte
    Carlo error: the predictive mass between two order statistics of ``S`` draws has variance
    ``level (1 - level) / S``, a bound for the mean over points too (they share the draws).
``crps``
    the energy form ``CRPS(F, y) = E|Y - y| - E|Y - Y'| / 2`` (Gneiting and Raftery 2007) by
    the U-statistic ``mean_s |y_rep[s] - y| - sum_{s != t} |y_rep[s] - y_rep[t]| / (2 S (S -
    1))``, unbiased for the CRPS of ``p_q``; its Monte Carlo variance is ``Var(h_s) / S`` with
    the Hoeffding projection on draw ``s``, ``h_s = mean_i (|y_rep[s, i] - y_i| - sum_t
    |y_rep[s, i] - y_rep[t, i]| / (S - 1))``.
``lpd``
    ``log (1/S) sum_s p(y_i | theta_s)`` from ``log_likelihood``, the log density of the
    ``S``-draw mixture (below ``log p_q(y_i)`` by ``O(1/S)`` on average, by Jensen).

Standard errors add the sampling error over the ``N`` points to the Monte Carlo error:
``coverage_se = sqrt(var_i(coverage_i) / N + level (1 - level) / S)``, ``crps_se =
sqrt(var_i(crps_i) / N + Var(h_s) / S)``, ``elpd_se = sqrt(N) sd_i(lpd_i)``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy.special import logsumexp

from .layers import SAMPLE_DIMS

__all__ = ["GuideComparisonWarning", "PredictiveScores", "annotate_comparison", "energy_crps",
           "pit_coverage", "predictive_scores"]

class GuideComparisonWarning(UserWarning):
    """A guide comparison whose criteria disagree, or whose PSIS-LOO is unreliable."""


def check_level(level) -> float:
    """``level`` as a float in ``(0, 1)``."""
    if isinstance(level, bool) or not isinstance(level, int | float | np.floating):
        raise TypeError(f"level must be a number in (0, 1), got {level!r}")
    if not 0 < float(level) < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return float(level)


def pit_coverage(draws: np.ndarray, y: np.ndarray, level: float = 0.95) -> np.ndarray:
    """``(N,)`` coverage of each ``y_i`` by the central ``level`` interval of its ``(S, N)``
    predictive draws, by the non-randomised PIT (see the module docstring)."""
    S = draws.shape[0]
    below, equal = (draws < y).sum(0), (draws == y).sum(0)
    a, b = below / (S + 1), (below + equal + 1) / (S + 1)
    inside = np.minimum(b, (1 + level) / 2) - np.maximum(a, (1 - level) / 2)
    return np.clip(inside, 0.0, None) / (b - a)


def energy_crps(draws: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """``((N,) CRPS of each y_i, Monte Carlo variance of their mean)`` from ``(S, N)``
    predictive draws, ``S >= 2`` (the U-statistic of the module docstring)."""
    S = draws.shape[0]
    order = np.argsort(draws, axis=0)
    x = np.take_along_axis(draws, order, axis=0)
    k = np.arange(S, dtype=np.float64)[:, None]
    below = np.cumsum(x, axis=0)
    # x_(k) the k-th smallest (k from 0): sum_t |x_(k) - x_t| = (k x_(k) - sum_{j<k} x_(j))
    #   + (sum_{j>k} x_(j) - (S-1-k) x_(k)) = (2k - S + 2) x_(k) - 2 sum_{j<=k} x_(j) + sum_j x_j
    spread_sorted = (2 * k - S + 2) * x - 2 * below + below[-1]
    spread = np.empty_like(draws)
    np.put_along_axis(spread, order, spread_sorted, axis=0)
    deviation = np.abs(draws - y)
    crps = deviation.mean(0) - spread.sum(0) / (2 * S * (S - 1))
    h = (deviation - spread / (S - 1)).mean(1)
    return crps, float(h.var(ddof=1) / S)


@dataclass
class PredictiveScores:
    """Pointwise scores of one DataTree's predictive draws (:func:`predictive_scores`).

    :ivar coverage, crps: ``(N,)``; :ivar lpd: ``(N,)``, or ``None`` without a
        ``log_likelihood`` group; :ivar observed: ``(N,)`` the ``y_i``;
    :ivar crps_mc_var: Monte Carlo variance of ``crps.mean()``; :ivar num_draws: ``S``.
    """

    coverage: np.ndarray
    crps: np.ndarray
    lpd: np.ndarray | None
    observed: np.ndarray
    crps_mc_var: float
    num_draws: int
    level: float

    def summary(self) -> dict[str, float]:
        """Means (sums for ``elpd``) over the points and their standard errors."""
        N, lpd = self.observed.size, self.lpd
        mc_coverage = self.level * (1 - self.level) / self.num_draws
        return {"coverage": float(self.coverage.mean()),
                "coverage_se": math.sqrt(_var(self.coverage) / N + mc_coverage),
                "crps": float(self.crps.mean()),
                "crps_se": math.sqrt(_var(self.crps) / N + self.crps_mc_var),
                "elpd": math.nan if lpd is None else float(lpd.sum()),
                "elpd_se": math.nan if lpd is None else math.sqrt(N * _var(lpd))}


def _var(a: np.ndarray) -> float:
    return float(a.var(ddof=1)) if a.size > 1 else 0.0


def observed_name(dt: xr.DataTree, var_name: str | None = None) -> str:
    """The observed variable of ``dt``: ``var_name``, or the only one there is."""
    groups = [g for g in ("observed_data", "log_likelihood", "posterior_predictive")
              if g in dt.children]
    if not groups:
        raise ValueError("the DataTree has no observed_data, log_likelihood or "
                         "posterior_predictive group: build it with to_datatree(..., y)")
    names = [str(v) for v in dt[groups[0]].data_vars]
    if var_name is None:
        if len(names) != 1:
            raise ValueError(f"several observed variables {names}: pass var_name")
        return names[0]
    if var_name not in names:
        raise ValueError(f"no observed variable '{var_name}' in the DataTree (it has {names})")
    return var_name


def _draws(dt: xr.DataTree, group: str, name: str) -> tuple[np.ndarray, list[str]]:
    """``(S, N)`` draws of ``dt[group][name]`` and the names of its point dims."""
    if name not in dt[group].data_vars:
        raise ValueError(f"the {group} group has no variable '{name}'")
    da = dt[group][name]
    if not set(SAMPLE_DIMS) <= set(da.dims):
        raise ValueError(f"{group}['{name}'] needs dims (chain, draw, ...), got {da.dims}")
    points = [d for d in da.dims if d not in SAMPLE_DIMS]
    values = da.transpose(*SAMPLE_DIMS, *points).values
    return values.reshape(values.shape[0] * values.shape[1], -1).astype(np.float64), points


def predictive_scores(dt: xr.DataTree, var_name: str | None = None,
                      level: float = 0.95) -> PredictiveScores:
    """Coverage, CRPS and log predictive density of each observed point of ``dt`` (a
    :func:`~pyro_dgp.diagnostics.export.to_datatree` built with ``y``), see the module
    docstring for the estimators. Needs ``posterior_predictive`` and ``observed_data``."""
    level = check_level(level)
    name = observed_name(dt, var_name)
    for group in ("posterior_predictive", "observed_data"):
        if group not in dt.children:
            raise ValueError(f"the DataTree has no {group} group: build it with "
                             "to_datatree(model, guide, X, y)")
    draws, points = _draws(dt, "posterior_predictive", name)
    y = dt["observed_data"][name].transpose(*points).values.reshape(-1).astype(np.float64)
    if draws.shape[1] != y.size:
        raise ValueError(f"posterior_predictive has {draws.shape[1]} points per draw, "
                         f"observed_data {y.size}")
    if draws.shape[0] < 2:
        raise ValueError("predictive scores need at least 2 draws (num_samples >= 2)")
    if not (np.isfinite(draws).all() and np.isfinite(y).all()):
        raise ValueError("posterior_predictive or observed_data has non-finite values")
    crps, mc_var = energy_crps(draws, y)
    lpd = None
    if "log_likelihood" in dt.children and name in dt["log_likelihood"].data_vars:
        ll, _ = _draws(dt, "log_likelihood", name)
        lpd = logsumexp(ll, axis=0) - math.log(ll.shape[0])
    return PredictiveScores(pit_coverage(draws, y, level), crps, lpd, y, mc_var,
                            draws.shape[0], level)


# ------------------------------------------------------------------ the comparison table
def _all_scores(trees: dict, names: list, var_name, level, where: str) -> dict | None:
    """``{name: PredictiveScores}`` of every guide (``None`` when a DataTree has no predictive
    draws or observations), checked to be on the same observed points."""
    if not all({"posterior_predictive", "observed_data"} <= set(trees[n].children)
               for n in names):
        return None
    scores = {n: predictive_scores(trees[n], var_name, level) for n in names}
    first = names[0]
    for n in names[1:]:
        a, b = scores[first].observed, scores[n].observed
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-10, atol=0.0):
            raise ValueError(f"the {where} DataTrees of '{first}' and '{n}' hold different "
                             "observed data: compare guides on the same points")
    return scores


def _check_arguments(heldout, elbos, names: list) -> None:
    """``heldout``: a DataTree with predictive draws and observations per guide compared."""
    for arg, label in ((heldout, "heldout"), (elbos, "elbos")):
        if arg is not None and not isinstance(arg, dict):
            raise TypeError(f"{label} must be a dict keyed by guide name, got "
                            f"{type(arg).__name__}")
    unknown = [n for n in (elbos or {}) if n not in names]
    if unknown:
        raise ValueError(f"elbos names guides that are not compared: {unknown} "
                         f"(compared: {names})")
    if heldout is None:
        return
    missing = [n for n in names if n not in heldout]
    extra = [n for n in heldout if n not in names]
    if missing or extra:
        raise ValueError(f"heldout must hold one DataTree per guide compared {names}; "
                         f"missing {missing}, unknown {extra}")
    for n in names:
        if not isinstance(heldout[n], xr.DataTree):
            raise TypeError(f"heldout['{n}'] must be a DataTree built by "
                            f"to_datatree(model, guide, X_test, y_test), got {type(heldout[n])}")
        for group in ("posterior_predictive", "observed_data"):
            if group not in heldout[n].children:
                raise ValueError(f"heldout['{n}'] has no {group} group: build it with "
                                 "to_datatree(model, guide, X_test, y_test)")


def _elbo(name, dt: xr.DataTree, elbos: dict | None) -> tuple[float, float]:
    """``(ELBO, its standard error)`` of one guide: from ``elbos``, else the DataTree's root
    attributes ``elbo`` / ``elbo_se``, else NaN."""
    given = elbos is not None and name in elbos
    value = elbos[name] if given else dt.attrs.get("elbo")
    se = math.nan if given else dt.attrs.get("elbo_se", math.nan)
    if hasattr(value, "value") and hasattr(value, "stderr"):  # an ELBO estimate
        value, se = value.value, value.stderr
    try:
        if value is None:
            return math.nan, math.nan
        return float(value), float(se)
    except (TypeError, ValueError) as err:
        raise TypeError(f"the ELBO of '{name}' must be a number or an ELBO estimate, "
                        f"got {value!r}") from err


def _add_columns(table, elpds: dict, trees: dict, elbos: dict | None,
                 scores: dict | None, held: dict | None) -> None:
    """ELBO, Pareto-k and calibration columns (NaN where unknown), in ``table``'s order."""
    names = list(table.index)
    elbo = [_elbo(n, trees[n], elbos) for n in names]
    table["elbo"], table["elbo_se"] = [e for e, _ in elbo], [s for _, s in elbo]
    ks = [np.asarray(elpds[n].pareto_k, dtype=np.float64).ravel() for n in names]
    table["pareto_k_max"] = [float(np.nanmax(k)) for k in ks]
    table["n_bad_k"] = [int((k > elpds[n].good_k).sum()) for n, k in zip(names, ks, strict=True)]
    keys = ("coverage", "coverage_se", "crps", "crps_se")
    for prefix, group in (("", scores), ("heldout_", held)):
        if group is None and prefix:
            continue
        rows = [group[n].summary() if group else {} for n in names]
        for key in keys + (("elpd", "elpd_se") if prefix else ()):
            table[prefix + key] = [r.get(key, math.nan) for r in rows]


# ------------------------------------------------------------ agreement of the criteria
@dataclass
class Criterion:
    """A calibration criterion: the guide it prefers (``best``, ties to the better LOO rank),
    whether guide ``a`` is worse than ``best`` by more than twice the standard error of the
    difference (``worse(a)``), and that comparison in words (``describe(a)``)."""

    key: str
    best: str
    worse: object
    describe: object


def _coverage_criterion(summ: dict, names: list, level: float, where: str, key: str):
    miss = {n: abs(summ[n]["coverage"] - level) for n in names}
    best = min(names, key=miss.__getitem__)

    def worse(a):
        return miss[a] - miss[best] > 2 * math.hypot(summ[a]["coverage_se"],
                                                     summ[best]["coverage_se"])

    def describe(a):
        return (f"{where} {100 * level:g}% coverage prefers '{best}' "
                f"({summ[a]['coverage']:.2f} for '{a}' against {summ[best]['coverage']:.2f} "
                f"for '{best}')")

    return Criterion(key, best, worse, describe)


def _crps_criterion(scores: dict, names: list, where: str, key: str):
    best = min(names, key=lambda n: scores[n].crps.mean())

    def worse(a):
        # paired over the points: the same y_i are scored under both guides
        d = scores[a].crps - scores[best].crps
        se = math.sqrt(_var(d) / d.size + scores[a].crps_mc_var + scores[best].crps_mc_var)
        return d.mean() > 2 * se

    def describe(a):
        return (f"{where} CRPS prefers '{best}' ({scores[a].crps.mean():.3g} for '{a}' "
                f"against {scores[best].crps.mean():.3g} for '{best}')")

    return Criterion(key, best, worse, describe)


def _elpd_criterion(scores: dict, names: list):
    best = max(names, key=lambda n: scores[n].lpd.sum())

    def worse(a):
        d = scores[best].lpd - scores[a].lpd
        return d.sum() > 2 * math.sqrt(d.size * _var(d))

    def describe(a):
        return (f"the held-out log predictive density prefers '{best}' (elpd "
                f"{scores[a].lpd.sum():.1f} for '{a}' against {scores[best].lpd.sum():.1f} "
                f"for '{best}')")

    return Criterion("heldout_elpd", best, worse, describe)


def calibration_criteria(scores: dict, names: list, level: float,
                         heldout: bool) -> list[Criterion]:
    """Coverage closest to ``level``, lowest CRPS and, held out, highest log predictive
    density, each with the guide it prefers among ``names`` (in LOO order)."""
    where, prefix = ("held-out", "heldout_") if heldout else ("in-sample", "")
    summ = {n: scores[n].summary() for n in names}
    out = [_coverage_criterion(summ, names, level, where, prefix + "coverage"),
           _crps_criterion(scores, names, where, prefix + "crps")]
    if heldout and all(scores[n].lpd is not None for n in names):
        out.append(_elpd_criterion(scores, names))
    return out


def _fit_preferences(table) -> dict:
    """The guide ranked first by PSIS-LOO and, when every guide's is known, by the ELBO."""
    prefs = {"elpd_loo": table.index[int(np.argmin(table["rank"].to_numpy()))]}
    elbo = table["elbo"].to_numpy(dtype=np.float64)
    if np.isfinite(elbo).all():
        prefs["elbo"] = table.index[int(np.argmax(elbo))]
    return prefs


def _disagreements(fit: dict, criteria: list[Criterion]) -> list[tuple[str, set]]:
    """``(message, guides it names)`` for each guide a fit criterion prefers that a
    calibration criterion finds decisively worse than the guide it prefers."""
    out = []
    for guide in dict.fromkeys(fit.values()):
        by = [{"elbo": "the ELBO"}.get(k, k) for k, g in fit.items() if g == guide]
        against = [c for c in criteria if c.best != guide and c.worse(guide)]
        if not against:
            continue
        text = (f"Rankings disagree: {' and '.join(by)} prefer{'s' if len(by) == 1 else ''} "
                f"guide '{guide}', but " + "; ".join(c.describe(guide) for c in against)
                + ". Each gap exceeds twice its standard error: a better elpd_loo or ELBO "
                "does not make calibrated predictive intervals.")
        out.append((text, {guide, *(c.best for c in against)}))
    return out


def _khat_messages(table, elpds: dict) -> list[tuple[str, set]]:
    out = []
    for n in table.index:
        bad = int(table.loc[n, "n_bad_k"])
        if bad:
            e = elpds[n]
            out.append((
                f"PSIS-LOO is unreliable for guide '{n}': {bad} of {e.n_data_points} points "
                f"have Pareto k-hat above {e.good_k:.2f} (the limit for {e.n_samples} draws; "
                f"largest {table.loc[n, 'pareto_k_max']:.2f}), so its elpd_loo and LOO rank "
                "cannot be trusted; compare on held-out data (heldout=...) or by K-fold "
                "cross-validation.", {n}))
    return out


def annotate_comparison(table, elpds: dict, datatrees: dict, *, heldout: dict | None = None,
                        elbos: dict | None = None, level: float = 0.95,
                        var_name: str | None = None):
    """Add to ``arviz_stats.compare``'s ``table`` of ``elpds`` (``{name: loo(...)}`` of
    ``datatrees``) the ELBO, Pareto-k and calibration columns, a ``notes`` column, and the
    attributes ``warnings`` (every message) and ``preferred`` (``{criterion: guide}``); each
    message is also issued as a :class:`GuideComparisonWarning`. The columns and the
    arguments are those of :func:`~pyro_dgp.diagnostics.psis.compare_guides`."""
    level = check_level(level)
    names = list(table.index)
    _check_arguments(heldout, elbos, names)
    scores = _all_scores(datatrees, names, var_name, level, "in-sample")
    held = None if heldout is None else _all_scores(heldout, names, var_name, level, "held-out")
    _add_columns(table, elpds, datatrees, elbos, scores, held)
    judged = held if held is not None else scores
    criteria = [] if judged is None else calibration_criteria(judged, names, level,
                                                              held is not None)
    fit = _fit_preferences(table)
    messages = _khat_messages(table, elpds) + _disagreements(fit, criteria)
    table["notes"] = [" ".join(text for text, who in messages if n in who) for n in names]
    table.attrs["warnings"] = [text for text, _ in messages]
    table.attrs["preferred"] = {**fit, **{c.key: c.best for c in criteria}}
    for text, _ in messages:
        warnings.warn(text, GuideComparisonWarning, stacklevel=3)
    return table
