"""Natural gradients for the Gaussian q(u) (Salimbeni, Eleftheriadis and Hensman 2018).

Known answer: one whitened GP layer, Gaussian likelihood, the whole data, gamma = 1: one step
lands on the optimal ``q(v) = N(m*, S*)``, ``S* = (I + A A^T / s2)^-1``, ``m* = S* A y / s2``
with ``A = L^-1 K_ZX`` (Titsias 2009 in whitened coordinates), from any starting ``q``.
"""

import functools
import math

import pyro
import pytest
import torch
from known_answers import whitened_optimum

import pyro_dgp as dgp
from pyro_dgp.infer.elbo import AnalyticKL_ELBO
from pyro_dgp.infer.natgrad import (
    NaturalGradient,
    NaturalStepError,
    covariance_tril,
    expectation_parameters,
    moment_parameters,
    natural_step,
    warmup_gamma,
)
from pyro_dgp.train import training

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


def test_stepping_the_inner_layers_too_is_backtracked_where_the_plain_step_breaks():
    """With every block stepped at the warm-up schedule to 0.1, the plain step (no
    backtracking, only positive definiteness asked) leaves the inner layer's precision
    indefinite within 150 steps, and the error names the block and gamma. Measured from the
    start of Salimbeni and Deisenroth 2017, whose near-deterministic inner ``q(u)``
    (``S = 1e-5 I``) is where the sampled precision update overshoots. The damped step
    backtracks there and trains the 150 steps."""
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train

    def train(**damping):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10,
                                      noise_variance=0.01, kernel_variance=2.0,
                                      lengthscale=2.0, train_mean=False)
        guide = dgp.guides.MeanField(model, inner_variance=1e-5)
        guide(X, y)
        ngd = NaturalGradient(guide, gamma=warmup_gamma(0.1), blocks="all", **damping)
        optim = torch.optim.Adam(model.parameters(), lr=0.01)
        elbo = AnalyticKL_ELBO()
        losses = []
        for _ in range(150):
            optim.zero_grad()
            losses.append(ngd.loss_and_grads(
                lambda: elbo.differentiable_loss(model, guide, X, y)))
            ngd.step()
            optim.step()
        return ngd, losses

    with pytest.raises(NaturalStepError, match=r"step of size 0.1 .*q\(layer1.u\) not positive"):
        train(max_backtracks=0, keep=0.0)
    ngd, losses = train()
    assert ngd.backtracks > 0 and all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-10:]) < sum(losses[:10])


def _variance_loss(guide, name, c):
    """``-c tr S`` of the block ``name`` as substituted: ``dloss/deta2 = -c I``, a gradient
    that lowers the precision by ``2 gamma c`` per step."""
    def loss():
        _, L = guide.substituted_block(name)
        return -c * (L * L).sum()
    return loss


def test_a_step_whose_gamma_makes_the_precision_indefinite_is_backtracked():
    """q = N(0, I) and dloss/deta2 = -5 I: at gamma = 0.5 the new precision 1 - 5 gamma is
    negative; gamma is halved until 1 - 10 gamma keeps half of (1 - gamma), at 1/32 (4
    halvings): the step lands on variance 1 / (1 - 10/32), the halvings are counted, and the
    block's gamma regrows by 1.1 per step taken."""
    model, X, y = _one_layer()
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    name = guide.last_block()
    ngd = NaturalGradient(guide, gamma=0.5)
    ngd.loss_and_grads(_variance_loss(guide, name, 5.0))
    ngd.step()
    assert ngd.backtracks == 4
    assert ngd.gamma_scale == {name: pytest.approx(1.1 / 16)}
    _, L = guide.gaussian_blocks()[name]
    S = L @ L.mT
    torch.testing.assert_close(S, torch.eye(6, dtype=DT).expand_as(S) / (1 - 10 / 32))
    ngd.loss_and_grads(_variance_loss(guide, name, 0.0))  # no gradient: no halving, regrowth
    ngd.step()
    assert ngd.backtracks == 4 and ngd.gamma_scale == {name: pytest.approx(1.21 / 16)}


