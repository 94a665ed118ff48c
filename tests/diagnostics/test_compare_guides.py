"""compare_guides reports calibration (coverage, CRPS, held-out log density) and the ELBO
beside PSIS-LOO, and says in words when Pareto k-hat makes LOO unreliable or when the guide
LOO or the ELBO prefers is worse calibrated than another.

The estimators are checked against exact values (a brute-force pairwise CRPS, the Gaussian
closed form, the calibrated case where the PIT is exactly uniform), with tolerances of four
Monte Carlo or sampling standard errors at fixed seeds; the comparison itself on DataTrees
built directly with controlled draws, and once end to end on a small fitted deep GP."""

import math
import re
import warnings

import arviz_base
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import pyro_dgp as dgp
from pyro_dgp.diagnostics.compare import energy_crps, pit_coverage, predictive_scores
from pyro_dgp.diagnostics.psis import compare_guides
from pyro_dgp.infer.objectives import ELBOEstimate

N, S = 200, 200
Y = np.random.default_rng(0).normal(size=N)


def _tree(pp_sd, ll_mean, ll_sd, seed, y=Y, draws=S):
    """A DataTree whose posterior_predictive draws are N(0, pp_sd^2) at every point and whose
    log-likelihood draws are N(ll_mean, ll_sd^2): a wide ll_sd gives heavy importance
    weights, hence large Pareto k-hat."""
    r = np.random.default_rng(seed)
    n = y.size
    return arviz_base.from_dict({
        "posterior": {"a": r.normal(size=(1, draws))},
        "log_likelihood": {"y": r.normal(ll_mean, ll_sd, (1, draws, n))},
        "posterior_predictive": {"y": r.normal(0.0, pp_sd, (1, draws, n))},
        "observed_data": {"y": y},
    }, dims={"y": ["obs"]})


def _gaussian_crps(y, mu, sd):
    """Closed-form CRPS of N(mu, sd^2) at y (Gneiting and Raftery 2007)."""
    z = (y - mu) / sd
    return sd * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi))


