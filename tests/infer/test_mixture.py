"""``guides.Mixture`` and its stratified objectives (``infer/mixture.py``): known answers."""

import math

import pyro
import pytest
import torch
from known_answers import dense_svgp_elbo, single_layer, split_layers
from torch.distributions import Categorical, MixtureSameFamily, MultivariateNormal

import pyro_dgp as dgp
from pyro_dgp.diagnostics.psis import guide_log_density
from pyro_dgp.guides import Mixture
from pyro_dgp.guides.draws import trace_draws
from pyro_dgp.infer.mixture import SIWAE, StratifiedELBO, component_log_weights
from pyro_dgp.rng import seeded

DT = torch.float64


def _two_layer(N=20):
    X = torch.linspace(-1, 1, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    return dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5), X, y


@pytest.mark.parametrize("family", ["meanfield", "coupled", "chain"])
def test_a_one_component_mixture_is_its_component(family):
    model, X, y = _two_layer()
    mixture = Mixture(model, family=family, num_components=1)
    component = mixture.components[0]
    # log q
    q = component.q()
    v = q.sample((6,))
    torch.testing.assert_close(mixture.log_q(split_layers(mixture, v)).detach(), q.log_prob(v),
                               rtol=1e-9, atol=1e-9)
    # the ELBO from a fixed seed: the same draws, scored by the same density (MeanField's
    # trace scores log q(u) at its draw; Coupled's and Chain's the closed-form KL instead)
    if family == "meanfield":
        ours = dgp.evaluate_elbo(model, mixture, X, y, num_particles=3, objective="stratified",
                                 seed=1)
        theirs = dgp.evaluate_elbo(model, component, X, y, num_particles=3, objective="elbo",
                                   seed=1)
        assert ours.value == pytest.approx(theirs.value, rel=1e-9)
    # predictions
    ours = dgp.predict(model, mixture, X, num_samples=7, seed=2)
    theirs = dgp.predict(model, component, X, num_samples=7, seed=2)
    torch.testing.assert_close(ours.mean, theirs.mean)
    torch.testing.assert_close(ours.variance, theirs.variance)
    torch.testing.assert_close(ours.log_prob(y), theirs.log_prob(y))


def test_log_q_is_the_density_of_the_gaussian_mixture():
    """On one layer the mixture's log q, and the log-density a trace of its draws carries (as
    PSIS reads it), equal torch's ``MixtureSameFamily`` of the components' Gaussians."""
    model, X, y = single_layer(M=6)
    mixture = Mixture(model, num_components=3)
    mixture.set_weights(torch.tensor([0.2, 0.3, 0.5], dtype=DT))
    parts = [c.q("layer1") for c in mixture.components]
    assert not torch.allclose(parts[0].loc, parts[1].loc)  # the components start apart
    exact = MixtureSameFamily(Categorical(probs=mixture.weights()), MultivariateNormal(
        torch.stack([p.loc for p in parts]), scale_tril=torch.stack([p.scale_tril for p in parts])))
    v = exact.sample((50,))
    torch.testing.assert_close(mixture.log_q(split_layers(mixture, v)).detach(), exact.log_prob(v))
    with torch.no_grad(), seeded(0, X.device):
        trace = trace_draws(mixture, (X,), 40)
        log_q = guide_log_density(mixture, trace, 40)
    u = trace.nodes["layer1.u"]["value"].reshape(40, -1)
    torch.testing.assert_close(log_q, exact.log_prob(u))
    # the draws are the mixture's: each component's share near its weight
    first = torch.stack([p.log_prob(u) for p in parts]).argmax(0)
    assert first.unique().numel() == 3


