"""Compositional-uncertainty diagnostics: the collapse indicator (mean-field vs a cross-layer
joint guide on the compositional toy, seed 003), KL per layer (closed form against known
values and Monte Carlo), and the plots (non-empty PNGs that matplotlib reads back)."""

import math

import matplotlib.image as mpimg
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoIAFNormal, AutoMultivariateNormal, AutoNormal
from torch.distributions import MultivariateNormal, kl_divergence

import pyro_dgp as dgp
from pyro_dgp.diagnostics import (
    layer_kl,
    layer_summary,
    layer_variance,
    plot_diagnostics,
    plot_hyperparameters,
)
from pyro_dgp.diagnostics.export import to_datatree


def _toy_fit(kind, steps=300):
    split = dgp.datasets.compositional_toy(n_train=41, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    # the start of Salimbeni and Deisenroth 2017, at which the ratios below were measured
    # (the package's start, q(u) = p(u), has not collapsed the inner layer after 300 steps)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=20, noise_variance=0.01,
                                  kernel_variance=2.0, lengthscale=2.0, train_mean=False)
    if kind == "meanfield":
        guide = dgp.guides.MeanField(model, inner_variance=1e-5)
    else:
        guide = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    # the ratios below were measured at a constant rate and one draw per step
    dgp.fit(model, guide, X, y, num_steps=steps, lr=0.01, progress=False, seed=0,
            lr_schedule="constant", num_particles=1)
    return model, guide, X, y


@pytest.mark.slow  # about 4.5 s: two fits
def test_collapse_indicator_meanfield_vs_joint_guide():
    """A mean-field guide makes the inner layer of a compositional fit deterministic
    (posterior / prior variance ~ 0), a guide coupling the layers keeps its uncertainty.
    Measured (300 Adam steps, lr 0.01, M = 20, 41 points): mean-field inner ratio ~7e-4,
    completed AutoMultivariateNormal ~8e-2 (about 100 times larger)."""
    ratios = {}
    for kind in ("meanfield", "automvn"):
        model, guide, X, y = _toy_fit(kind)
        table = layer_summary(to_datatree(model, guide, X, num_samples=100, seed=1))
        print(kind, table.to_string(), sep="\n")
        ratios[kind] = table.loc["layer1", "var_ratio"]
        assert table.loc["layer1", "kl"] > 0 and np.isfinite(table.loc["layer2", "kl"])
    print("inner-layer ratio", ratios)
    assert ratios["meanfield"] < 0.01
    assert ratios["automvn"] > 0.02
    assert ratios["automvn"] > 10 * ratios["meanfield"]


