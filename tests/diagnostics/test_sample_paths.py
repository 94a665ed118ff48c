"""Sample paths: ``to_datatree(..., grid=...)`` draws each layer's ``f`` jointly over the grid
from one draw of ``q(U)``, so a drawn path is one function's values (smooth for smooth
kernels), for every guide; a collapsed estimator's per-point draws are not."""

import math
import warnings

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoMultivariateNormal

import pyro_dgp as dgp
from pyro_dgp.diagnostics import plot_layer_paths
from pyro_dgp.diagnostics.export import to_datatree
from pyro_dgp.guides.draws import trace_draws


def _fit(guide_name: str, steps: int = 60):
    split = dgp.datasets.compositional_toy(n_train=41, seed=0)
    X, y = split.X_train, split.y_train
    pyro.clear_param_store()
    # no between-layer white noise: it would make the composition rough by design
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=15, inner_noise=1e-12)
    if guide_name == "autoguide":
        guide = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    elif guide_name == "sampled":
        guide = dgp.guides.MeanField(model, collapsed=False)
    else:
        guide = getattr(dgp.guides, guide_name)(model)
    dgp.fit(model, guide, X, y, num_steps=steps, lr=0.01, progress=False, seed=0)
    return model, guide, X, y


def _roughness(dt, lname: str) -> tuple[float, float]:
    """``(RMS second difference of the drawn values along the grid, RMS per-point sd)``."""
    f = dt["layers"][f"{lname}.f"].values[0]  # (draw, grid, unit)
    second = f[:, 2:] - 2 * f[:, 1:-1] + f[:, :-2]
    sd = dt["layers"][f"{lname}.f"].values[0].std(0)
    return float((second**2).mean() ** 0.5), float((sd**2).mean() ** 0.5)


@pytest.mark.parametrize("guide_name", ["MeanField", "sampled", "Coupled", "Chain", "autoguide"])
def test_grid_draws_are_smooth_paths(guide_name):
    """On a grid of spacing h = 1/100 an RBF path's second difference is ~ h^2 f'' (about
    1e-3 of its sd for lengthscales above 0.3), while independent per-point draws give
    sqrt(6) sd. Each layer's draws must be paths: second difference below 5% of the
    posterior sd (per-point draws fail by a factor ~50)."""
    model, guide, X, y = _fit(guide_name)
    grid = torch.linspace(-1, 1, 201, dtype=X.dtype).unsqueeze(-1)
    dt = to_datatree(model, guide, X, y, num_samples=30, grid=grid, seed=0)
    assert dt["layers"].attrs["sample_paths"] == 1
    for lname in ("layer1", "layer2"):
        rough, sd = _roughness(dt, lname)
        assert rough < 0.05 * sd, (lname, rough, sd)
    # without paths, the collapsed guide draws per point on the grid (the failure fixed here)
    per_point = to_datatree(model, guide, X, y, num_samples=30, grid=grid, seed=0, paths=False)
    assert per_point["layers"].attrs["sample_paths"] == 0
    if guide_name == "MeanField":  # collapsed: f per point from its marginal
        rough_pp, sd_pp = _roughness(per_point, "layer2")
        assert rough_pp > 1.0 * sd_pp


def test_path_draws_have_the_guides_joint_law():
    """Known answer, one whitened layer: with ``q(v) = N(m, S)`` the paths at ``x`` are
    ``N(A^T m, K_xx - A^T A + A^T S A)``, ``A = L^-1 K_Zx``. Empirical mean and covariance of
    4000 paths at 5 points agree within 5 Monte Carlo standard errors."""
    torch.manual_seed(0)
    X = torch.linspace(-1, 1, 20, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(3 * X[:, 0])
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4, lengthscale=0.7)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    M = 4
    m = torch.randn(M, dtype=X.dtype)
    B = torch.randn(M, M, dtype=X.dtype)
    S = B @ B.mT / M + 0.1 * torch.eye(M, dtype=X.dtype)
    guide.set_q(dist := torch.distributions.MultivariateNormal(m, S), layer="layer1")
    layer = model.layers[0]
    x = torch.tensor([[-0.9], [-0.3], [0.0], [0.35], [0.8]], dtype=X.dtype)
    with torch.no_grad():
        L = layer.kzz_cholesky()
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, x), upper=False)
        mean = A.mT @ dist.loc + layer.mean_function(x)[:, 0]
        cov = layer.kernel(x) - A.mT @ A + A.mT @ S @ A
    n = 4000
    pyro.set_rng_seed(1)
    with torch.no_grad():
        trace = trace_draws(guide, (x,), n, paths=True)
    f = trace.nodes["layer1.f"]["value"][..., 0]  # (n, 5)
    se_mean = (cov.diagonal() / n).sqrt()
    assert ((f.mean(0) - mean).abs() <= 5 * se_mean).all()
    emp = torch.cov(f.mT)
    # SE of a sample covariance of Gaussians: sqrt((s_ij^2 + s_ii s_jj) / n)
    se_cov = ((cov**2 + cov.diagonal()[:, None] * cov.diagonal()[None, :]) / n).sqrt()
    assert ((emp - cov).abs() <= 5 * se_cov).all()
    # and the off-diagonal correlation is the point: per-point draws have none
    assert float(cov[2, 3] / (cov[2, 2] * cov[3, 3]).sqrt()) > 0.5
    assert math.isclose(float(emp[2, 3] / (emp[2, 2] * emp[3, 3]).sqrt()),
                        float(cov[2, 3] / (cov[2, 2] * cov[3, 3]).sqrt()), abs_tol=0.05)


def test_plot_of_per_point_draws_warns(tmp_path):
    model, guide, X, y = _fit("MeanField", steps=5)
    dt = to_datatree(model, guide, X, y, num_samples=10, seed=0)  # at X, default: per point
    assert dt["layers"].attrs["sample_paths"] == 0
    with pytest.warns(UserWarning, match="not as sample paths"):
        plot_layer_paths(dt, tmp_path / "p.png")
    paths = to_datatree(model, guide, X, y, num_samples=10, seed=0, paths=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plot_layer_paths(paths, tmp_path / "q.png")


def test_sample_paths_need_a_layer_guide():
    with pytest.raises(TypeError, match="layer guide"):
        with dgp.guides.sample_paths(lambda *a: None):
            pass