def test_the_stratified_elbo_of_identical_components_is_the_component_elbo():
    """K identical components: q(U) = q_k(U), so the stratified ELBO is the component's,
    here the closed-form SVGP ELBO of a chosen Gaussian (within 3 standard errors)."""
    model, X, y = single_layer(M=8)
    mixture = Mixture(model, num_components=3, spread=0)
    g = torch.Generator().manual_seed(3)
    loc = 0.5 * torch.randn(8, generator=g, dtype=DT)
    A = torch.randn(8, 8, generator=g, dtype=DT)
    cov = 0.05 * A @ A.mT / 8 + 0.02 * torch.eye(8, dtype=DT)
    q = MultivariateNormal(loc, covariance_matrix=cov)
    for component in mixture.components:
        component.set_q(q, "layer1")
    mixture.set_weights(torch.tensor([0.6, 0.3, 0.1], dtype=DT))
    exact = dense_svgp_elbo(model, X, y, q.loc.unsqueeze(0),
                             torch.linalg.cholesky(q.covariance_matrix).unsqueeze(0))
    S = 400
    with torch.no_grad(), seeded(0, X.device):
        log_w = torch.stack([component_log_weights(model, mixture, k, S, (X, y), {})
                             for k in range(3)])  # (K, S)
    with torch.no_grad(), seeded(0, X.device):  # fit's default objective, on the same draws
        loss = float(dgp.infer.make_objective("auto", mixture, S).differentiable_loss(
            model, mixture, X, y))
    pi = mixture.weights()
    value = float((pi * log_w.mean(-1)).sum())
    assert -loss == pytest.approx(value, rel=1e-12)
    stderr = math.sqrt(float((pi.square() * log_w.var(-1)).sum()) / S)
    assert abs(value - exact) < 3 * stderr, (value, stderr, exact)
    assert stderr < 0.1


def test_the_layer_kl_of_identical_components_is_the_components_closed_form():
    model, X, y = _two_layer()
    mixture = Mixture(model, num_components=2, spread=0)
    for component in mixture.components:
        component.set_q(MultivariateNormal(0.3 * torch.ones(5, dtype=DT),
                                           scale_tril=0.5 * torch.eye(5, dtype=DT)), "layer1")
    exact = float(mixture.components[0].layer_kl("layer1"))
    got = float(mixture.layer_kl("layer1", num_draws=4000))
    assert got == pytest.approx(exact, abs=0.05), (got, exact)
    assert float(mixture.layer_kl("layer1")) == float(mixture.layer_kl("layer1"))  # seeded
    kls = dgp.diagnostics.layer_kl(model, mixture, X)
    assert set(kls) == {"layer1", "layer2"} and all(v > 0 for v in kls.values())


def test_siwae_is_at_least_the_stratified_elbo():
    model, X, y = single_layer(M=6)
    mixture = Mixture(model, num_components=2, spread=1.0)
    mixture(X, y)
    S = 4
    # the same draws: log-mean-exp over them >= the pi-weighted mean of the log-weights
    with torch.no_grad(), seeded(5, X.device):
        siwae = -float(SIWAE(num_particles=S).differentiable_loss(model, mixture, X, y))
    with torch.no_grad(), seeded(5, X.device):
        log_w = torch.stack([component_log_weights(model, mixture, k, S, (X, y), {},
                                                   weights=True) for k in range(2)])
    pi = mixture.weights()
    assert siwae == pytest.approx(float(torch.logsumexp(pi.log()[:, None] + log_w, (0, 1))
                                        - math.log(S)), rel=1e-12)
    assert siwae >= float((pi * log_w.mean(-1)).sum())
    # in expectation against the stratified ELBO of the guide's own estimator
    siwaes, elbos = [], []
    with torch.no_grad():
        for seed in range(30):
            with seeded(seed, X.device):
                siwaes.append(-float(SIWAE(S).differentiable_loss(model, mixture, X, y)))
                elbos.append(-float(StratifiedELBO(S).differentiable_loss(model, mixture, X, y)))
    a, b = torch.tensor(siwaes), torch.tensor(elbos)
    se = math.sqrt(float(a.var() + b.var()) / 30)
    assert float(a.mean() - b.mean()) > -2 * se, (a.mean(), b.mean(), se)