def _model(layers=2, M=5):
    X = torch.linspace(-1, 1, 15, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    return dgp.DeepGP.regression(X, y, num_layers=layers, num_inducing=M), X, y


def test_kl_meanfield_at_initialisation_known_values():
    """Whitened, m = 0: the last layer's q is the prior (KL 0); an inner layer with
    S = s I has KL = D/2 (M s - M - M log s)."""
    model, X, y = _model(M=5)
    guide = dgp.guides.MeanField(model, inner_variance=1e-3)
    with torch.no_grad():
        guide(X)
    kl = layer_kl(model, guide, X)
    s, M = 1e-3, 5
    assert kl["layer1"] == pytest.approx(0.5 * (M * s - M - M * math.log(s)), rel=1e-10)
    assert kl["layer2"] == pytest.approx(0.0, abs=1e-10)


def test_kl_autoguides_closed_form_and_monte_carlo():
    model, X, y = _model()
    normal = dgp.complete(AutoNormal(dgp.inducing_only(model), init_scale=0.3), model)
    dgp.fit(model, normal, X, y, num_steps=5, progress=False)
    closed = layer_kl(model, normal, X)
    # Monte Carlo from the trace, forcing the fallback with a plain guide wrapper
    from pyro_dgp.diagnostics.kl import monte_carlo_kl, monte_carlo_kl_draws
    from pyro_dgp.guides.draws import trace_draws

    with torch.no_grad():
        pyro.set_rng_seed(0)
        trace = trace_draws(normal, (X,), 4000)
    for i, layer in enumerate(model.layers):
        mc = monte_carlo_kl(trace, f"layer{i + 1}", layer)
        draws = monte_carlo_kl_draws(trace, f"layer{i + 1}", layer)
        assert mc == pytest.approx(float(draws.mean()), rel=1e-12)
        se = float(draws.std()) / len(draws) ** 0.5
        assert mc == pytest.approx(closed[f"layer{i + 1}"], abs=4 * se)
    # a joint Gaussian: per-layer marginal KLs sum to at most the joint KL (the prior
    # factorises over layers; the difference is the mutual information)
    mvn = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    dgp.fit(model, mvn, X, y, num_steps=20, progress=False)
    marg = layer_kl(model, mvn, X)
    post = mvn.inner.get_posterior()
    prior_scale = torch.block_diag(
        *[
            torch.block_diag(*([layer.prior().base_dist.scale_tril[0]] * layer.output_dim))
            for layer in model.layers
        ]
    )
    joint = torch.distributions.kl_divergence(
        post, dist.MultivariateNormal(torch.zeros_like(post.loc), scale_tril=prior_scale)
    )
    assert sum(marg.values()) <= joint.item() + 1e-8
    # each layer's KL is its block of the joint posterior against the layer's prior (torch)
    lo = 0
    for i, layer in enumerate(model.layers):
        p = layer.prior().base_dist
        D, M = p.loc.shape[-2:]
        n = D * M
        block = dist.MultivariateNormal(
            post.loc[lo:lo + n], covariance_matrix=post.covariance_matrix[lo:lo + n, lo:lo + n])
        prior = dist.MultivariateNormal(
            p.loc.reshape(-1), scale_tril=torch.block_diag(*p.scale_tril.expand(D, M, M)))
        ref = float(torch.distributions.kl_divergence(block, prior))
        assert marg[f"layer{i + 1}"] == pytest.approx(ref, rel=1e-9)
        lo += n
    # a flow has no per-layer Gaussian marginal nor per-site density
    iaf = dgp.complete(AutoIAFNormal(dgp.inducing_only(model), num_transforms=1), model)
    with torch.no_grad():
        iaf(X)
    assert all(math.isnan(v) for v in layer_kl(model, iaf, X, num_samples=4).values())


def test_layer_summary_and_variance_from_a_datatree():
    model, X, y = _model()
    guide = dgp.guides.MeanField(model, collapsed=False)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False)
    dt = to_datatree(model, guide, X, y, num_samples=30, seed=0)
    table = layer_summary(dt)
    assert list(table.index) == ["layer1", "layer2"]
    assert {"f_mean", "f_var", "prior_var", "var_ratio", "kl"} <= set(table.columns)
    lv = layer_variance(dt)
    # law of total variance from the attached Gaussians
    m, v = dt["layers"]["layer2.f_mean"], dt["layers"]["layer2.f_var"]
    expected = v.mean(("chain", "draw")) + m.var(("chain", "draw"))
    np.testing.assert_allclose(lv["layer2.post_var"].values, expected.values)
    kern = model.layers[0].kernel
    np.testing.assert_allclose(
        lv["layer1.prior_var"].values, float(kern(X[:1], diag=True).detach()), rtol=1e-12
    )
    assert table.loc["layer2", "var_ratio"] == pytest.approx(float(lv["layer2.var_ratio"].mean()))


def _check_png(path):
    assert path.exists() and path.stat().st_size > 2000
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img)) > 0.01  # not blank


def test_plots_are_written(tmp_path):
    model, X, y = _model()
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False)
    grid = torch.linspace(-1.2, 1.2, 40, dtype=X.dtype).unsqueeze(-1)
    dt = to_datatree(model, guide, X, y, num_samples=20, seed=0, grid=grid)
    paths = plot_diagnostics(dt, tmp_path, prefix="mf_")
    assert set(paths) == {"paths", "variance", "hyperparameters"}
    for p in paths.values():
        _check_png(p)
    with pytest.raises(ValueError, match="1-D"):
        from pyro_dgp.diagnostics import plot_layer_paths

        dt2 = dt.copy()
        dt2["constant_data"] = (
            dt2["constant_data"]
            .to_dataset()
            .assign(grid=(("grid", "input_dim2"), np.zeros((40, 2))))
        )
        plot_layer_paths(dt2, tmp_path / "x.png")


