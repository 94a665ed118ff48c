"""Known answers for the predictive mixture and the metrics: brute-force mixture densities,
CRPS by numerical integration of the CDF, quantiles by inversion, moments by the law of total
variance, exact unit changes, and hand-checkable metric values (AUC by pair counting)."""

import math

import numpy as np
import pyro
import pytest
import torch
from scipy import integrate, stats

from pyro_dgp import metrics
from pyro_dgp.likelihoods import BernoulliProbit, Gaussian
from pyro_dgp.prediction import MixturePredictive, gaussian_mixture_crps

DT = torch.float64
NOISE = 0.05


@pytest.fixture(autouse=True)
def _float64_local_params():
    """Likelihood parameters built in float64 (a noise of 0.05 is exactly 0.05) and kept
    module-local (no aliasing of same-named parameters across likelihood instances)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    with pyro.settings.context(module_local_params=True):
        yield
    torch.set_default_dtype(old)


def _mixture(S=5, N=4, seed=0, noise=NOISE):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(S, N, generator=g, dtype=DT)
    var = 0.02 + 0.5 * torch.rand(S, N, generator=g, dtype=DT)
    lik = Gaussian(variance=noise).to(DT)
    y = torch.randn(N, generator=g, dtype=DT)
    return MixturePredictive(loc, var, lik), loc.numpy(), var.numpy(), y


def _np_components(loc, var, noise=NOISE, y_mean=0.0, y_std=1.0):
    """Per-component mean and sd of y in reporting units."""
    return y_mean + y_std * loc, y_std * np.sqrt(var + noise)


def _mix_cdf(z, mu, sd):
    return float(np.mean(stats.norm.cdf(z, mu, sd)))


def _crps_quad(y, mu, sd):
    """int (F(z) - 1{z >= y})^2 dz by adaptive quadrature, split at y."""
    lo, hi = float((mu - 40 * sd).min()), float((mu + 40 * sd).max())
    lo, hi = min(lo, y - 1.0), max(hi, y + 1.0)
    kw = dict(epsabs=1e-13, epsrel=1e-12, limit=500)
    left, _ = integrate.quad(lambda z: _mix_cdf(z, mu, sd) ** 2, lo, y, **kw)
    right, _ = integrate.quad(lambda z: (1 - _mix_cdf(z, mu, sd)) ** 2, y, hi, **kw)
    return left + right


# ------------------------------------------------------------------ log density
def test_log_prob_is_the_mixture_density_not_mean_log():
    pred, loc, var, y = _mixture()
    out = pred.log_prob(y).numpy()
    mu, sd = _np_components(loc, var)
    dens = stats.norm.pdf(y.numpy()[None, :], mu, sd)  # (S, N), float64
    brute = np.log(dens.mean(0))
    np.testing.assert_allclose(out, brute, rtol=1e-12, atol=1e-12)
    mean_log = np.log(dens).mean(0)
    assert (out >= mean_log - 1e-12).all()  # Jensen: mixture log-density >= mean log-density
    assert np.abs(out - mean_log).max() > 1e-3  # and they do differ here
    assert pred.num_samples == 5


def test_log_prob_far_tail_is_finite_and_exact():
    # all densities underflow in float64 at 60 sd: logsumexp must still be exact
    loc = torch.tensor([[0.0], [0.5]], dtype=DT)
    var = torch.tensor([[0.01], [0.02]], dtype=DT)
    pred = MixturePredictive(loc, var, Gaussian(variance=0.01).to(DT))
    y = torch.tensor([20.0], dtype=DT)
    lp = [stats.norm.logpdf(20.0, m, math.sqrt(v + 0.01)) for m, v in ((0.0, 0.01), (0.5, 0.02))]
    ref = np.logaddexp(*lp) - math.log(2)
    assert pred.log_prob(y).item() == pytest.approx(ref, rel=1e-12)


def test_single_component_log_prob_is_gaussian():
    loc, var = torch.tensor([[0.3, -1.0]], dtype=DT), torch.tensor([[0.2, 0.7]], dtype=DT)
    pred = MixturePredictive(loc, var, Gaussian(variance=NOISE).to(DT))
    y = torch.tensor([0.0, 1.0], dtype=DT)
    ref = stats.norm.logpdf(y.numpy(), loc.numpy()[0], np.sqrt(var.numpy()[0] + NOISE))
    np.testing.assert_allclose(pred.log_prob(y).numpy(), ref, rtol=1e-13)


# ------------------------------------------------------------------ CRPS
def test_crps_matches_numerical_integration():
    pred, loc, var, y = _mixture(S=4, N=3, seed=1)
    out = pred.crps(y).numpy()
    mu, sd = _np_components(loc, var)
    for i in range(3):
        ref = _crps_quad(float(y[i]), mu[:, i], sd[:, i])
        assert out[i] == pytest.approx(ref, rel=1e-6, abs=1e-9)


def test_crps_far_outside_the_mixture():
    # y far right of all components: CRPS ~ y - E[Y] - 0.5 E|Y - Y'|; check against quad
    pred, loc, var, _ = _mixture(S=3, N=1, seed=2)
    y = torch.tensor([6.0], dtype=DT)
    mu, sd = _np_components(loc, var)
    ref = _crps_quad(6.0, mu[:, 0], sd[:, 0])
    assert pred.crps(y).item() == pytest.approx(ref, rel=1e-6)


def test_gaussian_mixture_crps_single_component_closed_form():
    # CRPS(N(mu, s^2), y) = s [z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi)],  z = (y - mu) / s
    mu = torch.tensor([[0.0, 1.5, -2.0, 0.3]], dtype=DT)
    s2 = torch.tensor([[1.0, 0.25, 4.0, 0.01]], dtype=DT)
    y = torch.tensor([0.7, 1.5, 1.0, -0.2], dtype=DT)
    out = gaussian_mixture_crps(y, mu, s2).numpy()
    s = np.sqrt(s2.numpy()[0])
    z = (y.numpy() - mu.numpy()[0]) / s
    ref = s * (z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)


def test_gaussian_mixture_crps_chunking_is_invisible():
    g = torch.Generator().manual_seed(3)
    means = torch.randn(6, 11, generator=g, dtype=DT)
    variances = 0.1 + torch.rand(6, 11, generator=g, dtype=DT)
    y = torch.randn(11, generator=g, dtype=DT)
    full = gaussian_mixture_crps(y, means, variances)
    for chunk in (1, 3, 4, 256):
        torch.testing.assert_close(
            gaussian_mixture_crps(y, means, variances, chunk=chunk), full, rtol=1e-13, atol=1e-14
        )


# ------------------------------------------------------------------ CDF, quantiles, moments
def test_cdf_matches_scipy():
    pred, loc, var, y = _mixture()
    mu, sd = _np_components(loc, var)
    zs = torch.tensor([[-1.0, 0.0, 0.5, 2.0], [0.1, -0.3, 1.0, -2.0]], dtype=DT)
    out = pred.cdf(zs).numpy()
    assert out.shape == (2, 4)
    for q in range(2):
        for i in range(4):
            assert out[q, i] == pytest.approx(_mix_cdf(zs[q, i].item(), mu[:, i], sd[:, i]), 1e-13)


@pytest.mark.parametrize("rescale", [False, True])
def test_quantiles_invert_the_cdf(rescale):
    pred, loc, var, _ = _mixture(S=6, N=5, seed=4)
    if rescale:
        pred = pred.rescale(10.0, 3.0)
    mu, sd = _np_components(loc, var, y_mean=pred.y_mean, y_std=pred.y_std)
    qs = [0.001, 0.025, 0.3, 0.5, 0.9, 0.975, 0.999]
    Q = pred.quantiles(qs)
    assert Q.shape == (len(qs), 5)
    for a, q in enumerate(qs):
        for i in range(5):
            # scipy's CDF at the returned quantile: independent of the package's cdf()
            assert _mix_cdf(Q[a, i].item(), mu[:, i], sd[:, i]) == pytest.approx(q, abs=1e-8)
    assert (Q.diff(dim=0) > 0).all()
    with pytest.raises(ValueError, match="quantile"):
        pred.quantiles([0.0, 0.5])
    with pytest.raises(ValueError, match="quantile"):
        pred.quantiles([1.0])


def test_mean_and_variance_are_mixture_moments():
    pred, loc, var, _ = _mixture(S=7, N=3, seed=5)
    mu, sd = _np_components(loc, var)
    mean = mu.mean(0)
    second = (sd**2 + mu**2).mean(0)  # E[Y^2] = mean_s (v_s + m_s^2)
    np.testing.assert_allclose(pred.mean.numpy(), mean, rtol=1e-13)
    np.testing.assert_allclose(pred.variance.numpy(), second - mean**2, rtol=1e-11)
    # and by numerical integration against the mixture density, for one point
    dens = lambda z: np.mean(stats.norm.pdf(z, mu[:, 0], sd[:, 0]))  # noqa: E731
    lo, hi = mu[:, 0].min() - 40 * sd[:, 0].max(), mu[:, 0].max() + 40 * sd[:, 0].max()
    m1 = integrate.quad(lambda z: z * dens(z), lo, hi, epsabs=1e-13, limit=500)[0]
    m2 = integrate.quad(lambda z: (z - m1) ** 2 * dens(z), lo, hi, epsabs=1e-13, limit=500)[0]
    assert pred.mean[0].item() == pytest.approx(m1, rel=1e-9, abs=1e-12)
    assert pred.variance[0].item() == pytest.approx(m2, rel=1e-9)


def test_rescale_is_an_exact_change_of_units():
    pred, loc, var, y = _mixture(S=5, N=6, seed=6)
    m, s = 3.5, 2.5
    r = pred.rescale(m, s)
    assert r is not pred and (r.y_mean, r.y_std) == (m, s)
    torch.testing.assert_close(r.mean, m + s * pred.mean, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(r.variance.sqrt(), s * pred.variance.sqrt(), rtol=1e-14, atol=0)
    y_rep = m + s * y
    torch.testing.assert_close(
        r.log_prob(y_rep), pred.log_prob(y) - math.log(s), rtol=1e-14, atol=1e-14
    )
    # CRPS is in units of y: it scales by s; the CDF is invariant
    torch.testing.assert_close(r.crps(y_rep), s * pred.crps(y), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(r.cdf(y_rep), pred.cdf(y), rtol=1e-13, atol=1e-15)
    # against a direct computation in reporting units
    mu, sd = _np_components(loc, var, y_mean=m, y_std=s)
    brute = np.log(stats.norm.pdf(y_rep.numpy()[None, :], mu, sd).mean(0))
    np.testing.assert_allclose(r.log_prob(y_rep).numpy(), brute, rtol=1e-12)


def test_constructor_validation():
    loc = torch.zeros(3, 4, dtype=DT)
    lik = Gaussian(variance=NOISE).to(DT)
    with pytest.raises(ValueError, match=r"\(S, N\)"):
        MixturePredictive(loc, torch.ones(3, 5, dtype=DT), lik)
    with pytest.raises(ValueError, match=r"\(S, N\)"):
        MixturePredictive(loc[0], torch.ones(4, dtype=DT), lik)
    with pytest.raises(ValueError, match="y_std"):
        MixturePredictive(loc, torch.ones(3, 4, dtype=DT), lik, y_std=0.0)
    probit = MixturePredictive(loc, torch.ones(3, 4, dtype=DT), BernoulliProbit())
    # binary labels: the CRPS is the Brier score (p(y=1) - y)^2
    y = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=DT)
    torch.testing.assert_close(probit.crps(y), (probit.mean - y) ** 2)
    with pytest.raises(ValueError, match="0/1 or -1/1"):
        probit.crps(torch.full((4,), 0.5, dtype=DT))


# ------------------------------------------------------------------ metrics
def _point_predictive(means, sds=None, noise=1e-300):
    """Single-component Gaussian predictive with given means and sds (var + noise)."""
    means = torch.as_tensor(means, dtype=DT)
    sds = torch.ones_like(means) if sds is None else torch.as_tensor(sds, dtype=DT)
    return MixturePredictive(means[None], (sds**2)[None], Gaussian(variance=noise).to(DT))


def test_nll_rmse_crps_by_hand():
    pred = _point_predictive([0.0, 1.0, 2.0], [1.0, 2.0, 0.5])
    y = torch.tensor([1.0, 1.0, 0.0], dtype=DT)
    # errors 1, 0, -2: rmse = sqrt(5 / 3)
    assert metrics.rmse(pred, y) == pytest.approx(math.sqrt(5 / 3), rel=1e-14)
    logp = [stats.norm.logpdf(1.0, 0.0, 1.0), stats.norm.logpdf(1.0, 1.0, 2.0)]
    logp.append(stats.norm.logpdf(0.0, 2.0, 0.5))
    assert metrics.nll(pred, y) == pytest.approx(-np.mean(logp), rel=1e-13)

    # CRPS of N(0, 1) at 1, N(1, 4) at its mean, N(2, 1/4) at 0
    def crps1(z, s):
        return s * (
            z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi)
        )

    ref = np.mean([crps1(1.0, 1.0), crps1(0.0, 2.0), crps1(-4.0, 0.5)])
    assert metrics.crps(pred, y) == pytest.approx(ref, rel=1e-12)
    # the closed form against CRPS's definition, int (F(x) - 1{x >= y})^2 dx, by quadrature
    for mu, sd, obs in ((0.0, 1.0, 1.0), (2.0, 0.5, 0.0)):
        below, _ = integrate.quad(lambda x, a=mu, b=sd: stats.norm.cdf(x, a, b) ** 2,
                                  -np.inf, obs)
        above, _ = integrate.quad(lambda x, a=mu, b=sd: stats.norm.sf(x, a, b) ** 2,
                                  obs, np.inf)
        assert crps1((obs - mu) / sd, sd) == pytest.approx(below + above, rel=1e-7)
    report = metrics.regression_report(pred, y)
    assert set(report) == {"nll", "rmse", "crps", "coverage95"}
    assert report["rmse"] == pytest.approx(math.sqrt(5 / 3), rel=1e-14)


def test_coverage_by_hand():
    # N(0, 1) predictive at 5 points; the central 95% interval is +-1.959964
    pred = _point_predictive([0.0] * 5)
    y = torch.tensor([0.0, 1.9, -1.95, 1.97, -3.0], dtype=DT)
    assert metrics.coverage(pred, y, 0.95) == pytest.approx(3 / 5, abs=1e-15)
    # the 50% interval is +-0.6745
    y = torch.tensor([0.6, -0.67, 0.68, 0.0, 2.0], dtype=DT)
    assert metrics.coverage(pred, y, 0.5) == pytest.approx(3 / 5, abs=1e-15)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="level"):
            metrics.coverage(pred, y, bad)


def _probit_predictive(p):
    """A probit predictive whose mean p(y = 1) is ``p``: loc = Phi^{-1}(p), var = 0, so that
    Phi(loc / sqrt(1 + 0)) = p."""
    loc = torch.as_tensor(stats.norm.ppf(np.asarray(p, dtype=float)), dtype=DT)[None]
    return MixturePredictive(loc, torch.zeros_like(loc), BernoulliProbit())


def test_accuracy_by_hand():
    pred = _probit_predictive([0.9, 0.2, 0.6, 0.4, 0.51])
    torch.testing.assert_close(pred.mean, torch.tensor([0.9, 0.2, 0.6, 0.4, 0.51], dtype=DT))
    y = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0], dtype=DT)
    assert metrics.accuracy(pred, y) == pytest.approx(4 / 5, abs=1e-15)
    # probit NLL: -mean log p(y_i), p(1) = pred.mean
    ref = -np.mean(np.log([0.9, 0.8, 0.4, 0.6, 0.51]))
    assert metrics.nll(pred, y) == pytest.approx(ref, rel=1e-12)


def test_metrics_refuse_misshaped_targets_and_read_both_label_codings():
    pred = _point_predictive([0.0, 1.0, 2.0], [1.0, 2.0, 0.5])
    y = torch.tensor([1.0, 1.0, 0.0], dtype=DT)
    for metric in (metrics.nll, metrics.rmse, metrics.crps, metrics.coverage):
        with pytest.raises(ValueError, match=r"y.squeeze\(-1\)"):  # (N, 1) broadcasts to N x N
            metric(pred, y.unsqueeze(-1))
        with pytest.raises(ValueError, match=r"shape \(3,\)"):
            metric(pred, y[:1])
    probit = _probit_predictive([0.9, 0.2, 0.6, 0.4, 0.51])
    zero_one = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0], dtype=DT)
    for metric in (metrics.accuracy, metrics.auc, metrics.nll):
        assert metric(probit, 2 * zero_one - 1) == metric(probit, zero_one)
    assert metrics.accuracy(probit, 2 * zero_one - 1) == pytest.approx(4 / 5, abs=1e-15)
    with pytest.raises(ValueError, match="0/1 or -1/1"):
        metrics.accuracy(probit, torch.tensor([2.0, 0.0, 0.0, 0.0, 1.0], dtype=DT))


def _auc_pairs(score, labels):
    pos = [s for s, lab in zip(score, labels, strict=True) if lab]
    neg = [s for s, lab in zip(score, labels, strict=True) if not lab]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize(
    "score, labels",
    [
        ([0.9, 0.8, 0.7, 0.1], [1, 1, 0, 0]),  # perfect: 1
        ([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]),  # reversed: 0
        ([0.3, 0.3, 0.3, 0.3], [1, 0, 1, 0]),  # all tied: 0.5
        ([0.9, 0.4, 0.4, 0.6, 0.2, 0.4, 0.7], [1, 1, 0, 0, 0, 1, 0]),  # ties across classes
    ],
)
def test_auc_matches_pair_count(score, labels):
    pred = _probit_predictive(score)
    y = torch.tensor(labels, dtype=DT)
    expected = _auc_pairs(pred.mean.tolist(), labels)
    assert metrics.auc(pred, y) == pytest.approx(expected, abs=1e-14)


def test_auc_known_values_and_random():
    assert metrics.auc(_probit_predictive([0.9, 0.8, 0.7, 0.1]),
                       torch.tensor([1, 1, 0, 0], dtype=DT)) == 1.0
    pred = _probit_predictive([0.9, 0.4, 0.4, 0.6, 0.2, 0.4, 0.7])
    y = torch.tensor([1, 1, 0, 0, 0, 1, 0], dtype=DT)
    # positives 0.9, 0.4, 0.4 vs negatives 0.4, 0.6, 0.2, 0.7:
    # 0.9 beats 4; each 0.4 beats 0.2, ties 0.4 -> 1.5 each; total 7 of 12
    assert metrics.auc(pred, y) == pytest.approx(7 / 12, abs=1e-14)
    rng = np.random.default_rng(0)
    score = np.round(rng.uniform(0.05, 0.95, 60), 1)  # many ties
    labels = rng.integers(0, 2, 60)
    pred = _probit_predictive(score)
    expected = _auc_pairs(pred.mean.tolist(), labels.tolist())
    assert metrics.auc(pred, torch.tensor(labels, dtype=DT)) == pytest.approx(expected, abs=1e-14)
    with pytest.raises(ValueError, match="both classes"):
        metrics.auc(_probit_predictive([0.2, 0.7]), torch.ones(2, dtype=DT))


def test_bayesian_noise_reaches_the_predictive_and_the_pointwise_log_likelihood():
    """A PyroSample noise on the library's Gaussian likelihood: each predictive draw's
    component, and each draw's pointwise log-likelihood in the DataTree, use that draw's noise
    from the guide (not the prior's, which PyroModule would draw outside the model's call)."""
    import pyro_dgp as dgp
    from pyro_dgp.diagnostics.export import to_datatree
    from tests.train.test_training import bayesian_noise_model

    data = dgp.datasets.step(n_train=30, n_test=20, seed=1)
    X, y = data.X_train, data.y_train
    model, guide = bayesian_noise_model(X, y, init_scale=0.05)
    pred = dgp.predict(model, guide, data.X_test, num_samples=50, chunk_rows=7, seed=0)
    noise = pred.hyperparameters["variance"]  # (S, N): one draw per row and chunk of points
    assert noise.shape == (50, 20)
    assert all(bool((c == c[:, :1]).all()) for c in noise.split(7, -1))
    assert 0.7 < float(noise.min()) and float(noise.max()) < 1.2 and float(noise.std()) > 0
    comp = torch.distributions.Normal(pred.loc, (pred.var + noise).sqrt())
    y_test = data.y_test
    ref = torch.logsumexp(comp.log_prob(y_test), 0) - math.log(50)
    torch.testing.assert_close(pred.log_prob(y_test), ref, rtol=1e-12, atol=0)
    ref_var = (pred.var + noise).mean(0) + pred.loc.var(0, unbiased=False)
    torch.testing.assert_close(pred.variance, ref_var, rtol=1e-12, atol=0)
    # the DataTree's pointwise log-likelihood: each draw's own noise
    dt = to_datatree(model, guide, X, y, num_samples=8, seed=0)
    name = next(k for k in dt["posterior"].data_vars if str(k).endswith("likelihood.variance"))
    draws = torch.as_tensor(dt["posterior"][name].values[0])  # (8,)
    f_mean = torch.as_tensor(dt["layers"]["layer1.f_mean"].values[0, :, :, 0])  # (8, N)
    f_var = torch.as_tensor(dt["layers"]["layer1.f_var"].values[0, :, :, 0])
    ref_ll = torch.distributions.Normal(f_mean, (f_var + draws[:, None]).sqrt()).log_prob(y)
    np.testing.assert_allclose(dt["log_likelihood"]["y"].values[0], ref_ll.numpy(), rtol=1e-10)


def test_mixture_refuses_a_column_target():
    """With S = 1 (a one-layer collapsed guide) a (N, 1) target broadcast to N x N
    gave another, wrong, (N,) log-density."""
    pred = MixturePredictive(torch.zeros(1, 5, dtype=DT), torch.ones(1, 5, dtype=DT),
                             Gaussian(variance=0.1).to(DT))
    y = torch.linspace(-1, 1, 5, dtype=DT)
    for method in (pred.log_prob, pred.crps):
        with pytest.raises(ValueError, match=r"y.squeeze\(-1\)"):
            method(y.unsqueeze(-1))
        assert method(y).shape == (5,)


def test_predict_with_another_guide_keeps_each_draws_noise():
    """A guide that is not the model's own layer guide (here a plain function around it): the
    model is replayed on its draws, so a Bayesian noise is each draw's, not a new prior draw
    at every evaluation, and the predictive equals the one of the guide itself."""
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroSample

    import pyro_dgp as dgp

    X = torch.linspace(-1, 1, 12, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1))
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    model.likelihood.variance = PyroSample(pyro.distributions.LogNormal(
        torch.tensor(-2.0, dtype=DT), 1.0))
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model), init_scale=0.5), model)
    guide(X, y)

    def wrapper(*args, **kwargs):
        return guide(*args, **kwargs)

    own = dgp.predict(model, guide, X, num_samples=5, seed=1).log_prob(y)
    other = dgp.predict(model, wrapper, X, num_samples=5, seed=1)
    first, second = other.log_prob(y), other.log_prob(y)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, own, rtol=1e-12, atol=0)
