"""The weighted predictive mixture ``sum_s w_s p_s(y)`` (the learned quadrature of Meng and Zhang
2024): closed forms of a two-component weighted Gaussian mixture computed here with scipy,
uniform weights against the unweighted mixture, and the weighted estimates from draws (for
likelihoods without closed forms) against the Gaussian closed forms within Monte Carlo error."""

import math

import numpy as np
import pytest
import torch
from protocol_likelihoods import BareGaussian, ProtocolGaussian, replica_check, tiled
from scipy import integrate, optimize, stats

from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import MixturePredictive, gaussian_mixture_crps

DT = torch.float64
NOISE = 0.2

pytestmark = pytest.mark.usefixtures("float64_local_params")


def _two_components():
    """``(loc, var)`` of 2 components at 3 points, per-point weights ``(2, 3)``, targets."""
    loc = torch.tensor([[-1.0, 0.3, 2.0], [1.5, 0.5, -0.4]], dtype=DT)
    var = torch.tensor([[0.5, 0.2, 0.05], [0.3, 1.0, 0.4]], dtype=DT)
    weights = torch.tensor([[0.3, 0.9, 0.5], [0.7, 0.1, 0.5]], dtype=DT)
    y = torch.tensor([0.1, 0.9, 0.7], dtype=DT)
    return loc, var, weights, y


def _weighted_crps_quad(y, w, mu, sd):
    """``int (F(z) - 1{z >= y})^2 dz`` of ``F = sum_s w_s Phi((z - mu_s) / sd_s)``."""
    def F(z):
        return float(np.sum(w * stats.norm.cdf(z, mu, sd)))
    lo, hi = min(float((mu - 40 * sd).min()), y - 1), max(float((mu + 40 * sd).max()), y + 1)
    kw = dict(epsabs=1e-13, epsrel=1e-12, limit=500)
    return (integrate.quad(lambda z: F(z) ** 2, lo, y, **kw)[0]
            + integrate.quad(lambda z: (1 - F(z)) ** 2, y, hi, **kw)[0])


@pytest.mark.parametrize("shared", [True, False])
def test_two_component_weighted_gaussian_mixture_matches_its_closed_forms(shared):
    """Weights ``(S,)`` shared by the points, or ``(S, N)`` per point; reported in units
    ``1.5 + 2 y`` (densities divided by 2)."""
    loc, var, weights, y = _two_components()
    if shared:
        weights = weights[:, 0]
    pred = MixturePredictive(loc, var, Gaussian(NOISE), 1.5, 2.0, weights=weights)
    y = 1.5 + 2.0 * y
    w = np.broadcast_to(weights.numpy().reshape(2, -1), (2, 3))
    mu = 1.5 + 2.0 * loc.numpy()
    sd = 2.0 * np.sqrt(var.numpy() + NOISE)
    for n in range(3):
        wn, mn, sn, yn = w[:, n], mu[:, n], sd[:, n], float(y[n])
        density = float(np.sum(wn * stats.norm.pdf(yn, mn, sn)))
        assert float(pred.log_prob(y)[n]) == pytest.approx(math.log(density), rel=1e-12)
        mean = float(np.sum(wn * mn))
        assert float(pred.mean[n]) == pytest.approx(mean, rel=1e-12)
        second = float(np.sum(wn * (sn**2 + mn**2)))
        assert float(pred.variance[n]) == pytest.approx(second - mean**2, rel=1e-12)
        for z in (yn - 1.0, yn, yn + 0.5):
            cdf = float(np.sum(wn * stats.norm.cdf(z, mn, sn)))
            got = float(pred.cdf(torch.full((3,), z, dtype=DT))[n])
            assert got == pytest.approx(cdf, rel=1e-12, abs=1e-15)
        assert float(pred.crps(y)[n]) == pytest.approx(_weighted_crps_quad(yn, wn, mn, sn),
                                                       rel=1e-9)
        for q, got in zip((0.1, 0.5, 0.9), pred.quantiles([0.1, 0.5, 0.9])[:, n], strict=True):
            root = optimize.brentq(
                lambda z, q=q, w=wn, m=mn, s=sn: np.sum(w * stats.norm.cdf(z, m, s)) - q,
                -50, 50, xtol=1e-14)
            assert float(got) == pytest.approx(root, abs=1e-9)


def test_a_component_of_weight_one_is_that_gaussian_alone():
    loc, var, _, y = _two_components()
    weights = torch.tensor([1.0, 0.0], dtype=DT)
    pred = MixturePredictive(loc, var, Gaussian(NOISE), weights=weights)
    alone = MixturePredictive(loc[:1], var[:1], Gaussian(NOISE))
    for name in ("mean", "variance"):
        torch.testing.assert_close(getattr(pred, name), getattr(alone, name), rtol=1e-14,
                                   atol=0)
    torch.testing.assert_close(pred.log_prob(y), alone.log_prob(y), rtol=1e-14, atol=0)
    torch.testing.assert_close(pred.crps(y), alone.crps(y), rtol=1e-12, atol=1e-15)


