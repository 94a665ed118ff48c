"""``pyro_dgp.stack``: stacking of independently trained fits into one predictive."""

import math

import pyro
import pytest
import torch

import pyro_dgp as dgp

DT = torch.float64


def _data(N=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(-2, 2, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0]) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    return X, y


def _fit(X, y, num_steps, seed=0):
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=8)
    guide = dgp.guides.MeanField(model)
    if num_steps:
        dgp.fit(model, guide, X, y, num_steps=num_steps, lr=0.05, seed=seed, progress=False,
                final_elbo_particles=0)
    return model, guide


@pytest.fixture(scope="module")
def fits():
    pyro.clear_param_store()
    X, y = _data()
    X_val, y_val = _data(30, seed=1)
    return _fit(X, y, 150), _fit(X, y, 0), (X, y, X_val, y_val)


def test_identical_fits_get_equal_weights(fits):
    (model, guide), _, (X, y, X_val, y_val) = fits
    stacked = dgp.stack([guide, (model, guide)], X_val, y_val, num_samples=10)
    torch.testing.assert_close(stacked.weights, torch.full((2,), 0.5, dtype=DT))
    assert stacked.method == "validation" and stacked.log_densities.shape == (30, 2)


def test_an_untrained_fit_gets_almost_no_weight(fits):
    good, bad, (X, y, X_val, y_val) = fits
    stacked = dgp.stack([bad[1], good[1]], X_val, y_val, num_samples=10)
    assert float(stacked.weights[0]) < 0.02, stacked
    # from PSIS-LOO on the training data instead of held-out points
    stacked = dgp.stack([bad[1], good[1]], X=X, y=y, num_samples=30)
    assert stacked.method == "loo" and float(stacked.weights[0]) < 0.02, stacked


def test_the_stacked_density_is_the_weighted_mixture_of_the_fits_densities(fits):
    good, bad, (X, y, X_val, y_val) = fits
    stacked = dgp.stack([good[1], bad[1]], X_val, y_val, num_samples=10)
    w = torch.tensor([0.7, 0.3], dtype=DT)
    stacked.weights = w  # any weights: the mixture of the fits' predictives
    pred = stacked.predict(X_val, num_samples=10, seed=4)
    parts = [dgp.predict(m, g, X_val, num_samples=10, seed=4) for m, g in (good, bad)]
    expected = torch.logsumexp(torch.stack([p.log_prob(y_val) for p in parts]) + w.log()[:, None],
                               0)
    torch.testing.assert_close(pred.log_prob(y_val), expected)
    torch.testing.assert_close(pred.mean, w[0] * parts[0].mean + w[1] * parts[1].mean)
    # each fit keeps its own noise variance, in the units asked for
    scaled = stacked.predict(X_val, num_samples=10, seed=4, y_mean=1.0, y_std=2.0)
    torch.testing.assert_close(scaled.log_prob(1.0 + 2.0 * y_val),
                               expected - math.log(2.0))


def test_bad_inputs_are_refused_by_name(fits):
    good, bad, (X, y, X_val, y_val) = fits
    with pytest.raises(ValueError, match="fits is empty"):
        dgp.stack([], X_val, y_val)
    with pytest.raises(TypeError, match="fits must be a list"):
        dgp.stack(good[1], X_val, y_val)
    X2 = torch.cat([X, X], -1)
    other = dgp.DeepGP.regression(X2, y, num_layers=1, num_inducing=4)
    with pytest.raises(ValueError, match="different dimensions"):
        dgp.stack([good[1], dgp.guides.MeanField(other)], X_val, y_val)
    with pytest.raises(ValueError, match="y_val"):
        dgp.stack([good[1]], X_val, y_val[:-1])
    with pytest.raises(ValueError, match="X_val"):
        dgp.stack([good[1]], torch.cat([X_val, X_val], -1), y_val)
    with pytest.raises(ValueError, match="both X_val and y_val"):
        dgp.stack([good[1]], X_val)
    with pytest.raises(ValueError, match="held-out points"):
        dgp.stack([good[1]])
    with pytest.raises(ValueError, match="trained on 40 points"):
        dgp.stack([good[1]], X=X_val, y=y_val)
