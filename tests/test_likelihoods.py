"""Known answers for the likelihoods: closed forms and scipy.integrate.quad references for
E_{N(f; m, v)} log p(y | f) and log E_{N(f; m, v)} p(y | f), and the exactness of
Gauss-Hermite quadrature on polynomials."""

import math

import numpy as np
import pyro
import pytest
import torch
from scipy import integrate, special, stats

from pyro_dgp.likelihoods import BernoulliProbit, Gaussian, Likelihood, StudentT, gauss_hermite

DT = torch.float64


@pytest.fixture(autouse=True)
def _float64_local_params():
    """Parameters built in float64 (so a variance of 0.3 is 0.3, not its float32 rounding) and
    kept module-local (no aliasing of same-named parameters across likelihood instances)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    with pyro.settings.context(module_local_params=True):
        yield
    torch.set_default_dtype(old)


def _t(x):
    return torch.as_tensor(np.asarray(x, dtype=float), dtype=DT)


def _quad_expect(g, m, v):
    """int N(f; m, v) g(f) df, adaptive quadrature on +-30 sd around the mean."""
    sd = math.sqrt(v)
    val, _ = integrate.quad(
        lambda f: stats.norm.pdf(f, m, sd) * g(f),
        m - 30 * sd,
        m + 30 * sd,
        epsabs=1e-14,
        epsrel=1e-13,
        limit=500,
    )
    return val


def _quad_log_expect(g, m, v, y=None):
    """log int N(f; m, v) g(f) df; ``y`` is a breakpoint (peak of a narrow likelihood)."""
    sd = math.sqrt(v)
    lo, hi = min(m - 30 * sd, (y or m) - 30), max(m + 30 * sd, (y or m) + 30)
    pts = [y] if y is not None else None
    val, _ = integrate.quad(
        lambda f: stats.norm.pdf(f, m, sd) * g(f),
        lo,
        hi,
        points=pts,
        epsabs=0,
        epsrel=1e-13,
        limit=500,
    )
    return math.log(val)


# moderate (loc, var, y) cases
CASES = [(0.3, 0.05, -0.4), (-1.2, 0.5, 0.7), (0.0, 1.0, 2.5), (2.0, 0.2, 1.9)]


# ------------------------------------------------------------------ Gaussian
def test_gaussian_expected_log_prob_closed_form_and_quad():
    s2 = 0.3
    lik = Gaussian(variance=s2).to(DT)
    m, v, y = (_t([c[i] for c in CASES]) for i in range(3))
    out = lik.expected_log_prob(y, m, v)
    # E[log N(y | f, s2)] = -0.5 log(2 pi s2) - ((y - m)^2 + v) / (2 s2)
    closed = -0.5 * math.log(2 * math.pi * s2) - ((y - m) ** 2 + v) / (2 * s2)
    torch.testing.assert_close(out, closed, rtol=1e-13, atol=1e-13)
    for i, (mi, vi, yi) in enumerate(CASES):
        ref = _quad_expect(lambda f, yi=yi: stats.norm.logpdf(yi, f, math.sqrt(s2)), mi, vi)
        assert out[i].item() == pytest.approx(ref, rel=1e-10)
    # the generic Gauss-Hermite path agrees (the integrand is a quadratic: exact)
    gh = Likelihood.expected_log_prob(lik, y, m, v)
    torch.testing.assert_close(gh, closed, rtol=1e-12, atol=1e-12)


def test_gaussian_predictive_log_prob():
    s2 = 0.3
    lik = Gaussian(variance=s2).to(DT)
    m, v, y = (_t([c[i] for c in CASES]) for i in range(3))
    out = lik.predictive_log_prob(y, m, v)
    closed = -0.5 * torch.log(2 * math.pi * (v + s2)) - (y - m) ** 2 / (2 * (v + s2))
    torch.testing.assert_close(out, closed, rtol=1e-13, atol=1e-13)
    for i, (mi, vi, yi) in enumerate(CASES):
        ref = _quad_log_expect(lambda f, yi=yi: stats.norm.pdf(yi, f, math.sqrt(s2)), mi, vi)
        assert out[i].item() == pytest.approx(ref, rel=1e-10)
    mean, var = lik.predictive_moments(m, v)
    torch.testing.assert_close(mean, m)
    torch.testing.assert_close(var, v + s2)


# ------------------------------------------------------------------ probit
PROBIT_CASES = [(m, v) for m in (-1.0, 0.3, 2.0) for v in (0.01, 0.3, 1.0)]


@pytest.mark.parametrize("y", [0.0, 1.0])
def test_probit_expected_log_prob_matches_quad(y):
    # log Phi is smooth (analytic) and nearly linear in the tails: 20-point Gauss-Hermite is
    # exact for degree-39 polynomials, measured error <= 5e-10 relative for v <= 1.
    lik = BernoulliProbit()
    sgn = 1.0 if y else -1.0
    m = _t([c[0] for c in PROBIT_CASES])
    v = _t([c[1] for c in PROBIT_CASES])
    out = lik.expected_log_prob(torch.full_like(m, y), m, v)
    for i, (mi, vi) in enumerate(PROBIT_CASES):
        ref = _quad_expect(lambda f: special.log_ndtr(sgn * f), mi, vi)
        assert out[i].item() == pytest.approx(ref, rel=1e-8, abs=1e-12)


@pytest.mark.parametrize("y", [0.0, 1.0])
def test_probit_predictive_log_prob_closed_form_and_quad(y):
    lik = BernoulliProbit()
    sgn = 1.0 if y else -1.0
    m = _t([c[0] for c in PROBIT_CASES] + [8.0, -8.0])
    v = _t([c[1] for c in PROBIT_CASES] + [0.5, 0.5])
    yy = torch.full_like(m, y)
    out = lik.predictive_log_prob(yy, m, v)
    # int Phi(f) N(f; m, v) df = Phi(m / sqrt(1 + v))
    closed = special.log_ndtr(sgn * m.numpy() / np.sqrt(1 + v.numpy()))
    np.testing.assert_allclose(out.numpy(), closed, rtol=1e-13, atol=1e-300)
    for i, (mi, vi) in enumerate(PROBIT_CASES):
        ref = _quad_log_expect(lambda f: special.ndtr(sgn * f), mi, vi)
        assert out[i].item() == pytest.approx(ref, rel=1e-9)
    # the generic Gauss-Hermite predictive (base class) agrees with the closed form
    gh = Likelihood.predictive_log_prob(lik, yy[:-2], m[:-2], v[:-2])
    np.testing.assert_allclose(gh.numpy(), closed[:-2], rtol=1e-8)
    # predictive moments: p(y = 1) and its Bernoulli variance
    p, var = lik.predictive_moments(m, v)
    # (torch's ndtr is ~1e-6 relative in the far tail, p ~ 1e-11: hence the atol)
    np.testing.assert_allclose(
        p.numpy(), special.ndtr(m.numpy() / np.sqrt(1 + v.numpy())), rtol=1e-12, atol=1e-15
    )
    torch.testing.assert_close(var, p * (1 - p))


def test_probit_log_prob_is_stable_in_the_tails():
    lik = BernoulliProbit()
    f = _t([-40.0, 40.0])
    lp1 = lik.conditional(f).log_prob(torch.ones(2, dtype=DT))
    lp0 = lik.conditional(f).log_prob(torch.zeros(2, dtype=DT))
    np.testing.assert_allclose(lp1.numpy(), special.log_ndtr([-40.0, 40.0]), rtol=1e-12)
    np.testing.assert_allclose(lp0.numpy(), special.log_ndtr([40.0, -40.0]), rtol=1e-12)
    assert torch.isfinite(lp1).all() and torch.isfinite(lp0).all()


# ------------------------------------------------------------------ Student-t
STUDENT_CASES = [(0.3, 0.05, -0.4), (-1.2, 0.3, 0.7), (0.0, 0.5, 2.5), (2.0, 0.2, 1.9)]


def test_student_t_matches_quad_for_moderate_variance():
    # scale 1, v <= 0.5: the t-density in f is ~as wide as N(m, v), so 20-point Gauss-Hermite
    # (exact to degree 39) resolves it: measured error ~2e-10 (E log p) and ~3e-8 (log E p).
    df, scale = 4.0, 1.0
    lik = StudentT(df=df, scale=scale).to(DT)
    m, v, y = (_t([c[i] for c in STUDENT_CASES]) for i in range(3))
    with torch.no_grad():
        e = lik.expected_log_prob(y, m, v)
        p = lik.predictive_log_prob(y, m, v)
        z = lik.expected_log_prob(y, m, torch.zeros_like(v))
        z_pred = lik.predictive_log_prob(y, m, torch.zeros_like(v))
    for i, (mi, vi, yi) in enumerate(STUDENT_CASES):
        ref_e = _quad_expect(lambda f, yi=yi: stats.t.logpdf(yi, df, f, scale), mi, vi)
        ref_p = _quad_log_expect(lambda f, yi=yi: stats.t.pdf(yi, df, f, scale), mi, vi, y=yi)
        assert e[i].item() == pytest.approx(ref_e, rel=1e-6)
        assert p[i].item() == pytest.approx(ref_p, rel=1e-6)
    # zero variance: both reduce to log p(y | m)
    ref = stats.t.logpdf(y.numpy(), df, m.numpy(), scale)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(z_pred.numpy(), ref, rtol=1e-12)


def test_student_t_small_variance_default_scale():
    # default scale 0.1 with sd(f) <= scale / sqrt(2): the spike is still resolved by 20 nodes
    # (measured error <= 5e-8; at sd(f) = scale it grows to ~1e-5; for sd(f) >> scale see
    # test_student_t_predictive_default_scale_large_variance)
    df = 4.0
    lik = StudentT(df=df).to(DT)
    assert lik.scale.item() == pytest.approx(0.1, rel=1e-15)
    m, v, y = _t([0.3, -0.2]), _t([0.0025, 0.005]), _t([0.25, -0.1])
    with torch.no_grad():
        e = lik.expected_log_prob(y, m, v)
        p = lik.predictive_log_prob(y, m, v)
    for i in range(2):
        mi, vi, yi = m[i].item(), v[i].item(), y[i].item()
        ref_e = _quad_expect(lambda f, yi=yi: stats.t.logpdf(yi, df, f, 0.1), mi, vi)
        ref_p = _quad_log_expect(lambda f, yi=yi: stats.t.pdf(yi, df, f, 0.1), mi, vi, y=yi)
        assert e[i].item() == pytest.approx(ref_e, rel=1e-6)
        assert p[i].item() == pytest.approx(ref_p, rel=1e-6)


def test_student_t_predictive_default_scale_large_variance():
    df = 4.0
    lik = StudentT(df=df).to(DT)
    m, v, y = _t([0.3, 0.3]), _t([0.5, 1.0]), _t([-0.4, -0.4])
    with torch.no_grad():
        p = lik.predictive_log_prob(y, m, v)
        e = lik.expected_log_prob(y, m, v)
    for i in range(2):
        mi, vi, yi = m[i].item(), v[i].item(), y[i].item()
        ref_p = _quad_log_expect(lambda f, yi=yi: stats.t.pdf(yi, df, f, 0.1), mi, vi, y=yi)
        assert p[i].item() == pytest.approx(ref_p, rel=1e-3)
        # sd(f) 7 to 10 times the scale: the 20-node rule's error on E log p is 9e-4 and 7e-3
        # relative (measured); a looser bound, but a bound
        ref_e = _quad_expect(lambda f, yi=yi: stats.t.logpdf(yi, df, f, 0.1), mi, vi)
        assert e[i].item() == pytest.approx(ref_e, rel=1e-2)


def test_student_t_predictive_moments():
    lik = StudentT(df=5.0, scale=0.4).to(DT)
    m, v = _t([0.1, -2.0]), _t([0.2, 1.0])
    with torch.no_grad():
        mean, var = lik.predictive_moments(m, v)
    torch.testing.assert_close(mean, m)
    torch.testing.assert_close(var, v + 0.16 * 5.0 / 3.0)
    mean, var = StudentT(df=2.0).predictive_moments(m, v)
    assert torch.isinf(var).all()


# ------------------------------------------------------------------ Gauss-Hermite
def _normal_raw_moment(k, m, v):
    """E[f^k], f ~ N(m, v): sum_j C(k, j) m^(k-j) v^(j/2) (j-1)!! over even j."""
    total = 0.0
    for j in range(0, k + 1, 2):
        dfact = math.prod(range(j - 1, 0, -2)) if j > 0 else 1
        total += math.comb(k, j) * m ** (k - j) * v ** (j / 2) * dfact
    return total


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_gauss_hermite_exact_to_degree_2n_minus_1(n):
    m, v = 0.7, 1.3
    loc, var = _t([m]), _t([v])
    f, log_w = gauss_hermite(loc, var, n)
    assert f.shape == (n, 1) and log_w.shape == (n, 1)
    w = log_w.exp()
    assert w.sum().item() == pytest.approx(1.0, rel=1e-14)
    for k in range(2 * n):
        approx = (w * f**k).sum().item()
        exact = _normal_raw_moment(k, m, v)
        assert approx == pytest.approx(exact, rel=1e-11, abs=1e-12), k
    # degree 2n is not integrated exactly: the rule is no better than advertised
    k = 2 * n
    central = (w * (f - m) ** k).sum().item()
    exact_central = v**n * math.prod(range(2 * n - 1, 0, -2))
    assert abs(central - exact_central) > 1e-3 * exact_central


def test_gauss_hermite_shapes_and_broadcasting():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(2, 3, 4, generator=g, dtype=DT)
    var = torch.rand(2, 3, 4, generator=g, dtype=DT) + 0.1
    f, log_w = gauss_hermite(loc, var, 7)
    assert f.shape == (7, 2, 3, 4) and log_w.shape == (7, 1, 1, 1)
    assert f.dtype == DT and log_w.dtype == DT
    w = log_w.exp()
    torch.testing.assert_close((w * f).sum(0), loc, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((w * (f - loc) ** 2).sum(0), var, rtol=1e-12, atol=1e-12)
    # zero variance collapses every node onto the mean
    f0, _ = gauss_hermite(loc, torch.zeros_like(var), 7)
    torch.testing.assert_close(f0, loc.expand(7, 2, 3, 4), rtol=0, atol=0)