def _all_scores(pred, y):
    q = [0.0713, 0.3137, 0.8861]  # not multiples of 1/m: the sampled quantile is a draw
    return {"log_prob": pred.log_prob(y), "mean": pred.mean, "variance": pred.variance,
            "crps": pred.crps(y), "cdf": pred.cdf(torch.stack([y - 0.3, y + 0.2])),
            "quantiles": pred.quantiles(q)}


@pytest.mark.parametrize("likelihood", [Gaussian, ProtocolGaussian, BareGaussian])
def test_uniform_weights_reproduce_the_unweighted_mixture(likelihood):
    """Closed forms (Gaussian) and the estimates from the same seeded draws
    (``ProtocolGaussian``: only a conditional; ``BareGaussian``: no moments either): weights
    ``1/S`` as ``(S,)`` and as ``(S, N)`` give the unweighted numbers to rounding."""
    g = torch.Generator().manual_seed(2)
    S, N = 5, 4
    loc = torch.randn(S, N, generator=g, dtype=DT)
    var = 0.05 + 0.5 * torch.rand(S, N, generator=g, dtype=DT)
    y = torch.randn(N, generator=g, dtype=DT)
    plain = _all_scores(MixturePredictive(loc, var, likelihood(NOISE), 0.5, 3.0,
                                          mc_samples=200), y)
    for weights in (torch.full((S,), 1 / S, dtype=DT), torch.full((S, N), 1 / S, dtype=DT)):
        pred = MixturePredictive(loc, var, likelihood(NOISE), 0.5, 3.0, mc_samples=200,
                                 weights=weights)
        for name, value in _all_scores(pred, y).items():
            torch.testing.assert_close(value, plain[name], rtol=1e-12, atol=1e-13, msg=name)
        rescaled = pred.rescale(0.0, 1.0)
        assert rescaled.weights is pred.weights


def test_weighted_estimates_from_draws_are_unbiased():
    """A likelihood with only a conditional: the CRPS, CDF, mean and variance estimated from
    weighted draws against the weighted Gaussian closed forms, the mean of 2000 independent
    replicas of each point within ``Z = 4`` of their standard error (the replicas' spread
    over ``sqrt(2000)``: a two-sided normal tail of ~6e-5 per check). With 3 draws per
    component, dropping the variance's ``sum_s w_s^2 vhat_s / K`` term, or the CRPS's
    within-component ``K / (K - 1)``, would be a bias of several standard errors."""
    loc, var, weights, y = _two_components()
    copies = 2000
    loc, var, y = tiled(loc, var, y, copies)
    weights = weights.repeat(1, copies)
    ref = MixturePredictive(loc[:, :3], var[:, :3], Gaussian(NOISE), weights=weights[:, :3])
    own = MixturePredictive(loc, var, ProtocolGaussian(NOISE), mc_samples=6, weights=weights)
    assert own.draws_per_component == 3
    replica_check(own.crps(y), ref.crps(y[:3]), copies)
    at = y + 0.4
    replica_check(own.cdf(at), ref.cdf(at[:3]), copies)
    bare = MixturePredictive(loc, var, BareGaussian(NOISE), mc_samples=6, weights=weights)
    replica_check(bare.mean, ref.mean, copies)
    replica_check(bare.variance, ref.variance, copies)
    # the weighted quantile is the smallest draw whose cumulative weight reaches q
    q = torch.tensor([0.2, 0.7], dtype=DT)
    Q = own.quantiles(q)
    F = own.cdf(Q)
    assert bool((F >= q.unsqueeze(-1) - 1e-12).all())
    assert bool((own.cdf(Q - 1e-9) < q.unsqueeze(-1)).all())


def test_gaussian_mixture_crps_takes_weights_and_chunks_alike():
    loc, var, weights, y = _two_components()
    whole = gaussian_mixture_crps(y, loc, var, weights=weights)
    torch.testing.assert_close(gaussian_mixture_crps(y, loc, var, chunk=1, weights=weights),
                               whole, rtol=1e-15, atol=0)


@pytest.mark.parametrize(("weights", "message"), [
    (torch.tensor([0.5, 0.5, 0.0]), r"\(S,\), \(S, 1\) or \(S, N\) with S = 2, N = 3"),
    (torch.ones(2, 2) / 2, r"got shape \(2, 2\)"),
    (torch.tensor([1.2, -0.2]), "non-negative"),
    (torch.tensor([float("nan"), 1.0]), "finite"),
    (torch.tensor([0.5, 0.4]), "sum to one .* 0.9"),
])
def test_weights_are_checked_with_a_message_that_names_the_problem(weights, message):
    loc, var, _, _ = _two_components()
    with pytest.raises(ValueError, match=message):
        MixturePredictive(loc, var, Gaussian(NOISE), weights=weights)