@pytest.mark.parametrize("D", [2, 3])
def test_plots_of_many_inputs_write_what_applies_and_name_what_they_skip(tmp_path, D):
    """Inputs of D > 1 dims: per-layer variances and the predictive against the inputs (maps
    over the plane for D = 2), no layer paths (curves against a 1-D x), said by
    skipped_plots."""
    from pyro_dgp.diagnostics import skipped_plots

    g = torch.Generator().manual_seed(0)
    X = torch.randn(20, D, generator=g, dtype=torch.float64)
    y = X.sum(-1) / math.sqrt(D)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    dt = to_datatree(model, guide, X, y, num_samples=5, seed=0)
    paths = plot_diagnostics(dt, tmp_path)
    assert set(paths) == {"variance", "predictive", "hyperparameters"}
    for path in paths.values():
        _check_png(path)
    assert skipped_plots(dt) == {"paths": "layer sample paths are curves against a 1-D input; "
                                          f"these inputs have {D} dims"}


def test_forest_plot_of_bayesian_hyperparameters(tmp_path):
    from tests.diagnostics.test_arviz import _double, _HandNoise

    model = _double(_HandNoise)
    X = torch.linspace(-1, 1, 12, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    with torch.no_grad():
        guide(X, y)
    dt = to_datatree(model, guide, X, y, num_samples=50, seed=0)
    _check_png(plot_hyperparameters(dt, tmp_path / "forest.png"))


@pytest.mark.parametrize("Guide", [dgp.guides.Coupled, dgp.guides.Chain])
def test_joint_guides_per_layer_kl_is_the_block_marginal_kl(Guide):
    """Per-layer KLs of a joint guide are its block marginals' KLs: they sum to at most the
    joint KL (the gap is the total correlation), with equality while the layers are
    uncorrelated (at initialisation)."""
    model, X, y = _model()
    guide = Guide(model)
    with torch.no_grad():
        guide(X)
    kl = layer_kl(model, guide, X)
    assert sum(kl.values()) == pytest.approx(float(guide.kl().detach()), rel=1e-9)
    dgp.fit(model, guide, X, y, num_steps=40, lr=0.05, progress=False)
    kl = layer_kl(model, guide, X)
    # reference: each block of the dense joint covariance against the layer's prior, by torch
    with torch.no_grad():
        mean, R, d, _ = guide.factor()
        cov = R @ R.mT + (torch.diag(d) if d is not None else 0)
        lo = 0
        for site in guide.layer_sites:
            D, M = site.shape
            n = D * M
            q = MultivariateNormal(mean[lo:lo + n], covariance_matrix=cov[lo:lo + n, lo:lo + n])
            prior = site.layer.prior().base_dist
            p = MultivariateNormal(prior.loc.reshape(-1),
                                   scale_tril=torch.block_diag(*prior.scale_tril.expand(D, M, M)))
            ref = float(kl_divergence(q, p))
            assert ref > 1e-3  # trained: not the initial point
            assert kl[site.name.rsplit(".", 1)[0]] == pytest.approx(ref, rel=1e-8)
            lo += n
    assert sum(kl.values()) <= float(guide.kl().detach()) + 1e-9


@pytest.mark.parametrize("Guide", [dgp.guides.Coupled, dgp.guides.Chain])
def test_joint_guides_per_layer_kl_survives_an_ill_conditioned_factor(Guide):
    """After 50 Adam steps, the first layer's block of the factor made nearly dependent: its
    covariance R_b R_b^T has a condition number beyond 1e16, where its Cholesky factor is
    meaningless in float64 (Adam from DSVI's start reached that by itself); the per-layer KL
    works from R_b itself. Known
    answer: the first block of a lower-triangular joint factor is its own Cholesky factor, so
    its log det is 2 sum log diag R[:n, :n]."""
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(-3, 3, 200, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=30)
    guide = Guide(model, inner_variance=1e-5)
    dgp.fit(model, guide, X, y, num_steps=50, progress=False)
    first = guide.layer_sites[0]
    n = first.shape.numel()
    with torch.no_grad():  # rows of the first block nearly dependent: tiny diagonal entries
        mean, R, _, _ = guide.factor()
        block = R[:n, :n].clone()
        block[1::2, 0] = 1e-2
        block.diagonal()[1::2] = 1e-9
        if Guide is dgp.guides.Coupled:
            R = R.clone()
            R[:n, :n] = block
            guide.set_joint(mean, R)
        else:
            guide.set_block(first, mean[:n], block)
        _, cov = guide.marginal(first)
        # far beyond 1 / eps: refactorising it is meaningless (it failed, trajectory permitting)
        assert float(torch.linalg.cond(cov)) > 1e16
        mean, R, _, _ = guide.factor()
        _, _, _, logdet = guide.marginal_factor(first)
        assert float(logdet) == pytest.approx(
            float(2 * R[:n, :n].diagonal().log().sum()), rel=1e-10)
        kl = layer_kl(model, guide, X)
        joint = float(guide.kl())
    assert all(math.isfinite(v) and v > 0 for v in kl.values())
    assert sum(kl.values()) <= joint + 1e-9
    dt = to_datatree(model, guide, X, y, num_samples=20, seed=0, grid=X[::10])
    assert [dt["layers"].attrs[f"{name}.kl"] for name in kl] == pytest.approx(list(kl.values()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_autoguide_per_layer_kl_survives_an_ill_conditioned_factor(dtype):
    """A completed AutoMultivariateNormal whose factor is ill-conditioned (two nearly
    collinear rows, as Adam makes them): the block covariance ``L_b L_b^T`` is far beyond
    ``1 / eps`` in condition number, and the per-layer KL used to refactorise it (a bare torch
    error naming no layer, or digits lost). It now works from the block's rows.
    Known answer: the first block of the lower-triangular joint factor is its own Cholesky
    factor, so its KL is torch's KL with that ``scale_tril``."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 2, generator=g, dtype=torch.float64)
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(64, generator=g, dtype=torch.float64)
    X, y = X.to(dtype), y.to(dtype)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8)
    inner = AutoMultivariateNormal(dgp.inducing_only(model))
    guide = dgp.complete(inner, model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False, seed=0)
    with torch.no_grad():
        U = inner.scale_tril.detach().clone()
        U[1, 0] = 1e4 if dtype == torch.float32 else 1e9
        inner.scale_tril = U
        post = inner.get_posterior()
        first = model.layers[0]
        n = first.output_dim * first.num_inducing
        # far beyond 1 / eps: refactorising L_b L_b^T is meaningless (it may or may not fail)
        cond = float(torch.linalg.cond(post.covariance_matrix[:n, :n].double()))
        assert cond > (1e12 if dtype == torch.float32 else 1e16), cond
        kl = layer_kl(model, guide, X)
        p = first.prior().base_dist
        D, M = p.loc.shape[-2:]
        prior = dist.MultivariateNormal(
            p.loc.reshape(-1), scale_tril=torch.block_diag(*p.scale_tril.expand(D, M, M)))
        block = dist.MultivariateNormal(post.loc[:n], scale_tril=post.scale_tril[:n, :n])
        ref = kl_divergence(block, prior)
    assert all(math.isfinite(v) for v in kl.values())
    assert kl["layer1"] == pytest.approx(float(ref), rel=1e-4 if dtype == torch.float32 else 1e-9)


def test_layer_summary_prints_every_column():
    """pandas shortens wide frames to the terminal ('...'); the summary prints whole."""
    import pandas as pd

    model, guide, X, y = _toy_fit("meanfield", steps=3)
    table = layer_summary(to_datatree(model, guide, X, num_samples=5))
    with pd.option_context("display.max_columns", 3, "display.width", 40):
        text = repr(table)
        assert "..." not in text
        for column in ("f_mean", "f_var", "prior_var", "var_ratio", "var_ratio_max", "kl"):
            assert column in text
        assert "..." not in repr(table[["kl", "f_var", "prior_var", "var_ratio"]])
