"""ArviZ export: groups, named dims and coords, NetCDF round trip, the log-likelihood/predict
relation, hand-written models, grids, PSIS-LOO comparison of guides, and the variational
Pareto-k with known answers (exact posterior: constant weights equal to log p(y))."""

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import xarray as xr
from pyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal
from pyro.nn import PyroModule, PyroSample

import pyro_dgp as dgp
from pyro_dgp.diagnostics.export import load_datatree, save_datatree, to_datatree
from pyro_dgp.diagnostics.psis import compare_guides, loo, variational_pareto_k

DT = torch.float64


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(-1, 1, n, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=DT)
    return X, y


def _guide(kind, model):
    if kind == "meanfield":
        return dgp.guides.MeanField(model)
    if kind == "meanfield-sampled":
        return dgp.guides.MeanField(model, collapsed=False)
    if kind == "automvn":
        return dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    if kind == "coupled":
        return dgp.guides.Coupled(model)
    if kind == "chain":
        return dgp.guides.Chain(model)
    return dgp.complete(AutoNormal(dgp.inducing_only(model)), model)


def _fitted(kind="meanfield", layers=2, steps=30, M=8):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=layers, num_inducing=M)
    guide = _guide(kind, model)
    dgp.fit(model, guide, X, y, num_steps=steps, progress=False, seed=0)
    return model, guide, X, y


def _all_dims(dt):
    return {d for node in dt.subtree for d in node.dataset.dims}


def test_groups_dims_coords_attrs():
    model, guide, X, y = _fitted()
    dt = to_datatree(model, guide, X, y, num_samples=20, seed=0)
    assert {
        "posterior",
        "layers",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
        "constant_data",
    } <= set(dt.children)
    post = dt["posterior"]
    assert post["layer1.u"].dims == ("chain", "draw", "layer1_unit", "layer1_inducing")
    assert post["layer1.u"].shape == (1, 20, 1, 8)
    lay = dt["layers"]
    assert lay["layer2.f"].dims == ("chain", "draw", "obs", "layer2_unit")
    assert lay["layer1.f_mean"].shape == lay["layer1.f_var"].shape == (1, 20, 30, 1)
    assert lay["layer1.prior_var"].dims == ("chain", "draw", "obs")
    assert dt["log_likelihood"]["y"].dims == ("chain", "draw", "obs")
    assert dt["posterior_predictive"]["y"].shape == (1, 20, 30)
    np.testing.assert_array_equal(dt["observed_data"]["y"].values, y.numpy())
    np.testing.assert_array_equal(dt["constant_data"]["X"].values, X.numpy())
    assert dt["constant_data"]["X"].dims == ("obs", "input_dim")
    assert not any(d.startswith("dim_") for d in _all_dims(dt))
    np.testing.assert_array_equal(dt["layers"]["obs"].values, np.arange(30))
    np.testing.assert_array_equal(post["layer1_inducing"].values, np.arange(8))
    assert dt.attrs["guide"] == "MeanField" and dt.attrs["num_samples"] == 20
    noise = dt.attrs["hyper.likelihood.variance"]
    assert isinstance(noise, float) and noise == pytest.approx(model.likelihood.variance.item())
    assert isinstance(dt.attrs["hyper.layer1.kernel.kernels.0.lengthscale"], float | list)
    assert dt["layers"].attrs["layer1.kl"] > 0


def test_netcdf_round_trip(tmp_path):
    model, guide, X, y = _fitted()
    dt = to_datatree(model, guide, X, y, num_samples=10, seed=0)
    path = save_datatree(dt, tmp_path / "fit.nc")
    back = load_datatree(path)
    assert set(back.children) == set(dt.children)
    for name in dt.children:
        xr.testing.assert_equal(back[name].to_dataset(), dt[name].to_dataset())
    assert back.attrs["guide"] == "MeanField"
    assert back.attrs["hyper.likelihood.variance"] == dt.attrs["hyper.likelihood.variance"]