def test_a_step_that_still_fails_after_the_backtracks_raises_and_moves_nothing():
    model, X, y = _one_layer()
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    name = guide.last_block()
    before = guide.gaussian_blocks()[name]
    ngd = NaturalGradient(guide, gamma=0.5, max_backtracks=2)
    ngd.loss_and_grads(_variance_loss(guide, name, 5.0))
    with pytest.raises(NaturalStepError, match=r"after 2 halvings of gamma \(down to 0.125\)"):
        ngd.step()
    after = guide.gaussian_blocks()[name]
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=0)
    assert ngd.num_steps == 0


def test_the_step_keeps_half_the_precision_that_the_prior_pull_leaves():
    """S = I, dloss/deta2 = -4 I, gamma = 0.1: the new precision 0.2 is positive definite
    but below keep (1 - gamma) = 0.45 (a variance grown 5-fold in one step), refused by the
    default keep = 1/2 and taken with keep = 0."""
    loc, L = torch.zeros(3, dtype=DT), torch.eye(3, dtype=DT)
    g1, g2 = torch.zeros(3, dtype=DT), -4 * torch.eye(3, dtype=DT)
    with pytest.raises(NaturalStepError, match="shrinks the precision"):
        natural_step(loc, L, g1, g2, 0.1)
    _, L2 = natural_step(loc, L, g1, g2, 0.1, keep=0.0)
    torch.testing.assert_close(L2 @ L2.mT, torch.eye(3, dtype=DT) / 0.2)
    with pytest.raises(NaturalStepError, match="not finite"):
        natural_step(loc, L, g1, torch.full_like(g2, math.nan), 0.1)


def test_covariance_tril_is_the_cholesky_factor_of_the_inverse():
    torch.manual_seed(2)
    B = torch.randn(2, 5, 5, dtype=DT)
    P = B @ B.mT + 0.1 * torch.eye(5, dtype=DT)
    L = covariance_tril(P)
    torch.testing.assert_close(L, torch.linalg.cholesky(torch.linalg.inv(P)))
    assert covariance_tril(-P) is None


def _smooth_2d(n=250, seed=0):
    """A smooth function of two inputs on ``[-1, 1]^2``, noise sd 0.1: ``(X (n, 2), y (n,))``."""
    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(n, 2, generator=g, dtype=DT) - 1
    f = torch.sin(3 * X[:, 0]) * torch.cos(2 * X[:, 1]) + 0.5 * X[:, 1]
    return X, f + 0.1 * torch.randn(n, generator=g, dtype=DT)


def _data(name):
    if name == "step":
        split = dgp.datasets.step(n_train=100, seed=0)
        return split.X_train, split.y_train
    return _smooth_2d()


def _fit_deep(name, family, num_steps, natural_gradient, **kwargs):
    X, y = _data(name)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=20)
    guide = getattr(dgp.guides, family)(model)
    return dgp.fit(model, guide, X, y, num_steps=num_steps, natural_gradient=natural_gradient,
                   progress=False, **kwargs)


@pytest.mark.parametrize("gamma", [0.02, 0.1])
@pytest.mark.parametrize("family", ["MeanField", "Coupled"])
@pytest.mark.parametrize("data", ["step", "2d"])
def test_the_readme_recipe_trains_every_guide_it_names(data, family, gamma):
    """The README's ``warmup_gamma(0.02)``, and ``0.1`` (Salimbeni, Eleftheriadis and Hensman
    2018's step), with DeepGP.regression's defaults: at 0.1 full Coupled's one block (both
    layers) left a precision that was not positive definite at step 5 on both sets, where
    gamma first reaches 0.1; the damped step trains on."""
    result = _fit_deep(data, family, 40, warmup_gamma(gamma), final_elbo_particles=0)
    assert len(result.losses) == 40 and all(math.isfinite(loss) for loss in result.losses)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["MeanField", "Coupled"])
