"""Inducing points as inducing locations (seed 003 §4.2) as a DeepGP option."""

import pytest
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO
from torch.distributions import MultivariateNormal, Normal, kl_divergence

import pyro_dgp as dgp
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.linalg import default_jitter

DT = torch.float64


def _data(N=30):
    X = torch.linspace(-1, 1, N, dtype=DT).unsqueeze(-1)
    return X, torch.sin(4 * X.squeeze(-1))


def test_function_value_layer_elbo_is_the_closed_form():
    """One layer holding f(Z) with a linear mean: ELBO = E log p(y|f) - KL(q || N(m(Z), K))."""
    X, y = _data()
    Z = torch.linspace(-0.9, 0.9, 7, dtype=DT).unsqueeze(-1)
    W = torch.tensor([[0.7]], dtype=DT)
    layer = dgp.GPLayer(1, 1, inducing_points=Z, mean=W, whiten=False, function_values=True,
                        kernel=dgp.kernels.RBF(1, variance=1.2, lengthscale=0.5), jitter=1e-12)
    model = dgp.DeepGP([layer], Gaussian(0.05)).to(DT)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    g = torch.Generator().manual_seed(0)
    m = torch.randn(1, 7, generator=g, dtype=DT)
    L = torch.randn(7, 7, generator=g, dtype=DT).tril(-1) * 0.2 + 0.3 * torch.eye(7, dtype=DT)
    guide.set_q("layer1.u", m, L.unsqueeze(0))
    with torch.no_grad():
        K, Kzx, kxx = layer.kernel(Z), layer.kernel(Z, X), layer.kernel(X, diag=True)
        S = L @ L.mT
        KiKzx = torch.linalg.solve(K, Kzx)
        mZ, mX = (Z @ W).squeeze(-1), (X @ W).squeeze(-1)
        mean = mX + KiKzx.mT @ (m[0] - mZ)
        var = kxx - (Kzx * KiKzx).sum(0) + (KiKzx * (S @ KiKzx)).sum(0)
        s2 = model.likelihood.variance
        ell = (Normal(mean, s2.sqrt()).log_prob(y) - 0.5 * var / s2).sum()
        kl = kl_divergence(MultivariateNormal(m[0], S), MultivariateNormal(mZ, K))
        exact = float(ell - kl)
    assert -TraceMeanField_ELBO().loss(model, guide, X, y) == pytest.approx(exact, rel=1e-8)


def test_second_layer_prior_is_conditioned_on_the_first_layers_values():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, inducing="locations")
    assert model.inducing == "locations"
    assert all(not layer.whiten and layer.function_values for layer in model.layers)
    trace = poutine.trace(model).get_trace(X)
    trace.compute_log_prob()
    l2 = model.layers[1]
    Z2 = trace.nodes["layer1.u"]["value"].mT  # (M, D1): layer 1's values at z
    u2 = trace.nodes["layer2.u"]["value"]
    with torch.no_grad():
        K = l2.kernel(Z2)
        K = K + default_jitter(DT) * K.diagonal().mean() * torch.eye(6, dtype=DT)
        ref = MultivariateNormal(l2.mean_function(Z2).mT[0], covariance_matrix=K).log_prob(u2[0])
    lp = float(trace.nodes["layer2.u"]["log_prob_sum"].detach())
    assert lp == pytest.approx(float(ref), rel=1e-9)


def test_inner_layers_are_drawn_given_their_sampled_u(monkeypatch):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, inducing="locations")
    guide = dgp.guides.MeanField(model, collapsed=True)
    guide(X, y)
    calls = []
    original = dgp.GPLayer.conditional

    def spy(self, x, u_loc, u_scale_tril=None, Lzz=None):
        calls.append((self.name, u_scale_tril is None))
        return original(self, x, u_loc, u_scale_tril, Lzz)

    monkeypatch.setattr(dgp.GPLayer, "conditional", spy)
    poutine.trace(guide).get_trace(X, y)
    # layer 1's u is layer 2's inducing input: never collapsed; the last layer may collapse
    assert calls == [("layer1", True), ("layer2", False)]


def test_locations_model_trains_and_joint_guides_refuse_it():
    d = dgp.datasets.compositional_toy(n_train=40)
    model = dgp.DeepGP.regression(d.X_train, d.y_train, num_layers=2, num_inducing=10,
                                  inducing="locations")
    guide = dgp.guides.MeanField(model)
    r = dgp.fit(model, guide, d.X_train, d.y_train, num_steps=200, lr=0.02, progress=False)
    assert r.losses[-1] < r.losses[0]
    pred = dgp.predict(model, guide, d.X_test, num_samples=20)
    assert torch.isfinite(pred.log_prob(d.y_test)).all()
    for Guide in (dgp.guides.Coupled, dgp.guides.Chain):
        with pytest.raises(ValueError, match="inducing='locations'"):
            Guide(model)(d.X_train, d.y_train)


def test_locations_needs_unwhitened_function_value_layers():
    with pytest.raises(ValueError, match="function_values=True needs whiten=False"):
        dgp.GPLayer(1, 1, num_inducing=3, function_values=True)
    a = dgp.GPLayer(1, 1, num_inducing=3, whiten=False)
    b = dgp.GPLayer(1, 1, num_inducing=3, whiten=False)
    with pytest.raises(ValueError, match="function_values=True"):
        dgp.DeepGP([a, b], Gaussian(), inducing="locations")