def test_zarr_needs_zarr(tmp_path):
    pytest.importorskip("xarray")
    try:
        import zarr  # noqa: F401
    except ImportError:
        model, guide, X, y = _fitted(steps=1)
        dt = to_datatree(model, guide, X, y, num_samples=4, seed=0)
        with pytest.raises(ImportError, match="zarr"):
            save_datatree(dt, tmp_path / "fit.zarr")
        with pytest.raises(ImportError, match="zarr"):
            load_datatree(tmp_path / "fit.zarr")
    else:  # pragma: no cover - only where zarr is installed
        model, guide, X, y = _fitted(steps=1)
        dt = to_datatree(model, guide, X, y, num_samples=4, seed=0)
        back = load_datatree(save_datatree(dt, tmp_path / "fit.zarr"))
        xr.testing.assert_equal(back["posterior"].to_dataset(), dt["posterior"].to_dataset())


@pytest.mark.parametrize(
    "kind", ["meanfield", "meanfield-sampled", "automvn", "autonormal", "coupled", "chain"]
)
def test_log_likelihood_is_the_predictive_mixture(kind):
    model, guide, X, y = _fitted(kind, steps=20)
    S = 25
    dt = to_datatree(model, guide, X, y, num_samples=S, seed=3)
    ll = torch.as_tensor(dt["log_likelihood"]["y"].values[0])
    mixture = torch.logsumexp(ll, 0) - math.log(S)
    pred = dgp.predict(model, guide, X, num_samples=S, seed=3)
    torch.testing.assert_close(mixture, pred.log_prob(y), rtol=1e-10, atol=1e-10)
    # the layer values are those of the same draws: the last layer's Gaussian is predict's
    np.testing.assert_allclose(
        dt["layers"]["layer2.f_mean"].values[0, :, :, 0], pred.loc.numpy(), rtol=1e-12
    )


def test_sampled_guide_posterior_draws_feed_the_layers():
    """Sampled-u estimator: f^1's Gaussian is the model's conditional at the stored u."""
    model, guide, X, y = _fitted("meanfield-sampled", layers=1, steps=5)
    dt = to_datatree(model, guide, X, y, num_samples=6, seed=0)
    u = torch.as_tensor(dt["posterior"]["layer1.u"].values[0])  # (S, D, M)
    loc, var = model.layers[0].conditional(X, u)
    np.testing.assert_allclose(
        dt["layers"]["layer1.f_mean"].values[0], loc.detach().numpy(), rtol=1e-10
    )
    np.testing.assert_allclose(
        dt["layers"]["layer1.f_var"].values[0], var.detach().numpy(), rtol=1e-8
    )


@pytest.mark.parametrize("kind", ["automvn", "coupled", "chain"])
def test_grid_replays_the_same_global_draws(kind):
    """Also for the joint guides, whose u is replayed (not drawn) on the grid."""
    model, guide, X, y = _fitted(kind, steps=5)
    a = to_datatree(model, guide, X, y, num_samples=8, seed=1)
    b = to_datatree(model, guide, X, y, num_samples=8, seed=1, grid=X)
    assert b["layers"]["layer1.f"].dims == ("chain", "draw", "grid", "layer1_unit")
    assert b["constant_data"]["grid"].dims == ("grid", "input_dim")
    xr.testing.assert_equal(a["posterior"].to_dataset(), b["posterior"].to_dataset())
    # grid == X and the same u: the first layer's conditional Gaussians coincide
    np.testing.assert_allclose(
        a["layers"]["layer1.f_mean"].values, b["layers"]["layer1.f_mean"].values, rtol=1e-10
    )


class _Hand(PyroModule):
    """The hand-written model of DESIGN.md: a warp then a periodic layer, Normal noise."""

    def __init__(self):
        super().__init__()
        self.warp = dgp.GPLayer(1, 1, num_inducing=6, kernel=dgp.kernels.RBF(1), mean="identity")
        self.f = dgp.GPLayer(1, 1, num_inducing=6, kernel=dgp.kernels.Periodic(1))

    def forward(self, x, y=None):
        h = self.warp(x)
        f = self.f(h)
        with pyro.plate("data", x.shape[-2]):
            return pyro.sample("y", dist.Normal(f.squeeze(-1), 0.1), obs=y)


