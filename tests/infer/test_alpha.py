"""The local alpha-divergence objective (``pyro_dgp.infer.alpha``): known answers and limits."""

import math
import statistics

import pyro
import pytest
import torch
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal

import pyro_dgp as dgp
from pyro_dgp.infer.alpha import LocalAlpha
from pyro_dgp.likelihoods import BernoulliProbit, Gaussian, StudentT

DT = torch.float64


def _data(n=30, dtype=DT):
    X = torch.linspace(-1, 1, n, dtype=dtype)[:, None]
    return X, torch.sin(3 * X[:, 0])


def _guide(name, model):
    if name == "autonormal":
        return dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    if name == "sampled":
        return dgp.guides.MeanField(model, collapsed=False)
    if name in ("ssivi", "ssivi-tril", "sivi"):  # the surrogate bound: log q_K for log q
        # (sivi: one logsumexp over the draws of every layer's noise, at the last layer)
        return dgp.guides.SemiImplicit(model, structured=name != "sivi", num_mixing=10,
                                       noise_dim=8, hidden=(32, 32),
                                       component_scale="tril" if name == "ssivi-tril"
                                       else "diagonal")
    return getattr(dgp.guides, name)(model)


@pytest.mark.parametrize("name", ["MeanField", "sampled", "Coupled", "autonormal",
                                  pytest.param("Chain", marks=pytest.mark.slow),
                                  pytest.param("ssivi", marks=pytest.mark.slow),
                                  pytest.param("ssivi-tril", marks=pytest.mark.slow),
                                  pytest.param("sivi", marks=pytest.mark.slow)])
def test_alpha_to_zero_is_the_elbo_of_the_same_guide(name):
    """alpha = 1e-6: the objective's mean over draws equals the guide's ELBO within 4
    combined Monte Carlo standard errors (both estimated from independent draws)."""
    X, y = _data()
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = _guide(name, model)
    dgp.fit(model, guide, X, y, num_steps=40, progress=False, final_elbo_particles=0)
    objective = LocalAlpha(alpha=1e-6, num_particles=50)
    with torch.no_grad():
        values = [-float(objective.differentiable_loss(model, guide, X, y)) for _ in range(20)]
    estimate = dgp.evaluate_elbo(model, guide, X, y, num_particles=400, seed=1)
    se = math.hypot(statistics.stdev(values) / math.sqrt(len(values)), estimate.stderr)
    assert abs(statistics.mean(values) - estimate.value) < 4 * se + 1e-6 * abs(estimate.value)


def test_alpha_one_one_layer_gaussian_is_the_predictive_log_density_minus_kl():
    """One whitened layer, q(v) = N(m, S) set, alpha = 1: the objective is
    sum_i log N(y_i | mu_i, v_i + s2) - KL(q || N(0, I)) exactly (every draw attaches the same
    marginal), computed here from the closed forms."""
    X, y = _data(20)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5, noise_variance=0.1)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    torch.manual_seed(3)
    m = torch.randn(5, dtype=DT)
    B = torch.randn(5, 5, dtype=DT)
    S = B @ B.mT / 5 + 0.2 * torch.eye(5, dtype=DT)
    guide.set_q(torch.distributions.MultivariateNormal(m, S), layer="layer1")
    layer = model.layers[0]
    with torch.no_grad():
        L = layer.kzz_cholesky()
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, X), upper=False)
        mu = A.mT @ m
        v = layer.kernel(X, diag=True) - (A * A).sum(0) + ((A.mT @ S) * A.mT).sum(-1)
        s2 = model.likelihood.variance
        data = torch.distributions.Normal(mu, (v + s2).sqrt()).log_prob(y).sum()
        kl = torch.distributions.kl_divergence(
            torch.distributions.MultivariateNormal(m, S),
            torch.distributions.MultivariateNormal(torch.zeros(5, dtype=DT),
                                                   torch.eye(5, dtype=DT)))
        value = -LocalAlpha(alpha=1.0, num_particles=7).differentiable_loss(model, guide, X, y)
    assert float(value) == pytest.approx(float(data - kl), rel=1e-10)


@pytest.mark.parametrize("alpha", [1e-3, 0.3, 1.0])
def test_gaussian_closed_form_matches_a_million_draws(alpha):
    """log E_{N(f; m, v)}[N(y | f, s2)^alpha]: closed form against 10^6 draws of f, within 5
    standard errors of the Monte Carlo mean (delta method on the log)."""
    lik = Gaussian(variance=0.3).to(DT)
    y = torch.tensor([0.4, -1.2, 2.0], dtype=DT)
    loc = torch.tensor([0.1, -0.5, 0.7], dtype=DT)
    var = torch.tensor([0.2, 1.5, 0.05], dtype=DT)
    with torch.no_grad():
        closed = lik.alpha_log_expectation(y, loc, var, alpha)
        g = torch.Generator().manual_seed(0)
        f = loc + var.sqrt() * torch.randn(10**6, 3, generator=g, dtype=DT)
        w = torch.exp(alpha * lik.distribution(f).log_prob(y))
    mc, se = w.mean(0), w.std(0) / 1000
    assert ((closed.exp() - mc).abs() <= 5 * se).all(), (closed.exp(), mc, se)


