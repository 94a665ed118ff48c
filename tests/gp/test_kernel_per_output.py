"""A kernel per output GP (``outputs=`` of a stationary kernel, ``kernel_per_output=True`` of
``DeepGP.regression``): known answers against separate kernels and single-output layers, the
shared-kernel limit, every registry guide through a fit and a prediction, the ArviZ export,
and the clear errors where it does not apply."""

import numpy as np
import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.diagnostics.export import to_datatree
from pyro_dgp.gold.target import check_gold_model
from pyro_dgp.gp.conditional import quadratic_form
from pyro_dgp.gp.distributions import FunctionPath
from pyro_dgp.guides import estimators
from pyro_dgp.guides.prototype import LayerSite
from pyro_dgp.guides.registry import GUIDES, LOCAL_INDUCING_GUIDES, make_guide
from pyro_dgp.kernels import RBF, Matern32, White

DT = torch.float64


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _per_output_kernel(cls=RBF, P=3, D=2):
    """``cls`` with ``outputs=P``, each output's hyperparameters set apart."""
    k = cls(D, variance=torch.tensor(1.0, dtype=DT), lengthscale=torch.ones(D, dtype=DT),
            outputs=P)
    k.variance = torch.linspace(0.5, 2.0, P, dtype=DT)
    k.lengthscale = 0.4 + torch.rand(P, D, generator=torch.Generator().manual_seed(1), dtype=DT)
    return k


def _output_kernel(k, d, cls=RBF):
    """Output ``d`` of the per-output kernel ``k`` as a kernel of its own."""
    return cls(k.input_dim, variance=k.variance[d].detach(),
               lengthscale=k.lengthscale[d].detach())


