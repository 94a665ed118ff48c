"""Natural gradients for the Gaussian q(u) (Salimbeni, Eleftheriadis and Hensman 2018).

Known answer: one whitened GP layer, Gaussian likelihood, the whole data, gamma = 1: one step
lands on the optimal ``q(v) = N(m*, S*)``, ``S* = (I + A A^T / s2)^-1``, ``m* = S* A y / s2``
with ``A = L^-1 K_ZX`` (Titsias 2009 in whitened coordinates), from any starting ``q``.
"""

import math

import pyro
import pytest
import torch
from known_answers import whitened_optimum

import pyro_dgp as dgp
from pyro_dgp.infer.elbo import AnalyticKL_ELBO
from pyro_dgp.infer.natgrad import (
    NaturalGradient,
    expectation_parameters,
    moment_parameters,
    natural_step,
    warmup_gamma,
)

DT = torch.float64


def _one_layer(n=25, M=6, seed=0):
    torch.manual_seed(seed)
    X = torch.linspace(-1, 1, n, dtype=DT)[:, None]
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(n, dtype=DT)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=M, noise_variance=0.05,
                                  lengthscale=0.5)
    return model, X, y


def _start_far(guide, M):
    """A starting q far from the optimum (mean 1, correlated covariance)."""
    B = torch.randn(M, M, dtype=DT)
    guide.set_q(torch.distributions.MultivariateNormal(
        torch.ones(M, dtype=DT), B @ B.mT / M + 0.5 * torch.eye(M, dtype=DT)), layer="layer1")


@pytest.mark.parametrize("family", ["MeanField", "Coupled"])
def test_one_step_with_gamma_one_lands_on_the_optimal_q(family):
    model, X, y = _one_layer()
    guide = getattr(dgp.guides, family)(model)
    guide(X, y)
    _start_far(guide, 6)
    ngd = NaturalGradient(guide, gamma=1.0)
    elbo = AnalyticKL_ELBO()
    ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
    ngd.step()
    m, S = whitened_optimum(model, X, y)
    q = guide.q("layer1")
    torch.testing.assert_close(q.loc.reshape(-1), m, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(q.covariance_matrix.reshape(6, 6), S, rtol=1e-8, atol=1e-8)
    # the optimum is a fixed point, and the ELBO there is the collapsed bound (Titsias 2009)
    loss = ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
    ngd.step()
    torch.testing.assert_close(guide.q("layer1").loc.reshape(-1), m, rtol=1e-8, atol=1e-8)
    layer = model.layers[0]
    with torch.no_grad():
        L = layer.kzz_cholesky()  # K_ZZ with the layer's jitter, as the model uses it
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, X), upper=False)
        Qxx = A.mT @ A
        s2 = float(model.likelihood.variance)
        cov = Qxx + s2 * torch.eye(len(y), dtype=DT)
        bound = torch.distributions.MultivariateNormal(torch.zeros_like(y), cov).log_prob(y)
        bound -= 0.5 / s2 * (layer.kernel(X, diag=True) - Qxx.diagonal()).sum()
    assert -loss == pytest.approx(float(bound), rel=1e-6)


def test_a_small_step_moves_towards_the_optimum_and_ngd_beats_adam_in_steps():
    """gamma = 0.5 halves the distance in natural parameters each step (exact here): after
    20 steps q is at the optimum to 1e-6, where 20 Adam steps at lr 0.05 are still far."""
    model, X, y = _one_layer()
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    _start_far(guide, 6)
    ngd = NaturalGradient(guide, gamma=0.5)
    elbo = AnalyticKL_ELBO()
    for _ in range(20):
        ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
        ngd.step()
    m, _ = whitened_optimum(model, X, y)
    assert float((guide.q("layer1").loc.reshape(-1) - m).abs().max()) < 1e-5


def test_expectation_and_moment_parameters_round_trip_and_the_step_identity():
    torch.manual_seed(1)
    loc = torch.randn(3, 4, dtype=DT)
    B = torch.randn(3, 4, 4, dtype=DT)
    L = torch.linalg.cholesky(B @ B.mT + 0.1 * torch.eye(4, dtype=DT))
    m2, L2 = moment_parameters(*expectation_parameters(loc, L))
    torch.testing.assert_close(m2, loc)
    torch.testing.assert_close(L2, L)
    zero = torch.zeros_like(L)
    m3, L3 = natural_step(loc, L, torch.zeros_like(loc), zero, 0.7)  # no gradient, no move
    torch.testing.assert_close(m3, loc)
    torch.testing.assert_close(L3, L)


