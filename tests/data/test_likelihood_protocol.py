"""The likelihood protocol (docs/likelihoods.md): a subclass that defines only ``conditional(f)``
can be fitted, predicted with and scored; where no closed form exists the predictive is
estimated from seeded draws, checked against the closed forms of the Gaussian and binary
cases within Monte Carlo standard errors, and against quadrature for a Student-t."""

import math
import re
from pathlib import Path

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from protocol_likelihoods import BareGaussian, ProtocolGaussian, Z, replica_check, tiled
from pyro.distributions import constraints
from pyro.nn import PyroParam
from scipy import integrate, stats

import pyro_dgp as dgp
from pyro_dgp.likelihoods import BernoulliProbit, Gaussian, Likelihood, StudentT
from pyro_dgp.prediction import MixturePredictive, gaussian_mixture_crps
from pyro_dgp.prediction import mixture as mixture_module
from pyro_dgp.prediction.sampled import sample_crps
from pyro_dgp.rng import seeded

DT = torch.float64
DOC = Path(__file__).resolve().parents[2] / "docs" / "likelihoods.md"


pytestmark = pytest.mark.usefixtures("float64_local_params")


class Laplace(Likelihood):
    def __init__(self, scale=0.1):
        super().__init__()
        self.scale = PyroParam(torch.tensor(scale), constraints.positive)

    def conditional(self, f):
        return dist.Laplace(f, self.scale)


def _components(S=4, N=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(S, N, generator=g, dtype=DT)
    var = 0.05 + 0.5 * torch.rand(S, N, generator=g, dtype=DT)
    y = torch.randn(N, generator=g, dtype=DT)
    return loc, var, y


# ------------------------------------------------------------------ the documented protocol
def test_docs_table_is_the_protocol_and_its_example_runs():
    text = DOC.read_text()
    section = text.split("## What a subclass defines")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)[(` ]", section, flags=re.MULTILINE)
    members = {"conditional", "expected_log_prob", "predictive_log_prob", "predictive_moments",
               "predictive_sample", "gaussian_predictive", "binary", "alpha_log_expectation"}
    assert set(rows) == members
    assert all(hasattr(Likelihood, name) for name in members)
    required = re.findall(r"^\| `(\w+)[^|]*\| yes \|", section, flags=re.MULTILINE)
    assert required == ["conditional"]
    # the example in the docs is a complete likelihood
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)
    namespace = {}
    exec(code, namespace)  # noqa: S102 - the repository's own documentation
    lik = namespace["Laplace"](scale=0.5)
    pred = MixturePredictive(torch.zeros(2, 3), torch.ones(2, 3), lik, mc_samples=200)
    torch.testing.assert_close(pred.variance, torch.full((3,), 1 + 2 * 0.25))
    assert bool(torch.isfinite(pred.crps(torch.zeros(3))).all())


def test_missing_or_wrong_conditional_names_the_class_and_the_method():
    class NoConditional(Likelihood):
        pass

    class NotADistribution(Likelihood):
        def conditional(self, f):
            return f

    class TwoPerPoint(Likelihood):
        def conditional(self, f):
            return dist.Normal(f.unsqueeze(-1).expand(*f.shape, 2), 1.0).to_event(1)

    loc, var, y = _components()
    pred = MixturePredictive(loc, var, NoConditional())
    for call in (lambda: pred.mean, lambda: pred.log_prob(y), lambda: pred.crps(y),
                 lambda: pred.quantiles([0.5])):
        with pytest.raises(NotImplementedError, match=r"NoConditional .*conditional\(f\)"):
            call()
    with pytest.raises(TypeError, match=r"NotADistribution\.conditional\(f\).*Tensor"):
        MixturePredictive(loc, var, NotADistribution()).log_prob(y)
    with pytest.raises(ValueError, match=r"TwoPerPoint\.conditional\(f\).*one y per f"):
        MixturePredictive(loc, var, TwoPerPoint()).crps(y)
    data = dgp.datasets.step(n_train=20, n_test=5, seed=1)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=1, num_inducing=4,
                                  likelihood=NoConditional())
    with pytest.raises(NotImplementedError, match=r"NoConditional .*conditional\(f\)"):
        dgp.fit(model, dgp.guides.MeanField(model), data.X_train, data.y_train, num_steps=1,
                progress=False)
    with pytest.raises(NotImplementedError, match=r"BareGaussian: .*predictive_moments"):
        BareGaussian().predictive_moments(loc, var)
    for bad in (0, 2.5, None):
        with pytest.raises((TypeError, ValueError), match="mc_samples"):
            MixturePredictive(loc, var, Laplace(), mc_samples=bad)
    with pytest.raises(ValueError, match="mc_seed"):
        MixturePredictive(loc, var, Laplace(), mc_seed=-1)