@pytest.mark.parametrize("cls", [RBF, Matern32])
def test_per_output_kernel_stacks_the_kernels_of_its_outputs(cls):
    k = _per_output_kernel(cls)
    Z, X = _rand(4, 2), _rand(2, 1, 5, 2, seed=1)  # a batch dim, and the outputs' singleton
    Kzz, Kzx, kxx = k.conditional_parts(Z, X)
    assert Kzz.shape == (3, 4, 4) and Kzx.shape == (2, 3, 4, 5) and kxx.shape == (2, 3, 5)
    for d in range(3):
        kd = _output_kernel(k, d, cls)
        torch.testing.assert_close(Kzz[d], kd(Z), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(Kzx[:, d], kd(Z, X[:, 0]), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kxx[:, d], kd(X[:, 0], diag=True), rtol=0, atol=0)
        torch.testing.assert_close(k(X)[:, d], kd(X[:, 0]), rtol=1e-12, atol=1e-12)


def _layers(P=3, D_in=2, M=6, whiten=True):
    """A per-output layer and, for each output, a one-output layer with that output's kernel
    and the same inducing inputs."""
    Z = _rand(M, D_in, seed=2)
    k = _per_output_kernel(P=P, D=D_in)
    layer = dgp.GPLayer(D_in, P, inducing_points=Z, kernel=k + White(D_in, variance=1e-3),
                        whiten=whiten)
    singles = [dgp.GPLayer(D_in, 1, inducing_points=Z, whiten=whiten,
                           kernel=_output_kernel(k, d) + White(D_in, variance=1e-3))
               for d in range(P)]
    return layer, singles


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("quadratic", [True, False])
@pytest.mark.parametrize("form", ["draws", "gaussian", "per-point"])
def test_per_output_layer_equals_its_outputs_as_single_output_layers(form, quadratic, whiten):
    """float64's quadratic form and the projected one, whitened ``u`` or not, each against the
    single-output layers' (projected) conditional."""
    with quadratic_form(quadratic):
        _per_output_layer_equals_its_outputs(form, whiten)


def test_an_unwhitened_per_output_prior_is_each_outputs_kernel():
    layer, singles = _layers(whiten=False)
    u = _rand(3, 6, seed=11)
    want = sum(s.prior().log_prob(u[d:d + 1]) for d, s in enumerate(singles))
    torch.testing.assert_close(layer.prior().log_prob(u), want, rtol=1e-12, atol=1e-12)


def _per_output_layer_equals_its_outputs(form, whiten=True):
    layer, singles = _layers(whiten=whiten)
    x = _rand(4, 7, 2, seed=3)
    u = _rand(4, 3, 6, seed=4)
    S = _rand(3, 6, 6, seed=5).tril()
    if form == "draws":  # a u per draw: the model's p(f | u)
        args = [(x, u[:, d:d + 1]) for d in range(3)]
        loc, var = layer.conditional(x, u)
    elif form == "gaussian":  # q(u) integrated out
        args = [(x, u[0, d:d + 1], S[d:d + 1]) for d in range(3)]
        loc, var = layer.conditional(x, u[0], S)
    else:  # a u per point (guides' per-point estimator): x (..., N, 1, D_in)
        up = _rand(7, 3, 6, seed=6)
        args = [(x[0].unsqueeze(-2), up[:, d:d + 1]) for d in range(3)]
        loc, var = layer.conditional(x[0].unsqueeze(-2), up)
    with torch.no_grad(), quadratic_form(False):
        loc_d, var_d = zip(*(s.conditional(*a) for s, a in zip(singles, args, strict=True)),
                           strict=True)
    torch.testing.assert_close(loc, torch.cat(loc_d, -1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(var, torch.cat(var_d, -1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer.prior_variance(x),
                               torch.cat([s.prior_variance(x) for s in singles], -1))


def test_equal_hyperparameters_give_the_shared_kernel_model():
    X, y = _rand(30, 3, seed=7), _rand(30, seed=8)
    shared = dgp.DeepGP.regression(X, y, num_layers=3, hidden_dim=2, num_inducing=8)
    per = dgp.DeepGP.regression(X, y, num_layers=3, hidden_dim=2, num_inducing=8,
                                kernel_per_output=True)
    assert [layer.kernel_outputs for layer in per.layers] == [2, 2, None]
    u, x = _rand(5, 2, 8, seed=9), _rand(5, 30, 3, seed=10)
    for a, b in zip(shared.layers[:2], per.layers[:2], strict=True):
        xa = x if a.input_dim == 3 else x[..., :2]
        for got, want in zip(b.conditional(xa, u), a.conditional(xa, u), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("name", sorted(set(GUIDES) - LOCAL_INDUCING_GUIDES))
def test_every_registry_guide_fits_and_predicts_with_a_kernel_per_output(name, whiten):
    pyro.clear_param_store()
    X = _rand(40, 3, seed=11)
    y = torch.sin(X.sum(-1))
    model = dgp.DeepGP.regression(X, y, num_layers=3, hidden_dim=2, num_inducing=6,
                                  kernel_per_output=True, whiten=whiten)
    guide = make_guide(name, model)
    result = dgp.fit(model, guide, X, y, num_steps=3, progress=False)
    assert torch.isfinite(torch.as_tensor(result.losses)).all()
    pred = dgp.predict(model, guide, X[:5], num_samples=4)
    assert torch.isfinite(pred.mean).all() and torch.isfinite(pred.variance).all()
    assert model.layers[0].kernel.kernels[0].variance.shape == (2,)


def test_export_records_a_prior_variance_per_unit():
    pyro.clear_param_store()
    X = _rand(20, 2, seed=12)
    y = X[:, 0]
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5, kernel_per_output=True)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=2, progress=False)
    layers = to_datatree(model, guide, X, y, num_samples=3)["layers"].to_dataset()
    prior = layers["layer1.prior_var"]
    assert prior.dims == layers["layer1.f"].dims  # per unit
    assert layers["layer2.prior_var"].dims == ("chain", "draw", "obs")  # shared
    want = model.layers[0].prior_variance(X).detach().numpy()
    assert abs(prior.values[0, 0] - want).max() < 1e-12


def test_sample_paths_draw_each_output_with_its_own_kernel():
    """A path's draws of ``f`` over the points have each output's covariance given ``u``:
    ``K_d(X, X) - K_d(X, Z) K_d(Z, Z)^-1 K_d(Z, X)``, checked by the empirical covariance of
    4,000 paths (tolerance: 5 standard errors of a covariance, ``sqrt((s_ij^2 + s_ii s_jj)
    / n)``)."""
    layer, singles = _layers(P=2, M=4)
    x, u = _rand(5, 2, seed=13), _rand(2, 4, seed=14)
    loc, var, L = estimators.path(LayerSite("gp.u", layer, index=0, is_last=False), x, u)
    assert L.shape == (2, 5, 5)
    torch.manual_seed(0)
    n = 4000
    fn = FunctionPath(loc.expand(n, 5, 2), var.expand(n, 5, 2), L, per_output=True)
    draws = fn.rsample()  # (n, 5, 2)
    for d, single in enumerate(singles):
        Lzz = single.kzz_cholesky()
        A = torch.linalg.solve_triangular(Lzz, single.kernel(single.inducing_points, x),
                                          upper=False)
        want = (single.kernel(x) - A.mT @ A).detach()
        got = torch.cov(draws[..., d].mT)
        se = ((want.square() + want.diagonal()[:, None] * want.diagonal()[None]) / n).sqrt()
        assert ((got - want).abs() <= 5 * se + 1e-12).all(), d
        torch.testing.assert_close(var[:, d], want.diagonal(), rtol=1e-8, atol=1e-10)


def test_export_draws_sample_paths_on_a_grid():
    pyro.clear_param_store()
    X = _rand(20, 1, seed=15)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=3, hidden_dim=2, num_inducing=5,
                                  kernel_per_output=True)
    guide = dgp.guides.MeanField(model)
    grid = torch.linspace(-2, 2, 30, dtype=DT).unsqueeze(-1)
    dt = to_datatree(model, guide, X, X[:, 0], num_samples=3, grid=grid)
    assert dt["layers"].attrs["sample_paths"] == 1
    f = dt["layers"].to_dataset()["layer1.f"]
    assert f.shape == (1, 3, 30, 2) and np.isfinite(f.values).all()


def test_where_a_kernel_per_output_does_not_apply_the_error_says_so():
    k = RBF(2, outputs=3)
    with pytest.raises(ValueError, match="outputs=3 needs output_dim 3, got 2"):
        dgp.GPLayer(2, 2, num_inducing=4, kernel=k)
    with pytest.raises(ValueError, match="RBF: outputs must be a positive integer, got 0"):
        RBF(2, outputs=0)
    with pytest.raises(ValueError, match="different outputs"):
        dgp.GPLayer(2, 3, num_inducing=4, kernel=RBF(2, outputs=3) + RBF(2, outputs=2))
    X, y = _rand(20, 2), _rand(20)
    with pytest.raises(ValueError, match="kernel_per_output=True needs inducing_scheme"):
        dgp.DeepGP.regression(X, y, inducing_scheme="propagated", kernel_per_output=True)
    layer = dgp.GPLayer(2, 3, num_inducing=4, kernel=RBF(2, outputs=3))
    with pytest.raises(ValueError, match="random inducing inputs need a kernel shared"):
        with layer.given_inducing_inputs(_rand(5, 4, 2)):
            pass
    with pytest.raises(ValueError, match="shared by the outputs"):
        dgp.AmortizedGPLayer(2, 3, num_inducing=4, kernel=RBF(2, outputs=3))
    model = dgp.DeepGP.regression(X, y, kernel_per_output=True)
    with pytest.raises(ValueError, match=r"kernel per output: \['layer1'\]"):
        check_gold_model(model)


def test_float32_data_give_a_float32_per_output_model_equal_to_the_shared_one():
    """Dtype follows the data; float32 takes the projected form (no quadratic form there)."""
    X, y = _rand(30, 3, seed=16).float(), _rand(30, seed=17).float()
    shared = dgp.DeepGP.regression(X, y, hidden_dim=2, num_inducing=8)
    per = dgp.DeepGP.regression(X, y, hidden_dim=2, num_inducing=8, kernel_per_output=True)
    assert per.layers[0].kernel.kernels[0].lengthscale.dtype == torch.float32
    u, S = _rand(2, 8, seed=18).float(), _rand(2, 8, 8, seed=19).float().tril()
    for got, want in zip(per.layers[0].conditional(X, u, S), shared.layers[0].conditional(X, u, S),
                         strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_joint_kl_to_an_unwhitened_per_output_prior_is_the_sum_of_the_outputs_kls():
    """The cross-layer guides' closed-form KL against each output's own ``N(0, K_ZZ^(d))``."""
    from torch.distributions import MultivariateNormal, kl_divergence

    from pyro_dgp.gp.kl import gaussian_kl_to_layer_prior

    layer, singles = _layers(whiten=False)
    mean, R = _rand(18, seed=12), _rand(18, 18, seed=13).tril() + 2 * torch.eye(18, dtype=DT)
    d = _rand(18, seed=14).square()
    got = gaussian_kl_to_layer_prior([layer], mean, R, d)
    cov = R @ R.mT + torch.diag(d)
    want = sum(kl_divergence(MultivariateNormal(mean[6 * k:6 * k + 6],
                                                cov[6 * k:6 * k + 6, 6 * k:6 * k + 6]),
                             MultivariateNormal(torch.zeros(6, dtype=DT),
                                                scale_tril=s.kzz_cholesky()))
               for k, s in enumerate(singles))
    # the joint's KL to the product of priors adds the mutual information between the blocks
    blocks = sum(torch.linalg.slogdet(cov[6 * k:6 * k + 6, 6 * k:6 * k + 6])[1] for k in range(3))
    want = want + 0.5 * (blocks - torch.linalg.slogdet(cov)[1])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