def test_fit_with_natural_gradients_reaches_the_optimal_q():
    """fit(natural_gradient=1.0) with the hyperparameters held by Adam at lr 1e-12 (so they
    stay put): the first step already lands on the optimum."""
    model, X, y = _one_layer()
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=2, lr=1e-12, natural_gradient=1.0, progress=False,
            final_elbo_particles=0)
    m, S = whitened_optimum(model, X, y)
    q = guide.q("layer1")
    torch.testing.assert_close(q.loc.reshape(-1), m, rtol=1e-6, atol=1e-6)


def test_fit_with_natural_gradients_on_a_deep_model_improves_the_elbo():
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, X, y, num_steps=150, lr=0.01,
                     natural_gradient=warmup_gamma(0.1), progress=False)
    first, last = sum(result.losses[:10]) / 10, sum(result.losses[-10:]) / 10
    assert math.isfinite(result.final_elbo) and last < first


def test_refusals_name_the_problem():
    model, X, y = _one_layer()
    with pytest.raises(TypeError, match="Gaussian blocks"):
        NaturalGradient(dgp.guides.Chain(model))
    with pytest.raises(TypeError, match="rank=None"):
        guide = dgp.guides.Coupled(model, rank=2)
        guide(X, y)
        NaturalGradient(guide).loss_and_grads(lambda: torch.zeros((), requires_grad=True))
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        NaturalGradient(dgp.guides.MeanField(model), gamma=1.5)
    with pytest.raises(ValueError, match="start <= gamma"):
        warmup_gamma(0.1, start=0.5)
    schedule = warmup_gamma(0.1, warmup=4, start=1e-4)
    assert schedule(0) == pytest.approx(1e-4) and schedule(4) == schedule(10) == 0.1
    assert schedule(2) == pytest.approx(math.sqrt(1e-4 * 0.1))


def test_stepping_the_inner_layers_too_breaks_positive_definiteness_on_the_step_data():
    """Why ``blocks="last"`` is the default in deep models: with every block stepped at the
    warm-up schedule to 0.1, the inner layer's precision stops being positive definite within
    150 steps, and the error names the block and gamma. Measured from the start of Salimbeni
    and Deisenroth 2017, whose near-deterministic inner ``q(u)`` (``S = 1e-5 I``) is where the
    precision update overshoots."""
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10, noise_variance=0.01,
                                  kernel_variance=2.0, lengthscale=2.0, train_mean=False)
    guide = dgp.guides.MeanField(model, inner_variance=1e-5)
    guide(X, y)
    ngd = NaturalGradient(guide, gamma=warmup_gamma(0.1), blocks="all")
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    elbo = AnalyticKL_ELBO()
    with pytest.raises(ValueError, match=r"step of size 0.1 .*q\(layer1.u\) not positive"):
        for _ in range(150):
            optim.zero_grad()
            ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
            ngd.step()
            optim.step()


def test_a_natural_step_that_fails_in_fit_is_a_divergence(tmp_path):
    """A constant gamma = 0.1 from the start (no warm-up) overshoots full Coupled's precision
    on the step data at step 1: fit stops as at a divergence, naming gamma and the warm-up,
    with the parameters of before that step restored and checkpointed; the warm-up to the
    same gamma trains."""
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    guide = dgp.guides.Coupled(model)
    ckpt = tmp_path / "ckpt.pt"
    with pytest.raises(dgp.TrainingDivergedError,
                       match=r"step of size 0.1 .*not positive definite.*warmup_gamma.*at step 1"):
        dgp.fit(model, guide, X, y, num_steps=20, natural_gradient=0.1, progress=False,
                final_elbo_particles=0, checkpoint=ckpt)
    assert ckpt.exists()
    assert all(torch.isfinite(p).all() for p in guide.parameters())
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    guide = dgp.guides.Coupled(model)
    result = dgp.fit(model, guide, X, y, num_steps=20, natural_gradient=warmup_gamma(0.1),
                     progress=False, final_elbo_particles=0)
    assert all(math.isfinite(loss) for loss in result.losses)