def test_hand_written_model():
    model = _double(_Hand)
    X, y = _data(n=12)
    guide = dgp.guides.MeanField(model)
    dt = to_datatree(model, guide, X, y, num_samples=7, seed=0)
    assert dt["posterior"]["warp.u"].dims == ("chain", "draw", "warp_unit", "warp_inducing")
    assert dt["layers"]["f.f"].shape == (1, 7, 12, 1)
    # the likelihood scores the sampled f: log N(y | f_s, 0.1)
    f = torch.as_tensor(dt["layers"]["f.f"].values[0, :, :, 0])
    expected = dist.Normal(f, 0.1).log_prob(y)
    np.testing.assert_allclose(dt["log_likelihood"]["y"].values[0], expected.numpy(), rtol=1e-10)
    assert "hyper.warp.kernel.lengthscale" in dt.attrs
    assert np.isfinite(variational_pareto_k(model, guide, X, y, num_samples=50, seed=0).k)


class _HandExtras(_Hand):
    """The hand-written model with a pyro.deterministic and a pyro.factor site."""

    def forward(self, x, y=None):
        h = self.warp(x)
        f = self.f(h)
        with pyro.plate("data", x.shape[-2]):
            pyro.deterministic("h", h.squeeze(-1))
            pyro.factor("smooth", -0.5 * h.squeeze(-1) ** 2)
            return pyro.sample("y", dist.Normal(f.squeeze(-1), 0.1), obs=y)


def test_deterministic_and_factor_sites_are_not_observations():
    model = _double(_HandExtras)
    X, y = _data(n=12)
    dt = to_datatree(model, dgp.guides.MeanField(model), X, y, num_samples=5, seed=0)
    assert list(dt["log_likelihood"].data_vars) == ["y"]
    assert list(dt["observed_data"].data_vars) == ["y"]


class _HandNoise(_Hand):
    """The hand-written model with a Bayesian observation noise (a PyroSample)."""

    def __init__(self):
        super().__init__()
        self.noise = PyroSample(dist.LogNormal(torch.tensor(-2.0), torch.tensor(0.5)))

    def forward(self, x, y=None):
        noise = self.noise  # global: drawn before the data plate opens
        f = self.f(self.warp(x))
        with pyro.plate("data", x.shape[-2]):
            return pyro.sample("y", dist.Normal(f.squeeze(-1), noise), obs=y)


def _double(cls):
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    try:
        return cls()
    finally:
        torch.set_default_dtype(old)


def test_bayesian_hyperparameter_in_posterior():
    """A global latent other than the layers' u (here a PyroSample noise, covered by a
    completed AutoNormal) lands in the posterior group with one value per draw.

    (Bayesian *kernel* hyperparameters cannot be traced vectorised yet: the kernels do not
    broadcast a sample-batched variance of shape (S, 1); predict() fails alike.)"""
    model = _double(_HandNoise)
    X, y = _data(n=12)
    guide = _guide("autonormal", model)
    with torch.no_grad():
        guide(X, y)
    dt = to_datatree(model, guide, X, y, num_samples=9, seed=0)
    assert dt["posterior"]["noise"].dims == ("chain", "draw")
    assert (dt["posterior"]["noise"].values > 0).all()
    assert dt["posterior"]["warp.u"].shape == (1, 9, 1, 6)
    noise = torch.as_tensor(dt["posterior"]["noise"].values[0]).unsqueeze(-1)
    f = torch.as_tensor(dt["layers"]["f.f"].values[0, :, :, 0])
    np.testing.assert_allclose(
        dt["log_likelihood"]["y"].values[0], dist.Normal(f, noise).log_prob(y).numpy(), rtol=1e-10
    )