@pytest.mark.filterwarnings("ignore::pyro_dgp.GuideComparisonWarning")  # 30 draws: k-hat
def test_fit_trains_a_mixture_with_no_extra_arguments_and_the_diagnostics_take_it():
    model, X, y = _two_layer()
    pyro.clear_param_store()
    mixture = Mixture(model, num_components=2)
    result = dgp.fit(model, mixture, X, y, num_steps=15, progress=False, seed=0)
    assert math.isfinite(result.final_elbo)
    assert not torch.allclose(mixture.weights(), torch.full((2,), 0.5, dtype=DT))  # learned
    pred = dgp.predict(model, mixture, X, num_samples=20, seed=0)
    assert torch.isfinite(pred.log_prob(y)).all()
    psis = dgp.variational_pareto_k(model, mixture, X, y, num_samples=30, seed=0)
    assert math.isfinite(psis.elbo)
    dt = dgp.to_datatree(model, mixture, X, y, num_samples=30, seed=0)
    assert "posterior" in dt.children
    dgp.layer_summary(dt)
    other = dgp.guides.MeanField(model)
    dt_other = dgp.to_datatree(model, other, X, y, num_samples=30, seed=0)
    table = dgp.compare_guides({"mixture": dt, "meanfield": dt_other})
    assert set(table.index) == {"mixture", "meanfield"}


def test_fixed_uniform_weights_stay_uniform():
    model, X, y = _two_layer()
    mixture = Mixture(model, num_components=3, learn_weights=False)
    dgp.fit(model, mixture, X, y, num_steps=5, progress=False, seed=0, final_elbo_particles=0)
    torch.testing.assert_close(mixture.weights(), torch.full((3,), 1 / 3, dtype=DT))


def test_bad_arguments_are_refused_by_name():
    model, X, y = _two_layer()
    with pytest.raises(ValueError, match="num_components"):
        Mixture(model, num_components=0)
    with pytest.raises(ValueError, match="family must be one of"):
        Mixture(model, family="ssivi")
    with pytest.raises(ValueError, match="family must be one of"):
        Mixture(model, family="no-such-family")
    with pytest.raises(ValueError, match="not a Gaussian with a tractable density"):
        Mixture(model, family=lambda m: dgp.guides.SemiImplicit(m))
    with pytest.raises(TypeError, match="family must be"):
        Mixture(model, family=3)
    with pytest.raises(ValueError, match="inner_variance"):
        Mixture(model, inner_variance=-1.0)
    with pytest.raises(TypeError, match="StratifiedELBO trains a mixture guide"):
        StratifiedELBO().loss(model, dgp.guides.MeanField(model), X, y)
    with pytest.warns(UserWarning, match="use objective='stratified'"):
        dgp.infer.make_objective("elbo", Mixture(model))
    with pytest.raises(ValueError, match="set_weights"):
        Mixture(model, num_components=2).set_weights([0.5, 0.6])


@pytest.mark.slow
def test_a_mixture_of_narrow_starts_keeps_draws_in_both_modes_of_the_two_mode_toy():
    """Four MeanField components started apart and narrow, uniform weights, 300 steps: one
    component settles in each mode's basin (measured: 27% of the draws in mode A, seed 0; the
    infer/mixture.py docstring)."""
    from pyro_dgp import gold

    pyro.clear_param_store()
    model, X, y = gold.two_mode_model()
    mixture = Mixture(model, num_components=4, learn_weights=False, seed=0)
    with gold.fixed_hyperparameters(model):
        dgp.fit(model, mixture, X, y, num_steps=300, lr=5e-3, seed=0, progress=False,
                final_elbo_particles=0, lr_schedule="constant")
    x_star = torch.tensor([[gold.TWO_MODE_INPUT]], dtype=DT)
    values = gold.guide_layer_values(model, mixture, x_star, "layer1", num_samples=2000)
    assert min(gold.mode_masses(values)) >= 0.1