# ------------------------------------------------------------------ Gaussian known answers
def test_protocol_gaussian_moments_and_density_match_the_closed_forms():
    loc, var, y = _components()
    own = MixturePredictive(loc, var, ProtocolGaussian(0.3), 1.5, 2.0)
    ref = MixturePredictive(loc, var, Gaussian(0.3), 1.5, 2.0)
    # Gauss-Hermite of a linear mean and a constant variance: exact
    torch.testing.assert_close(own.mean, ref.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(own.variance, ref.variance, rtol=1e-12, atol=1e-12)
    y = 1.5 + 2.0 * y
    # 20-point Gauss-Hermite of N(y | f, 0.3) over f ~ N(loc, var <= 0.55): ~1e-7
    torch.testing.assert_close(own.log_prob(y), ref.log_prob(y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mc_samples,copies", [(6, 4000), (1000, 300)])
def test_sample_crps_is_unbiased_against_the_closed_form(mc_samples, copies):
    """The stratified fair estimator against the Gaussian mixture's closed form (Grimit et al.
    2006), within Z standard errors of the mean of ``copies`` replicas per point. With 6
    draws (2 per component) the naive estimator, all m^2 pairs averaged, is biased by about
    E|Y - Y'| / (2 m): the check must catch it."""
    loc, var, y = _components(S=3, N=5)
    loc, var, y = tiled(loc, var, y, copies)
    pred = MixturePredictive(loc, var, ProtocolGaussian(0.2), mc_samples=mc_samples)
    exact = gaussian_mixture_crps(y[:5], loc[:, :5], var[:, :5] + 0.2)
    closed = MixturePredictive(loc, var, Gaussian(0.2)).crps(y)
    torch.testing.assert_close(closed[:5], exact, rtol=1e-14, atol=0)
    estimate = pred.crps(y)
    se = replica_check(estimate, exact, copies)
    if mc_samples == 6:
        with seeded(1, loc.device):
            draws = pred.likelihood.predictive_sample(loc, var, 2).reshape(6, -1)  # (m, N)
        naive = ((draws - y).abs().mean(0)
                 - 0.5 * (draws.unsqueeze(0) - draws.unsqueeze(1)).abs().mean((0, 1)))
        bias = (naive.reshape(copies, -1).mean(0) - exact).abs()
        assert bool((bias > Z * se).all())


def test_sampled_cdf_quantiles_and_coverage_match_the_closed_forms():
    loc, var, y = _components(S=3, N=4)
    own = MixturePredictive(loc, var, ProtocolGaussian(0.2), mc_samples=20000)
    ref = MixturePredictive(loc, var, Gaussian(0.2))
    m = 3 * own.draws_per_component
    F = ref.cdf(y)
    assert bool(((own.cdf(y) - F).abs() < Z * (F * (1 - F) / m).sqrt()).all())
    grid = torch.stack([y - 1, y, y + 1])  # (3, N) broadcasts against (N,)
    assert own.cdf(grid).shape == (3, 4)
    q = torch.tensor([0.025, 0.5, 0.975])
    Q = ref.quantiles(q)
    # a sample quantile's standard error: sqrt(q (1 - q) / m) / density at the quantile
    sampled = own.quantiles(q)
    for i in range(3):
        se = math.sqrt(q[i] * (1 - q[i]) / m) / ref.log_prob(Q[i]).exp()
        assert bool(((sampled[i] - Q[i]).abs() < Z * se).all())
    y_obs = torch.randn(4, 500, generator=torch.Generator().manual_seed(3)).reshape(-1)
    tiled = MixturePredictive(loc.repeat(1, 500), var.repeat(1, 500), ProtocolGaussian(0.2))
    cover = dgp.metrics.coverage(tiled, y_obs)
    assert cover == pytest.approx(
        dgp.metrics.coverage(MixturePredictive(loc.repeat(1, 500), var.repeat(1, 500),
                                               Gaussian(0.2)), y_obs), abs=0.02)


def test_moments_from_draws_where_the_conditional_has_none():
    loc, var, y = _components(S=5, N=3)
    loc, var, y = tiled(loc, var, y, 400)
    own = MixturePredictive(loc, var, BareGaussian(0.3), 2.0, 3.0, mc_samples=50)
    ref = MixturePredictive(loc, var, Gaussian(0.3), 2.0, 3.0)
    replica_check(own.mean, ref.mean[:3], 400)
    replica_check(own.variance, ref.variance[:3], 400)


# ------------------------------------------------------------------ other likelihoods
def test_binary_closed_forms_agree_with_the_sampled_estimates():
    loc, var, _ = _components(S=4, N=5)
    y = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    pred = MixturePredictive(loc, var, BernoulliProbit())
    p = pred.mean
    torch.testing.assert_close(pred.crps(y), (p - y) ** 2, rtol=1e-14, atol=0)
    torch.testing.assert_close(pred.crps(2 * y - 1), (p - y) ** 2, rtol=1e-14, atol=0)
    assert dgp.metrics.crps(pred, y) == pytest.approx(float(((p - y) ** 2).mean()), rel=1e-14)
    torch.testing.assert_close(pred.quantiles([0.5])[0], (p > 0.5).to(DT))
    torch.testing.assert_close(pred.cdf(torch.zeros(5)), 1 - p)
    torch.testing.assert_close(pred.cdf(torch.full((5,), -0.5)), torch.zeros(5))
    torch.testing.assert_close(pred.cdf(torch.ones(5)), torch.ones(5))
    # the same Bernoulli predictives through the generic draws, in independent replicas
    copies = 500
    with seeded(1, loc.device):
        draws = BernoulliProbit().predictive_sample(*tiled(loc, var, y, copies)[:2], 250)
    replica_check(sample_crps(y.repeat(copies), draws), (p - y) ** 2, copies)


def test_student_t_crps_from_draws_against_quadrature():
    """At var = 0 the predictive is the t distribution itself; CRPS = int (F - 1{x >= y})^2."""
    df, scale = 4.0, 0.5
    loc = torch.tensor([[0.0, 1.0, -2.0]])
    y = torch.tensor([0.3, 3.0, -2.0])
    copies = 200
    pred = MixturePredictive(loc.repeat(1, copies), torch.zeros(1, 3 * copies),
                             StudentT(df, scale), mc_samples=500)
    exact = []
    for mu, obs in zip(loc[0].tolist(), y.tolist(), strict=True):
        below, _ = integrate.quad(lambda x, mu=mu: stats.t.cdf(x, df, mu, scale) ** 2,
                                  -np.inf, obs)
        above, _ = integrate.quad(lambda x, mu=mu: stats.t.sf(x, df, mu, scale) ** 2,
                                  obs, np.inf)
        exact.append(below + above)
    replica_check(pred.crps(y.repeat(copies)), torch.tensor(exact), copies)


# ------------------------------------------------------------------ fit, predict, seeds
def test_fit_predict_and_score_a_custom_likelihood():
    data = dgp.datasets.step(n_train=40, n_test=25, seed=1)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=6,
                                  likelihood=Laplace(0.3))
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=15, lr=0.02, seed=0,
                     progress=False)
    assert all(math.isfinite(loss) for loss in result.losses)
    pred = dgp.predict(model, guide, data.X_test, num_samples=10, seed=0, y_mean=1.0,
                       y_std=2.0)
    b = float(model.likelihood.scale.detach())
    # Laplace(f, b): mean f, variance 2 b^2; over the mixture, the law of total variance
    torch.testing.assert_close(pred.mean, 1.0 + 2.0 * pred.loc.mean(0), rtol=1e-12, atol=1e-12)
    ref_var = 4.0 * ((pred.var + 2 * b**2).mean(0) + pred.loc.var(0, unbiased=False))
    torch.testing.assert_close(pred.variance, ref_var, rtol=1e-10, atol=1e-12)
    y = 1.0 + 2.0 * data.y_test
    state = torch.get_rng_state()
    report = dgp.metrics.regression_report(pred, y)
    lo, hi = pred.quantiles([0.05, 0.95])
    assert torch.equal(torch.get_rng_state(), state)  # the draws leave the global stream
    assert all(math.isfinite(v) for v in report.values())
    assert bool((lo < hi).all()) and lo.shape == (25,)
    assert 0 <= report["coverage95"] <= 1 and report["crps"] > 0
    again = dgp.metrics.regression_report(pred, y)
    assert again == report  # the same draws at every call
    pred.mc_seed = 1
    assert dgp.metrics.crps(pred, y) != report["crps"]
    assert dgp.metrics.crps(pred.rescale(1.0, 2.0), y) == dgp.metrics.crps(pred, y)


def test_blocks_of_points_keep_each_points_hyperparameters(monkeypatch):
    """Per-draw, per-point noise (a Bayesian likelihood's draws, as predict records them)
    drawn in blocks of a few points: each block must read its own points' noise."""
    monkeypatch.setattr(mixture_module, "_DRAW_BLOCK", 3 * 200 * 7)  # 7 points per block
    S, N = 3, 40
    loc, var, y = _components(S=S, N=N)
    noise = torch.logspace(-3, 2, N).expand(S, N)
    hyper = {"variance": noise}
    own = MixturePredictive(loc, var, ProtocolGaussian(), hyperparameters=hyper,
                            mc_samples=600)
    ref = MixturePredictive(loc, var, Gaussian(), hyperparameters=hyper)
    # the noise spans five decades across points: another point's noise is far off
    assert bool(((own.crps(y) / ref.crps(y)).log().abs() < 0.3).all())
    torch.testing.assert_close(own.mean, ref.mean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_follows_the_inputs(dtype):
    loc, var, y = (t.to(dtype) for t in _components())
    lik = Laplace(0.2).to(dtype)
    pred = MixturePredictive(loc, var, lik)
    for out in (pred.mean, pred.variance, pred.crps(y), pred.cdf(y), pred.quantiles([0.1, 0.9]),
                pred.log_prob(y)):
        assert out.dtype == dtype and bool(torch.isfinite(out).all())


@pytest.mark.cuda
def test_draws_on_cuda_follow_the_device_and_leave_its_stream():
    loc, var, y = (t.cuda() for t in _components())
    pred = MixturePredictive(loc, var, Laplace(0.2).cuda())
    state = torch.cuda.get_rng_state()
    out = pred.crps(y)
    assert out.device.type == "cuda" and torch.equal(torch.cuda.get_rng_state(), state)
    torch.testing.assert_close(out, pred.crps(y), rtol=0, atol=0)
    assert pred.quantiles([0.5]).device.type == "cuda"
