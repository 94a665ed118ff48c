"""Known answers of ``metrics.classification_report`` (accuracy, NLL, Brier, ECE) and
``metrics.count_report`` (NLL, RMSE, coverage), and of the draw mixture's closed forms against
the analytic mixture's."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from scipy import stats
from torch.special import ndtri

from pyro_dgp import metrics
from pyro_dgp.likelihoods import BernoulliProbit, Gaussian
from pyro_dgp.prediction import DrawMixturePredictive, MixturePredictive

DT = torch.float64


@pytest.fixture(autouse=True)
def _local_params():
    with pyro.settings.context(module_local_params=True):
        yield


def _probit(p, S=3):
    """A binary predictive with ``p(y = 1) = p`` (``(N,)``, float64) at every point: the probit of a
    point mass at ``Phi^-1(p)``."""
    loc = ndtri(p).expand(S, -1)
    return MixturePredictive(loc, torch.zeros_like(loc), BernoulliProbit())


def _categorical(probs, S=2):
    """A categorical predictive with class probabilities ``probs (N, C)``."""
    return DrawMixturePredictive(dist.Categorical(probs=probs.expand(S, -1, -1)))


def test_a_calibrated_binary_predictive_has_zero_ece_and_the_hand_brier():
    """p(y = 1) = 0.8 everywhere and 8 of 10 labels 1: confidence 0.8, accuracy 0.8, so
    ECE 0; Brier (8 * 0.2^2 + 2 * 0.8^2) / 10 = 0.16; NLL -(8 log 0.8 + 2 log 0.2) / 10."""
    pred = _probit(torch.full((10,), 0.8, dtype=DT))
    y = torch.tensor([1.0] * 8 + [0.0] * 2, dtype=DT)
    report = metrics.classification_report(pred, y)
    assert report["ece"] == pytest.approx(0.0, abs=1e-12)
    assert report["brier"] == pytest.approx(0.16, rel=1e-12)
    assert report["brier"] == pytest.approx(metrics.crps(pred, y), rel=1e-12)
    assert report["accuracy"] == pytest.approx(0.8)
    assert report["nll"] == pytest.approx(-(8 * math.log(0.8) + 2 * math.log(0.2)) / 10)
    # -1/1 labels read as 0/1
    assert metrics.classification_report(pred, 2 * y - 1) == report


def test_ece_by_hand_over_two_confidence_groups():
    """Five points at p = 0.9 with 4 labels 1 (gap 0.1), five at p = 0.35 (class 0 with
    confidence 0.65) all labelled 0 (gap 0.35): ECE (5 * 0.1 + 5 * 0.35) / 10 = 0.225; with one
    bin the gaps pool: |(4 + 5) / 10 - (0.9 + 0.65) / 2| = 0.125."""
    pred = _probit(torch.tensor([0.9] * 5 + [0.35] * 5, dtype=DT))
    y = torch.tensor([1.0, 1, 1, 1, 0] + [0.0] * 5, dtype=DT)
    assert metrics.expected_calibration_error(pred, y) == pytest.approx(0.225, rel=1e-10)
    assert metrics.expected_calibration_error(pred, y, bins=1) == pytest.approx(0.125,
                                                                              rel=1e-10)
    with pytest.raises(ValueError, match="bins"):
        metrics.expected_calibration_error(pred, y, bins=0)


def test_multiclass_report_by_hand():
    """Probabilities (0.5, 0.3, 0.2) everywhere, labels 0 five times, 1 three times, 2 twice:
    calibrated (accuracy of class 0 = confidence = 0.5), Brier per label (0.38, 0.78, 0.98)."""
    pred = _categorical(torch.tensor([0.5, 0.3, 0.2], dtype=DT).expand(10, 3))
    y = torch.tensor([0] * 5 + [1] * 3 + [2] * 2, dtype=DT)
    report = metrics.classification_report(pred, y)
    assert report["accuracy"] == pytest.approx(0.5)
    assert report["ece"] == pytest.approx(0.0, abs=1e-12)
    assert report["brier"] == pytest.approx((5 * 0.38 + 3 * 0.78 + 2 * 0.98) / 10, rel=1e-12)
    nll = -(5 * math.log(0.5) + 3 * math.log(0.3) + 2 * math.log(0.2)) / 10
    assert report["nll"] == pytest.approx(nll, rel=1e-12)


def test_classification_report_refuses_a_regression_predictive():
    loc = torch.zeros(2, 4, dtype=DT)
    pred = MixturePredictive(loc, torch.ones_like(loc), Gaussian(torch.tensor(0.1, dtype=DT)))
    with pytest.raises(ValueError, match="classification_report scores class labels.*"
                                         "regression_report or metrics.count_report"):
        metrics.classification_report(pred, torch.zeros(4, dtype=DT))


def _poisson(rate=3.0, S=4, N=4):
    return DrawMixturePredictive(dist.Poisson(torch.full((S, N), rate, dtype=DT)))


def test_count_report_by_hand():
    """Poisson(3) at every point: NLL the mean -log pmf, RMSE against the mean 3, and the
    central 95% interval [0, 7] (P(Y <= 6) = 0.966 < 0.975 <= P(Y <= 7) = 0.988; the 2.5%
    quantile is 0 as P(Y = 0) = 0.05) holds 0, 3 and 5, not 12."""
    pred = _poisson()
    y = torch.tensor([0.0, 3, 5, 12], dtype=DT)
    report = metrics.count_report(pred, y)
    assert report["nll"] == pytest.approx(-stats.poisson.logpmf([0, 3, 5, 12], 3).mean(),
                                          rel=1e-10)
    assert report["rmse"] == pytest.approx(math.sqrt((9 + 0 + 4 + 81) / 4), rel=1e-12)
    assert report["coverage95"] == 0.75
    with pytest.raises(ValueError, match="y must hold counts.*\\[1.5, -1.0\\]"):
        metrics.count_report(pred, torch.tensor([1.5, 0, -1, 2], dtype=DT))
    with pytest.raises(ValueError, match="count_report scores counts, but this predictive is "
                                         "binary \\(BernoulliProbit\\)"):
        metrics.count_report(_probit(torch.full((4,), 0.5, dtype=DT)), torch.zeros(4, dtype=DT))


def test_normal_draws_give_the_gaussian_mixtures_closed_forms():
    """Normal(f_s, s) components are the Gaussian likelihood's mixture at var = 0: the same
    log-density, moments, CRPS and quantiles to rounding."""
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(5, 6, generator=g, dtype=DT)
    noise = torch.tensor(0.3, dtype=DT)
    exact = MixturePredictive(loc, torch.zeros_like(loc), Gaussian(noise), y_mean=1.0,
                              y_std=2.0)
    drawn = DrawMixturePredictive(dist.Normal(loc, noise.sqrt()), y_mean=1.0, y_std=2.0)
    y = torch.randn(6, generator=g, dtype=DT)
    for ours, theirs in [(drawn.log_prob(y), exact.log_prob(y)), (drawn.mean, exact.mean),
                         (drawn.variance, exact.variance), (drawn.crps(y), exact.crps(y)),
                         (drawn.quantiles([0.1, 0.9]), exact.quantiles([0.1, 0.9]))]:
        assert torch.allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    assert metrics.regression_report(drawn, y) == pytest.approx(
        metrics.regression_report(exact, y), rel=1e-10)


def test_bernoulli_draws_give_the_binary_closed_forms():
    p = torch.tensor([[0.2, 0.9, 0.5], [0.4, 0.7, 0.5]], dtype=DT)
    drawn = DrawMixturePredictive(dist.Bernoulli(probs=p))
    y = torch.tensor([0.0, 1, 1], dtype=DT)
    mixture_p = p.mean(0)
    assert torch.allclose(drawn.mean, mixture_p)
    assert torch.allclose(drawn.log_prob(y), torch.log(torch.where(y > 0, mixture_p,
                                                                   1 - mixture_p)))
    assert torch.allclose(drawn.crps(y), (mixture_p - y).square())
    report = metrics.classification_report(drawn, y)
    assert report["brier"] == pytest.approx(float((mixture_p - y).square().mean()))


def test_the_draw_mixture_refuses_what_is_not_one_y_per_draw_and_point():
    with pytest.raises(ValueError, match="batch shape \\(S, n\\) and event shape \\(\\)"):
        DrawMixturePredictive(dist.Normal(torch.zeros(3, dtype=DT), 1.0))
    with pytest.raises(ValueError, match="batch shape \\(S, n\\) and event shape \\(\\)"):
        DrawMixturePredictive(dist.Normal(torch.zeros(2, 3, dtype=DT), 1.0).to_event(1))