@pytest.mark.parametrize("data", ["step", "2d"])
def test_the_readme_recipe_reaches_the_elbo_of_adam(data, family):
    """1,500 steps from each family's default start: the README's recipe,
    ``warmup_gamma(0.02)``, ends level with Adam alone or above it (measured: MeanField at
    fit seeds 0-3 on the 2-D set and 0-2 on the step data, within 2 nats of Adam's 131-134
    and 104-105; Coupled at seeds 0-1, 8-9 above Adam's 138-139 on the 2-D set and within 1
    on the step data).
    The tolerance is about five times the spread between seeds. At ``gamma = 0.1`` MeanField
    ended 11 to 16 nats below Adam on the 2-D set (``benchmarks/results/history.md``, "The
    natural-gradient recipe's step size")."""
    adam = _fit_deep(data, family, 1500, None).final_elbo
    recipe = _fit_deep(data, family, 1500, warmup_gamma(0.02)).final_elbo
    assert math.isfinite(recipe) and recipe > adam - 5.0


def test_a_natural_step_that_fails_in_fit_is_a_divergence(tmp_path, monkeypatch):
    """A constant gamma = 0.1 from the start (no warm-up) overshoots full Coupled's precision
    on the step data at step 1. Without backtracking, fit stops as at a divergence, naming
    gamma and the warm-up, with the parameters of before that step restored and
    checkpointed; with it (the default) the same run trains."""
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    guide = dgp.guides.Coupled(model, inner_variance=1e-5)  # DSVI's near-deterministic start
    ckpt = tmp_path / "ckpt.pt"
    undamped = functools.partial(NaturalGradient, max_backtracks=0, keep=0.0)
    with monkeypatch.context() as patch:
        patch.setattr(training, "NaturalGradient", undamped)
        with pytest.raises(dgp.TrainingDivergedError, match=r"step of size 0.1 .*not positive "
                           r"definite.*warmup_gamma.*after 0 halvings.*at step 1"):
            # one draw per step: the noisier gradient that overshoots at step 1
            dgp.fit(model, guide, X, y, num_steps=20, natural_gradient=0.1, progress=False,
                    final_elbo_particles=0, checkpoint=ckpt, num_particles=1)
    assert ckpt.exists()
    assert all(torch.isfinite(p).all() for p in guide.parameters())
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    guide = dgp.guides.Coupled(model, inner_variance=1e-5)
    result = dgp.fit(model, guide, X, y, num_steps=20, natural_gradient=0.1,
                     progress=False, final_elbo_particles=0, num_particles=1)
    assert all(math.isfinite(loss) for loss in result.losses)


def test_a_resumed_run_continues_the_backtracked_gamma(tmp_path):
    """Constant gamma = 0.1 on full Coupled backtracks at step 1 and regrows over the next
    steps: 4 steps, then 4 more resumed from the checkpoint, equal 8 steps at once (the
    checkpoint holds each block's backtracked gamma)."""
    split = dgp.datasets.step(n_train=60, seed=0)
    X, y = split.X_train, split.y_train

    def run(num_steps, **kwargs):
        pyro.clear_param_store()
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
        guide = dgp.guides.Coupled(model)
        dgp.fit(model, guide, X, y, num_steps=num_steps, natural_gradient=0.1, progress=False,
                final_elbo_particles=0, lr_schedule="constant", **kwargs)  # as 8 steps at once
        return guide.gaussian_blocks()["joint"]

    ckpt = tmp_path / "ckpt.pt"
    whole = run(8)
    run(4, checkpoint=ckpt)
    resumed = run(8, checkpoint=ckpt, resume=True)
    torch.testing.assert_close(resumed[0], whole[0], rtol=0, atol=0)
    torch.testing.assert_close(resumed[1], whole[1], rtol=0, atol=0)