def _compare(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = compare_guides(*args, **kwargs)
    ours = [str(w.message) for w in caught if issubclass(w.category, dgp.GuideComparisonWarning)]
    return table, ours


# ------------------------------------------------------------------------- estimators
def test_energy_crps_equals_the_pairwise_sum_ties_included():
    rng = np.random.default_rng(1)
    draws = np.round(rng.normal(size=(9, 6)), 1)  # ties
    y = np.round(rng.normal(size=6), 1)
    crps, _ = energy_crps(draws, y)
    pairs = np.abs(draws[:, None] - draws[None]).sum((0, 1))
    np.testing.assert_allclose(crps, np.abs(draws - y).mean(0) - pairs / (2 * 9 * 8),
                               rtol=1e-12, atol=1e-14)


def test_energy_crps_is_unbiased_and_its_monte_carlo_variance_right():
    """Draws of a predictive whose draws share a latent shift (as a guide's draws are shared
    by the points): the estimate agrees with the closed form, and its stated Monte Carlo
    variance with the spread over repetitions."""
    rng = np.random.default_rng(2)
    n, draws, reps = 20, 100, 300
    y = 1.3 * rng.normal(size=n)
    exact = _gaussian_crps(y, 0.0, math.hypot(0.5, 0.9)).mean()
    means, mc = [], []
    for _ in range(reps):
        sample = 0.5 * rng.normal(size=(draws, 1)) + 0.9 * rng.normal(size=(draws, n))
        crps, var = energy_crps(sample, y)
        means.append(crps.mean())
        mc.append(var)
    assert abs(np.mean(means) - exact) < 4 * math.sqrt(np.mean(mc) / reps)
    ratio = np.std(means, ddof=1) / math.sqrt(np.mean(mc))
    assert abs(ratio - 1) < 4 / math.sqrt(2 * (reps - 1))


@pytest.mark.parametrize("discrete", [False, True])
def test_pit_coverage_is_exactly_level_when_calibrated(discrete):
    """y_i exchangeable with its draws: the rank is uniform, E[coverage] = level for any S
    (19 draws here, where empirical quantiles would miss the level), ties included."""
    rng = np.random.default_rng(3)
    n, draws = 20000, 19
    values = (rng.random((draws + 1, n)) < 0.3) * 1.0 if discrete else rng.normal(
        size=(draws + 1, n))
    for level in (0.95, 0.8):
        c = pit_coverage(values[1:], values[0], level)
        assert ((c >= 0) & (c <= 1)).all()
        assert abs(c.mean() - level) < 4 * math.sqrt(level * (1 - level) / n)


def test_pit_coverage_of_points_inside_and_outside():
    draws = np.linspace(-2, 2, 99)[:, None] * np.ones((1, 3))
    np.testing.assert_allclose(pit_coverage(draws, np.array([0.0, 5.0, -5.0])), [1, 0, 0])


def test_predictive_scores_of_a_known_predictive():
    """N(0, 0.6^2) draws for N(0, 1) data: coverage P(|Z| < 1.96 x 0.6), CRPS the closed
    form at the same y up to Monte Carlo error, lpd the log-mean-exp of the draws."""
    dt = _tree(0.6, -1.0, 0.5, seed=4)
    sc = predictive_scores(dt)
    summ = sc.summary()
    expected = 2 * norm.cdf(norm.ppf(0.975) * 0.6) - 1
    assert abs(summ["coverage"] - expected) < 4 * summ["coverage_se"]
    assert abs(summ["crps"] - _gaussian_crps(Y, 0, 0.6).mean()) < 4 * math.sqrt(sc.crps_mc_var)
    ll = dt["log_likelihood"]["y"].values[0]
    np.testing.assert_allclose(sc.lpd, logsumexp(ll, 0) - math.log(S))
    assert summ["elpd"] == pytest.approx(sc.lpd.sum())


# ------------------------------------------------------------------------- comparison
def _three():
    """'MeanField': best elpd_loo and ELBO, heavy weights (k-hat > limit), intervals too
    narrow; 'Coupled' and 'Chain' calibrated or nearly, worse elpd_loo."""
    return {"MeanField": _tree(0.6, 4.0, 3.0, 1), "Coupled": _tree(1.0, -1.4, 0.05, 2),
            "Chain": _tree(1.1, -1.5, 0.05, 3)}


ELBOS = {"MeanField": -100.0, "Coupled": -120.0, "Chain": -125.0}


def test_disagreeing_rankings_and_unreliable_loo_are_said_in_words():
    table, said = _compare(_three(), elbos=ELBOS)
    assert list(table.index)[0] == "MeanField"
    for col in ("elbo", "elbo_se", "pareto_k_max", "n_bad_k", "coverage", "coverage_se",
                "crps", "crps_se", "notes"):
        assert col in table.columns
    assert table.loc["MeanField", "elbo"] == -100.0
    assert table.loc["MeanField", "coverage"] < 0.85 < table.loc["Coupled", "coverage"]
    khat = [m for m in said if m.startswith("PSIS-LOO is unreliable for guide 'MeanField'")]
    assert len(khat) == 1
    bad = int(re.search(r"(\d+) of 200 points", khat[0]).group(1))
    assert bad == table.loc["MeanField", "n_bad_k"] > 0
    assert table.loc["Coupled", "n_bad_k"] == table.loc["Chain", "n_bad_k"] == 0
    prefer = table.attrs["preferred"]
    assert prefer["elpd_loo"] == prefer["elbo"] == "MeanField"
    assert prefer["coverage"] in ("Coupled", "Chain") and prefer["crps"] in ("Coupled", "Chain")
    clash = [m for m in said if m.startswith("Rankings disagree")]
    assert len(clash) == 1
    assert "elpd_loo and the ELBO prefer guide 'MeanField'" in clash[0]
    assert f"in-sample 95% coverage prefers '{prefer['coverage']}'" in clash[0]
    assert f"in-sample CRPS prefers '{prefer['crps']}'" in clash[0]
    assert f"{table.loc['MeanField', 'coverage']:.2f} for 'MeanField'" in clash[0]
    assert table.attrs["warnings"] == said
    assert khat[0] in table.loc["MeanField", "notes"] and clash[0] in table.loc[
        "MeanField", "notes"]
    assert clash[0] in table.loc[prefer["coverage"], "notes"]


def test_agreeing_rankings_say_nothing():
    """No GuideComparisonWarning, and no deprecation notice from the libraries underneath
    (arviz-stats' pandas calls)."""
    dts = {"Coupled": _tree(1.0, -1.4, 0.05, 2), "MeanField": _tree(0.6, -1.6, 0.05, 1)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", dgp.GuideComparisonWarning)
        warnings.simplefilter("error", DeprecationWarning)
        table = compare_guides(dts, elbos={"Coupled": -1.0, "MeanField": -2.0})
    assert list(table.index) == ["Coupled", "MeanField"]
    assert table.attrs["warnings"] == [] and (table["notes"] == "").all()
    assert table.attrs["preferred"] == {"elpd_loo": "Coupled", "elbo": "Coupled",
                                        "coverage": "Coupled", "crps": "Coupled"}


def test_close_calibration_within_noise_is_not_a_disagreement():
    """LOO prefers the guide whose coverage is a little further from 0.95, within twice the
    standard error of the difference: no warning."""
    dts = {"A": _tree(1.02, -1.4, 0.05, 2), "B": _tree(1.0, -1.5, 0.05, 5)}
    table, said = _compare(dts)
    assert said == [], said


def test_heldout_columns_and_judgement():
    """In-sample both guides look alike; held out 'A' (best elpd_loo) is too narrow and has
    the lower log predictive density: the message speaks of the held-out criteria."""
    y_test = np.random.default_rng(7).normal(size=150)
    dts = {"A": _tree(1.0, -1.4, 0.05, 2), "B": _tree(1.0, -1.5, 0.05, 3)}
    held = {"A": _tree(0.3, -2.5, 0.3, 8, y=y_test), "B": _tree(1.0, -1.45, 0.05, 9, y=y_test)}
    table, said = _compare(dts, heldout=held)
    for col in ("heldout_coverage", "heldout_coverage_se", "heldout_crps", "heldout_crps_se",
                "heldout_elpd", "heldout_elpd_se"):
        assert np.isfinite(table[col]).all(), col
    ll = held["B"]["log_likelihood"]["y"].values[0]
    assert table.loc["B", "heldout_elpd"] == pytest.approx(
        (logsumexp(ll, 0) - math.log(S)).sum(), rel=1e-12)
    assert not np.isfinite(table["elbo"]).any()
    assert len(said) == 1 and said[0].startswith("Rankings disagree: elpd_loo prefers guide 'A'")
    for words in ("held-out 95% coverage prefers 'B'", "held-out CRPS prefers 'B'",
                  "the held-out log predictive density prefers 'B'"):
        assert words in said[0]
    assert table.attrs["preferred"]["heldout_elpd"] == "B"


def test_elbo_alone_can_disagree_and_is_read_from_attributes():
    """LOO prefers the calibrated guide, the ELBO the narrow one: the ELBO is named alone.
    ELBOs come from the DataTrees' root attributes when not passed."""
    dts = {"Coupled": _tree(1.0, -1.4, 0.05, 2), "MeanField": _tree(0.6, -1.6, 0.05, 1)}
    dts["Coupled"].attrs.update(elbo=-130.0, elbo_se=0.5)
    dts["MeanField"].attrs.update(elbo=-110.0, elbo_se=0.4)
    table, said = _compare(dts, level=0.9)
    assert table.loc["Coupled", "elbo_se"] == 0.5
    assert len(said) == 1
    assert said[0].startswith("Rankings disagree: the ELBO prefers guide 'MeanField'")
    assert "in-sample 90% coverage prefers 'Coupled'" in said[0]
    est = ELBOEstimate(-90.0, 1.5, 16)
    table, _ = _compare(dts, elbos={"Coupled": est})
    assert (table.loc["Coupled", "elbo"], table.loc["Coupled", "elbo_se"]) == (-90.0, 1.5)
    assert table.loc["MeanField", "elbo"] == -110.0


def test_without_predictive_draws_the_calibration_columns_are_nan():
    dts = {k: v.copy() for k, v in _three().items() if k != "MeanField"}
    for dt in dts.values():
        del dt["posterior_predictive"]
    table, said = _compare(dts)
    assert table[["coverage", "crps"]].isna().all().all() and said == []


@pytest.mark.parametrize("kwargs, error, words", [
    ({"heldout": {"MeanField": None}}, ValueError, "missing ['Coupled', 'Chain']"),
    ({"heldout": [1]}, TypeError, "heldout must be a dict"),
    ({"elbos": {"Other": 1.0}}, ValueError, "elbos names guides that are not compared"),
    ({"elbos": {"Chain": "high"}}, TypeError, "the ELBO of 'Chain' must be a number"),
    ({"level": 1.5}, ValueError, "level must lie in (0, 1)"),
    ({"level": "0.9"}, TypeError, "level must be a number"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        _compare(_three(), **kwargs)


def test_bad_heldout_trees_and_mismatched_data_are_named():
    dts = _three()
    held = {k: _tree(1.0, -1.0, 0.1, i) for i, k in enumerate(dts)}
    held["Chain"] = held["Chain"].copy()
    del held["Chain"]["observed_data"]
    with pytest.raises(ValueError, match="heldout\\['Chain'\\] has no observed_data group"):
        _compare(dts, heldout=held)
    held["Chain"] = 3
    with pytest.raises(TypeError, match="heldout\\['Chain'\\] must be a DataTree"):
        _compare(dts, heldout=held)
    dts["Chain"] = _tree(1.1, -1.5, 0.05, 3, y=Y + 1)
    with pytest.raises(ValueError, match="'MeanField' and 'Chain' hold different observed"):
        _compare(dts)
    with pytest.raises(ValueError, match="at least 2 draws"):
        predictive_scores(_tree(1.0, -1.0, 0.1, 0, draws=1))
    with pytest.raises(TypeError, match="datatrees must be a dict"):
        compare_guides([dts["Chain"]])


# ------------------------------------------------------------------------- end to end
def test_end_to_end_on_the_step_data_agrees_with_predict():
    """Two guides of a two-layer deep GP on the step data, 40 steps each: the
    held-out columns agree with the closed-form mixture scores of predict() at the same
    draws, the held-out elpd exactly, CRPS and coverage within Monte Carlo error."""
    data = dgp.datasets.step(n_train=40, n_test=60, seed=0)
    X, y, Xt, yt = data.X_train, data.y_train, data.X_test, data.y_test
    dts, held, elbos = {}, {}, {}
    for name, family in (("MeanField", dgp.guides.MeanField), ("Coupled", dgp.guides.Coupled)):
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
        guide = family(model)
        dgp.fit(model, guide, X, y, num_steps=40, lr=0.03, progress=False, seed=0)
        dts[name] = dgp.to_datatree(model, guide, X, y, num_samples=S, seed=1)
        held[name] = dgp.to_datatree(model, guide, Xt, yt, num_samples=S, seed=1)
        elbos[name] = dgp.evaluate_elbo(model, guide, X, y, num_particles=4, seed=0)
        pred = dgp.predict(model, guide, Xt, num_samples=S, seed=1)
        sc = predictive_scores(held[name])
        assert float(pred.log_prob(yt).sum()) == pytest.approx(sc.lpd.sum(), rel=1e-8)
        # the U-statistic leaves out the same-component pairs of the S-component mixture's
        # E|Y - Y'|: a gap of at most E|Y - Y'| / (2S) <= sqrt(2 Var Y) / (2S), beside the
        # Monte Carlo error
        bias = float((2 * pred.variance).sqrt().mean()) / (2 * S)
        crps_gap = abs(sc.crps.mean() - dgp.metrics.crps(pred, yt))
        assert crps_gap < 4 * math.sqrt(sc.crps_mc_var) + bias
        cov_gap = abs(sc.coverage.mean() - dgp.metrics.coverage(pred, yt))
        assert cov_gap < 4 * math.sqrt(0.95 * 0.05 / S)
    table, _ = _compare(dts, heldout=held, elbos=elbos)
    cols = ["elpd", "elbo", "elbo_se", "coverage", "crps", "heldout_coverage", "heldout_crps",
            "heldout_elpd"]
    assert np.isfinite(table[cols].to_numpy()).all()
    assert set(table.attrs["preferred"]) == {"elpd_loo", "elbo", "heldout_coverage",
                                             "heldout_crps", "heldout_elpd"}
    assert table.loc["Coupled", "elbo"] == elbos["Coupled"].value