def test_loo_and_compare_rank_the_poor_fit_last():
    """Two guides of one 2-layer model: mean-field trained 300 steps, and one trained 5 steps
    (draw-dependent log-likelihoods through the inner layer: plain PSIS)."""
    X, y = _data(n=40)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10)
    good = dgp.guides.MeanField(model)
    dgp.fit(model, good, X, y, num_steps=300, lr=0.03, progress=False)
    poor = dgp.guides.MeanField(model)
    dgp.fit(model, poor, X, y, num_steps=5, lr=0.03, progress=False)
    dts = {
        name: to_datatree(model, g, X, y, num_samples=100, seed=0)
        for name, g in (("good", good), ("poor", poor))
    }
    res = loo(dts["good"])
    assert np.isfinite(res.elpd) and res.pareto_k.dims == ("obs",)
    table = compare_guides(dts)
    print(table)
    assert list(table.index) == ["good", "poor"]
    assert table.loc["good", "elpd"] > table.loc["poor", "elpd"] + 10


def test_loo_of_draw_independent_log_likelihood():
    """One layer, collapsed guide: every draw gives the same log p(y_i); loo() is then exact
    with uniform weights, elpd = the sum of the per-point log-likelihoods."""
    X, y = _data(n=20)
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=6)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False)
    dt = to_datatree(model, guide, X, y, num_samples=50, seed=0)
    flat = loo(dt)
    ll = dt["log_likelihood"]["y"].values
    np.testing.assert_allclose(ll, np.broadcast_to(ll[:, :1], ll.shape))
    np.testing.assert_allclose(flat.elpd, ll[0, 0].sum())
    assert (flat.pareto_k.values == 0).all()


# ----------------------------------------------------------------- variational Pareto k
def _svgp(n=40, M=15, noise=0.01):
    X, y = _data(n)
    model = dgp.DeepGP.regression(
        X,
        y,
        num_layers=1,
        num_inducing=M,
        noise_variance=noise,
        lengthscale=0.5,
        kernel_variance=1.0,
    )
    guide = dgp.guides.MeanField(model)
    with torch.no_grad():
        guide(X)
    return model, guide, X, y


def _whitened_terms(model, X):
    layer = model.layers[0]
    with torch.no_grad():
        L = layer.kzz_cholesky()
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, X), upper=False)
        v = layer.kernel(X, diag=True) - (A * A).sum(0)
    return A, v.clamp_min(0), model.likelihood.variance.item()


def _set_gaussian_q(guide, precision, rhs):
    cov = torch.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    guide.set_q_params("layer1.u", (cov @ rhs).unsqueeze(0),
                       torch.linalg.cholesky(cov).unsqueeze(0))


def test_pareto_k_exact_posterior_gives_constant_weights():
    """q = the exact posterior p(u | y) of the one-layer model (f_i independent given u):
    every log weight equals log p(y) = log N(y; 0, A^T A + diag(noise + v))."""
    model, guide, X, y = _svgp()
    A, v, s2 = _whitened_terms(model, X)
    r = 1 / (s2 + v)
    _set_gaussian_q(guide, torch.eye(A.shape[0], dtype=DT) + (A * r) @ A.T, A @ (r * y))
    cov_y = A.T @ A + torch.diag(s2 + v)
    exact = float(dist.MultivariateNormal(torch.zeros_like(y), cov_y).log_prob(y))
    res = variational_pareto_k(model, guide, X, y, num_samples=200, seed=0)
    # float64 conditionals take the quadratic form (pyro_dgp/conditional.py), accurate to
    # ~eps cond(K_ZZ) relative in each variance: measured up to 1.5e-7 on these log weights
    np.testing.assert_allclose(res.log_weights, exact, rtol=0, atol=1e-6)
    assert res.log_marginal == pytest.approx(exact, abs=1e-6)