@pytest.mark.parametrize("lik", [StudentT(df=4.0, scale=0.5), BernoulliProbit()])
def test_gauss_hermite_for_other_likelihoods_matches_draws(lik):
    lik = lik.to(DT)
    binary = isinstance(lik, BernoulliProbit)
    y = torch.tensor([1.0, 0.0, 1.0], dtype=DT) if binary else torch.tensor([0.4, -1.2, 2.0],
                                                                             dtype=DT)
    loc = torch.tensor([0.1, -0.5, 0.7], dtype=DT)
    var = torch.tensor([0.2, 1.5, 0.05], dtype=DT)
    with torch.no_grad():
        gh = lik.alpha_log_expectation(y, loc, var, 0.5)
        g = torch.Generator().manual_seed(1)
        f = loc + var.sqrt() * torch.randn(4 * 10**5, 3, generator=g, dtype=DT)
        w = torch.exp(0.5 * lik.distribution(f).log_prob(y))
    se = w.std(0) / math.sqrt(w.shape[0])
    assert ((gh.exp() - w.mean(0)).abs() <= 5 * se + 1e-6).all()


@pytest.mark.parametrize("alpha", [1e-3, 0.5, 1.0])
def test_gradients_are_finite_in_float32_with_100_draws(alpha):
    X, y = _data(40, torch.float32)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    loss = LocalAlpha(alpha, num_particles=100).differentiable_loss(model, guide, X, y)
    loss.backward()
    grads = [p.grad for m in (model, guide) for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_fit_and_plain_svi_train_with_it_and_say_loss_not_elbo(capsys):
    X, y = _data()
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, X, y, num_steps=30, objective="alpha", alpha=1.0,
                     num_particles=5, progress=False)
    assert math.isfinite(result.final_elbo) and result.losses[-1] < result.losses[0]
    capsys.readouterr()
    dgp.fit(model, guide, X, y, num_steps=12, objective="alpha", num_particles=2, progress=True,
            final_elbo_particles=0)
    bar = capsys.readouterr().err
    assert "loss=" in bar and "elbo=" not in bar
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), LocalAlpha(0.5, 4))
    assert all(math.isfinite(svi.step(X, y)) for _ in range(3))


def test_bad_arguments_name_the_problem():
    for bad in (0, 0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
            LocalAlpha(alpha=bad)
    for bad in (True, "0.5", None):
        with pytest.raises(TypeError, match="alpha must be a number"):
            LocalAlpha(alpha=bad)
    with pytest.raises(ValueError, match="num_particles"):
        LocalAlpha(0.5, num_particles=0)
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=1, objective="alpha",
                alpha=2.0, progress=False)


def test_fit_warns_when_the_alpha_objective_meets_few_valued_targets():
    """Ratings (standardised or not) warn under the alpha objective, never under the ELBO;
    continuous targets, a handful of points with as many values and a classifier's labels
    do not warn."""
    import warnings

    X, y = _data(n=60)
    ratings = torch.round(2 * y) + 5
    standardised = (ratings - ratings.mean()) / ratings.std()
    for targets in (ratings, standardised):
        model = dgp.DeepGP.regression(X, targets, num_layers=1, num_inducing=5)
        with pytest.warns(UserWarning, match="only 5 distinct values over 60 points") as seen:
            dgp.fit(model, dgp.guides.MeanField(model), X, targets, num_steps=1,
                    objective="alpha", progress=False, final_elbo_particles=0)
        assert {w.filename for w in seen if "distinct" in str(w.message)} == {__file__}
    for objective, (Xs, targets) in (("auto", (X, ratings)), ("alpha", (X, y)),
                                     ("alpha", (X[:8], torch.arange(8, dtype=DT)))):
        model = dgp.DeepGP.regression(Xs, targets, num_layers=1, num_inducing=5)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*distinct values")
            dgp.fit(model, dgp.guides.MeanField(model), Xs, targets, num_steps=1,
                    objective=objective, progress=False, final_elbo_particles=0)
    labels = (y > 0).to(DT)
    model = dgp.DeepGP.classification(X, labels, num_layers=1, num_inducing=5)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*distinct values")
        dgp.fit(model, dgp.guides.MeanField(model), X, labels, num_steps=1, objective="alpha",
                progress=False, final_elbo_particles=0)