def test_pareto_k_near_optimum_and_far_from_it():
    model, guide, X, y = _svgp()
    A, v, s2 = _whitened_terms(model, X)
    # Titsias' optimum of the ELBO for these hyperparameters
    _set_gaussian_q(guide, torch.eye(A.shape[0], dtype=DT) + A @ A.T / s2, A @ y / s2)
    res = variational_pareto_k(model, guide, X, y, num_samples=1000, seed=0)
    print(res)
    assert res.k < 0.7
    # the mean log weight estimates the one-layer ELBO, known in closed form:
    # sum_i [log N(y_i; a_i^T m, v_i + s2) - (a_i^T S a_i) / (2 (v_i + s2))] - KL(q || N(0, I))
    loc, tril = guide.q_params(guide.layer_sites[0])
    m, L = loc[0].detach(), tril[0].detach()
    tot = v + s2
    fit = dist.Normal(A.T @ m, tot.sqrt()).log_prob(y) - 0.5 * (A * (L @ L.T @ A)).sum(0) / tot
    kl = torch.distributions.kl_divergence(
        dist.MultivariateNormal(m, scale_tril=L),
        dist.MultivariateNormal(torch.zeros_like(m), torch.eye(len(m), dtype=DT)))
    ref = float(fit.sum() - kl)
    se = float(np.std(res.log_weights)) / math.sqrt(len(res.log_weights))
    # 1e-4: the float64 conditional's own rounding (quadratic form) on these weights
    assert abs(res.elbo - ref) < 4 * se + 1e-4, (res.elbo, ref, se)
    # a q ten times too narrow is a poor importance sampler
    loc, tril = guide.q_params(guide.layer_sites[0])
    guide.set_q_params("layer1.u", loc.detach(), 0.1 * tril.detach())
    bad = variational_pareto_k(model, guide, X, y, num_samples=1000, seed=0)
    print(bad)
    assert bad.k > 0.7


@pytest.mark.parametrize("spread", [1.0, 30.0, 1000.0])
def test_pareto_smoothing_of_widely_spread_weights_is_never_called_good(spread):
    """Log-weights N(0, spread^2), S = 200: the tail is heavier the wider the spread (k-hat
    of log-normal weights grows with it); where ArviZ's fit breaks down (one weight
    dominating) k-hat is inf with a warning, never a 'good' value with NaN weights."""
    from pyro_dgp.diagnostics.psis import pareto_smooth

    log_w = spread * np.random.default_rng(0).standard_normal(200)
    if spread > 300:
        with pytest.warns(UserWarning, match="largest importance weight dominates"):
            smoothed, k = pareto_smooth(log_w)
        assert k == math.inf
    else:
        smoothed, k = pareto_smooth(log_w)
        assert (k < 0.7) if spread == 1.0 else (k > 0.7)
    assert np.isfinite(smoothed).all()
    assert np.logaddexp.reduce(smoothed) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("xi", [0.3, 0.9])
def test_pareto_smoothing_fits_the_upper_tail_of_known_shape(xi):
    """Weights w = U^-xi (U uniform) have a Pareto upper tail of shape xi: k-hat estimates xi
    (standard error about (1 + xi) / sqrt(M) from the M = 3 sqrt(S) tail draws). The mirrored
    weights 1/w have a bounded tail, k-hat < 0.5: a fit of the wrong tail would swap them."""
    from pyro_dgp.diagnostics.psis import pareto_smooth

    S = 4000
    log_w = -xi * np.log(np.random.default_rng(1).uniform(size=S))
    se = (1 + xi) / math.sqrt(3 * math.sqrt(S))
    assert abs(pareto_smooth(log_w)[1] - xi) < 3 * se
    assert pareto_smooth(-log_w)[1] < 0.5


@pytest.mark.parametrize("kind", ["coupled", "coupled-rank", "chain"])
def test_joint_guides_log_q_is_the_joint_density_of_the_draws(kind):
    """The joint guides' u sites score log p(u^l) + KL (for Pyro's ELBOs), not log q: the
    importance weights need the joint density N(v; mean, Cov) of every layer's draw.

    Near the initial state (well conditioned) it equals torch's density of the joint factor.
    After training, where Adam has made the factor ill-conditioned and a triangular solve
    unreliable, -log q of the guide's own draws still averages to the closed-form entropy
    (within 4 Monte Carlo standard errors)."""
    from pyro_dgp.diagnostics.psis import guide_log_density
    from pyro_dgp.guides.draws import trace_draws

    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=3, num_inducing=6, hidden_dim=2)
    guide = (dgp.guides.Coupled(model, rank=3) if kind == "coupled-rank"
             else _guide(kind, model))
    for steps, S in ((2, 7), (40, 400)):
        dgp.fit(model, guide, X, y, num_steps=steps, progress=False, seed=0)
        with torch.no_grad(), dgp.rng.seeded(1, X.device):
            trace = trace_draws(guide, (X,), S)
            log_q = guide_log_density(guide, trace, S)
            v = torch.cat([trace.nodes[s.name]["value"].reshape(S, -1)
                           for s in guide.layer_sites], dim=-1)
            mean, R, d, _ = guide.factor()
            q = (dist.MultivariateNormal(mean, scale_tril=R) if d is None
                 else dist.LowRankMultivariateNormal(mean, R, d))
            if steps == 2:
                torch.testing.assert_close(log_q, q.log_prob(v), rtol=1e-9, atol=1e-8)
                sites = sum(trace.nodes[s.name]["fn"].log_prob(trace.nodes[s.name]["value"])
                            .reshape(S) for s in guide.layer_sites)
                assert (log_q - sites).abs().max() > 1e-3  # what was summed before
            else:
                se = float((-log_q).std()) / math.sqrt(S)
                assert abs(float(-log_q.mean() - q.entropy())) < 4 * se, (
                    float(-log_q.mean()), float(q.entropy()), se)
    with warnings.catch_warnings():  # k-hat may be inf this early (a warning says so)
        warnings.simplefilter("ignore", UserWarning)
        res = variational_pareto_k(model, guide, X, y, num_samples=50, seed=0)
    assert res.log_weights.shape == (50,) and np.isfinite(res.log_weights).all()


def test_pareto_k_deep_model_runs():
    model, guide, X, y = _fitted("automvn", steps=10)
    res = variational_pareto_k(model, guide, X, y, num_samples=100, seed=0)
    assert np.isfinite(res.k) and res.log_weights.shape == (100,)


def test_pareto_k_needs_a_density():
    model, guide, X, y = _fitted(steps=1)
    guide.tractable_log_q = False
    with pytest.raises(ValueError, match="tractable"):
        variational_pareto_k(model, guide, X, y, num_samples=10)
    delta = dgp.complete(AutoDelta(dgp.inducing_only(model)), model)
    with pytest.raises(ValueError, match="point mass"):
        variational_pareto_k(model, delta, X, y, num_samples=10)


def test_prior_variance_uses_each_draws_kernel_hyperparameters():
    """A Bayesian kernel variance (PyroSample): the DataTree's prior_var of the layer is each
    draw's own k(x, x) = variance (an RBF), not a fresh prior draw."""
    X = torch.linspace(-1, 1, 12, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1))
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    model.layers[1].kernel.variance = PyroSample(dist.LogNormal(torch.tensor(0.0, dtype=DT),
                                                                1.0))
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model), init_scale=0.5), model)
    guide(X, y)
    tree = dgp.to_datatree(model, guide, X, y, num_samples=7, seed=3, kl=False)
    prior_var = tree["layers"]["layer2.prior_var"].values[0]  # (S, N)
    name, = [v for v in tree["posterior"].data_vars if v.endswith("layers.1.kernel.variance")]
    variance = tree["posterior"][name].values[0].reshape(7)  # the model's name is unique
    np.testing.assert_allclose(prior_var, np.broadcast_to(variance[:, None], prior_var.shape),
                               rtol=1e-12)
    assert np.ptp(variance) > 0.1
