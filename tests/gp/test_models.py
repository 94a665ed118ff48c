"""The model gallery (``models/``): the closed forms its observation models use, each model
trained briefly on synthetic data with a known answer, and every guide family that fits a
model running on it.

Tolerances of the recovery tests: each model is trained for a few hundred steps only, so the
bounds are set where a model that learned nothing, or learned the wrong thing, fails by a
wide margin (the "nothing" figure is stated beside each bound), and a converged fit passes
with room for the optimisation left undone. The closed forms are checked to rounding against
quadrature, and the Monte Carlo checks by their standard errors.
"""

import ast
import math
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from scipy.stats import spearmanr

import models
import pyro_dgp as dgp
from models.observations import DiagonalNormal, HeteroscedasticNormal
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.infer.elbo import AnalyticKL_ELBO
from pyro_dgp.likelihoods import Likelihood
from pyro_dgp.likelihoods.marginal import SourceGaussian, importance_weights, record_source

DT = torch.float64
ROOT = Path(__file__).resolve().parents[2]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ the layout
def test_the_package_never_imports_the_gallery():
    bad = []
    for path in sorted((ROOT / "pyro_dgp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "models"]
    assert bad == []


def test_every_gallery_module_documents_its_sites_and_guides():
    for path in sorted((ROOT / "models").glob("*.py")):
        if path.name in ("__init__.py", "stack.py", "observations.py"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and ("Sites" in doc or "Model:" in doc), path.name
        assert "Guide" in doc, path.name


# ------------------------------------------------------------------- closed forms, exactly
def _gh(n=40):
    x, w = np.polynomial.hermite.hermgauss(n)
    return torch.tensor(x * math.sqrt(2), dtype=DT), torch.tensor(w / math.sqrt(math.pi), dtype=DT)


def test_poisson_closed_forms_equal_gauss_hermite():
    """``E log Poisson(y | e^f) = y m - exp(m + v/2) - log y!`` and the predictive moments,
    against the protocol's Gauss-Hermite defaults (exact to rounding for these smooth
    integrands at 20 nodes and v <= 1)."""
    lik = models.Poisson()
    y = torch.tensor([0.0, 1.0, 3.0, 7.0], dtype=DT)
    loc = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=DT)
    var = torch.tensor([0.05, 0.3, 1.0, 0.5], dtype=DT)
    assert torch.allclose(lik.expected_log_prob(y, loc, var),
                          Likelihood.expected_log_prob(lik, y, loc, var), atol=1e-10)
    for ours, quad in zip(lik.predictive_moments(loc, var),
                          Likelihood.predictive_moments(lik, loc, var), strict=True):
        assert torch.allclose(ours, quad, rtol=1e-9)
    offset = models.poisson.OffsetPoisson(0.7)  # exp(0.7 + f): the closed form of f + 0.7
    assert torch.allclose(offset.expected_log_prob(y, loc, var),
                          lik.expected_log_prob(y, loc + 0.7, var), atol=1e-12)
    with pytest.raises(ValueError, match="counts"):
        offset(torch.zeros(2, 1, dtype=DT), torch.tensor([1.0, -1.0], dtype=DT))


def _drawn(loc, var):
    """A draw of ``f ~ N(loc, var)`` carrying its Gaussian, as a guide hands it over."""
    f = loc + var.sqrt() * torch.randn(loc.shape, generator=_gen(1), dtype=DT)
    record_source(f, SourceGaussian(loc, var))
    return f


def test_heteroscedastic_expectation_equals_two_dimensional_gauss_hermite():
    """``E log N(y | f_1, s^2 e^{2 f_2})`` in closed form against a 40 x 40 product
    Gauss-Hermite rule (exact to rounding: polynomial in f_1, e^{-2 f_2} smooth)."""
    loc = torch.tensor([[0.3, -1.0], [-0.5, 0.2]], dtype=DT)
    var = torch.tensor([[0.2, 0.1], [0.05, 0.4]], dtype=DT)
    y, s = torch.tensor([0.1, 1.2], dtype=DT), torch.tensor(0.3, dtype=DT)
    closed = HeteroscedasticNormal(_drawn(loc, var), s).log_prob(y)
    x, w = _gh()
    f1 = loc[:, 0, None, None] + var[:, 0, None, None].sqrt() * x[:, None]
    f2 = loc[:, 1, None, None] + var[:, 1, None, None].sqrt() * x[None, :]
    lp = torch.distributions.Normal(f1, s * f2.exp()).log_prob(y[:, None, None])
    quad = (w[:, None] * w[None, :] * lp).sum((-2, -1))
    assert torch.allclose(closed, quad, atol=1e-9)
    f = _drawn(loc, var)
    at_draw = torch.distributions.Normal(f[:, 0], s * f[:, 1].exp()).log_prob(y)
    with importance_weights():  # each draw's own weight: log p(y | draw)
        assert torch.allclose(HeteroscedasticNormal(f, s).log_prob(y), at_draw)
    assert torch.allclose(HeteroscedasticNormal(f.clone(), s).log_prob(y), at_draw)


def test_diagonal_normal_expectation_and_shapes():
    loc = torch.tensor([[0.3, -1.0, 2.0]], dtype=DT)
    var = torch.tensor([[0.2, 0.1, 0.3]], dtype=DT)
    y, s = torch.tensor([[0.1, 1.2, 2.5]], dtype=DT), torch.tensor([0.3, 1.0, 0.5], dtype=DT)
    d = DiagonalNormal(_drawn(loc, var), s)
    assert d.batch_shape == (1,) and d.event_shape == (3,)
    exact = (-0.5 * torch.log(2 * math.pi * s**2) - ((y - loc) ** 2 + var) / (2 * s**2)).sum(-1)
    assert torch.allclose(d.log_prob(y), exact, atol=1e-12)
    assert d.expand((4, 1)).log_prob(y).shape == (4, 1)


# --------------------------------------------------------------------- data with an answer
def _regression_data(n=60, noise=0.1):
    g = _gen(0)
    X = torch.rand(n, 1, generator=g, dtype=DT) * 2 - 1
    return X, torch.sin(4 * X[:, 0]) + noise * torch.randn(n, generator=g, dtype=DT)


def _sectors(n, seed=0):
    """Three classes by the angle of a uniform point in [-1, 1]^2 (sectors of 120 degrees)."""
    X = 2 * torch.rand(n, 2, generator=_gen(seed), dtype=DT) - 1
    angle = torch.atan2(X[:, 1], X[:, 0]) + math.pi
    return X, (angle / (2 * math.pi / 3)).floor().clamp(max=2)


def _fit(model, guide, X, y, steps, lr=0.05):
    # the step counts below were measured at a constant rate
    return dgp.fit(model, guide, X, y, num_steps=steps, lr=lr, progress=False,
                   final_elbo_particles=0, lr_schedule="constant")


def _svi(model, guide, args, steps, lr=0.05, objective=None):
    svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), objective or Trace_ELBO())
    with pyro.validation_enabled(False):
        return [svi.step(*args) for _ in range(steps)]


# ------------------------------------------------------------------------------- recovery
def test_regression_recovers_the_function_and_the_noise():
    X, y = _regression_data()
    model = models.RegressionDGP(X, hidden=(1,), num_inducing=8)
    guide = dgp.guides.Coupled(model)
    _fit(model, guide, X, y, 150)
    grid = torch.linspace(-1, 1, 101, dtype=DT)[:, None]
    pred = dgp.predict(model, guide, grid, num_samples=32, seed=0)
    # a converged GP has an error of about noise * sqrt(dof / N) = 0.1 sqrt(8 / 60) = 0.04;
    # the zero function has 0.7 (sd of sin(4x) on [-1, 1])
    assert float((pred.mean - torch.sin(4 * grid[:, 0])).square().mean().sqrt()) < 0.1
    # the noise variance falls from its initial 0.1 towards the true 0.01 (0.055 after these
    # steps, 0.028 after 200); a fit that explains the signal as noise raises it to 0.5
    assert float(model.likelihood.variance) < 0.08


def test_probit_classifies_the_moons():
    data = dgp.datasets.classification_2d(n_train=100, n_test=200, seed=0)
    model = models.ProbitDGP(data.X_train, hidden=(2,), num_inducing=10)
    guide = dgp.guides.MeanField(model)
    _fit(model, guide, data.X_train, data.y_train, 150)
    pred = dgp.predict(model, guide, data.X_test, num_samples=32, seed=0)
    # the moons with input noise 0.1 are separable to about 99%; a linear rule gets 87%
    # (logistic regression on these data), chance 50%. 200 test points: one binomial
    # standard error at 0.95 is 1.5 points
    assert dgp.metrics.accuracy(pred, data.y_test) > 0.9


def test_multiclass_softmax_learns_three_sectors():
    X, y = _sectors(120)
    model = models.MulticlassDGP(X[:90], 3, hidden=(2,), num_inducing=8)
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    _fit(model, guide, X[:90], y[:90], 150)
    p = models.class_probabilities(guide, X[90:], num_samples=32)
    assert p.shape == (30, 3) and torch.allclose(p.sum(-1), torch.ones(30, dtype=DT))
    # the sectors are separable; chance is 1/3. 30 test points: 4 errors allowed
    assert float((p.argmax(-1) == y[90:]).double().mean()) > 0.86


def test_poisson_recovers_the_log_rate():
    X = torch.linspace(-1, 1, 100, dtype=DT)[:, None]
    log_rate = 1 + torch.sin(3 * X[:, 0])  # rates 0.4 to 7.4
    y = torch.poisson(log_rate.exp(), generator=_gen(0))
    model = models.PoissonDGP(X, hidden=(1,), num_inducing=8, log_rate=math.log(y.mean()))
    guide = dgp.guides.Chain(model)
    _fit(model, guide, X, y, 150)
    pred = dgp.predict(model, guide, X, num_samples=32, seed=0)
    error = float((pred.mean.log() - log_rate).square().mean().sqrt())
    # the constant rate (the best that learns nothing) has an error of 0.7; averaging about
    # 15 neighbouring counts of rate >= 1 gives a standard error of 1 / sqrt(15) = 0.26 on
    # the log scale at the lowest rates, much less at the high ones
    assert error < 0.25


def test_heteroscedastic_recovers_the_noise_level():
    """``pyro_dgp.datasets.heteroscedastic``: noise sd 0.05 + 0.225 (1 + x). A one-layer
    model (``hidden=()``) of the same class, which converges in the few steps here."""
    data = dgp.datasets.heteroscedastic(n_train=200, seed=0)
    model = models.HeteroscedasticDGP(data.X_train, hidden=(), num_inducing=10)
    guide = dgp.guides.MeanField(model)
    _fit(model, guide, data.X_train, data.y_train, 300)
    x = torch.tensor([[-0.8], [0.0], [0.8]], dtype=DT)
    ratio = models.noise_std(guide, x) / dgp.datasets.heteroscedastic_noise_std(x[:, 0])
    # about 200 * 0.5 / 2 = 50 points inform the noise near each x (a lengthscale of about
    # 0.5): the relative standard error of a standard deviation from n points is
    # 1 / sqrt(2 n) = 0.1; within a factor of 1.5 (log 1.5 = 0.41, four standard errors).
    # A constant noise (the homoscedastic fit) is off by a factor of 3 at x = -0.8
    assert ((ratio > 1 / 1.5) & (ratio < 1.5)).all(), ratio


def test_feature_map_model_learns_a_projection():
    """``y = sin(2 w.x)`` in 5-D: the network learns the direction ``w``, the GP the sine."""
    g = _gen(0)
    X = torch.randn(150, 5, generator=g, dtype=DT)
    w = torch.tensor([1.0, -1.0, 0.5, 0.0, 0.0], dtype=DT) / 1.5
    y = torch.sin(2 * X @ w) + 0.1 * torch.randn(150, generator=g, dtype=DT)
    torch.manual_seed(0)
    model = models.FeatureDGP(X[:100], feature_dim=1, num_inducing=10)
    guide = dgp.guides.MeanField(model)
    _fit(model, guide, X[:100], y[:100], 250, lr=0.02)
    pred = dgp.predict(model, guide, X[100:], num_samples=16, seed=0)
    # the predictor that learned nothing has 0.7 (sd of y)
    assert float((pred.mean - torch.sin(2 * X[100:] @ w)).square().mean().sqrt()) < 0.35


def test_multi_output_recovers_both_outputs():
    X = torch.linspace(-1, 1, 60, dtype=DT)[:, None]
    truth = torch.stack([torch.sin(3 * X[:, 0]), torch.cos(3 * X[:, 0])], -1)
    Y = truth + 0.05 * torch.randn(60, 2, generator=_gen(0), dtype=DT)
    model = models.MultiOutputDGP(X, 2, hidden=(1,), num_inducing=8)
    guide = dgp.guides.Chain(model)
    _svi(model, guide, (X, Y), 150, objective=AnalyticKL_ELBO())  # closed-form KLs
    mean = models.predictive_mean(guide, X)
    # each output's sd is 0.7; a converged fit is near 0.05 sqrt(8 / 60) = 0.02
    assert (mean - truth).square().mean(0).sqrt().max() < 0.15


def test_latent_inputs_recover_the_ordering_of_a_curve():
    """``y = (t, t^2, sin 2t) + noise``: the encoder's mean is monotone in ``t`` (a latent
    input is identified up to a monotone map; the Spearman correlation is invariant to it).
    The first principal component alone gives 0.99 here; an encoder that learned nothing
    gives 0 on average (random weights: about 0.1 in absolute value)."""
    t = 2 * torch.rand(80, generator=_gen(0), dtype=DT) - 1
    Y = torch.stack([t, t**2, torch.sin(2 * t)], -1)
    Y = Y + 0.05 * torch.randn(80, 3, generator=_gen(1), dtype=DT)
    torch.manual_seed(0)
    model = models.LatentInputDGP(Y, latent_dim=1, num_inducing=8)
    guide = models.LatentInputGuide(model, dgp.guides.MeanField(model.decoder))
    _svi(model, guide, (Y,), 150)
    loc, scale = guide.latent(Y)
    assert loc.shape == scale.shape == (80, 1)
    assert abs(spearmanr(loc[:, 0].detach().numpy(), t.numpy()).statistic) > 0.95


# ------------------------------------------------------------- every guide family runs
#: the families of ``pyro_dgp.guides.registry`` ("autonormal": a completed Pyro AutoNormal),
#: and the semi-implicit one
FAMILIES = ["meanfield", "coupled", "chain", "autonormal", "semi_implicit"]


def _guide(family, model):
    if family == "semi_implicit":
        return dgp.guides.SemiImplicit(model, num_mixing=4, noise_dim=3, hidden=(8,))
    return make_guide(family, model)


def _tiny(name, amortized=False):
    """``(model, arguments of model(*args))`` of one gallery model on 16 points, M = 3."""
    g = _gen(2)
    X = torch.rand(16, 2, generator=g, dtype=DT) * 2 - 1
    f = torch.sin(3 * X[:, 0]) * X[:, 1]
    kw = {"num_inducing": 3, "amortized": amortized}
    if name == "regression":
        return models.RegressionDGP(X, **kw), (X, f)
    if name == "probit":
        return models.ProbitDGP(X, **kw), (X, (f > 0).to(DT))
    if name == "multiclass":
        return models.MulticlassDGP(X, 3, **kw), (X, _sectors(16)[1])
    if name == "poisson":
        return models.PoissonDGP(X, **kw), (X, torch.poisson(f.exp(), generator=g))
    if name == "heteroscedastic":
        return models.HeteroscedasticDGP(X, **kw), (X, f)
    if name == "multi_output":
        return models.MultiOutputDGP(X, 2, **kw), (X, torch.stack([f, -f], -1))
    if name == "latent_input":
        Y = torch.stack([f, X[:, 0], X[:, 1]], -1)
        return models.LatentInputDGP(Y, latent_dim=2, hidden=(1,), **kw), (Y,)
    assert name == "feature_map" and not amortized
    torch.manual_seed(0)
    return models.FeatureDGP(X, num_inducing=3), (X, f)


MODELS = ["regression", "probit", "multiclass", "poisson", "heteroscedastic", "multi_output",
          "latent_input", "feature_map"]


def _runs(model, guide, args, objective, unused=()):
    """Two SVI steps, then every guide parameter (but those named in ``unused``) has a
    finite gradient."""
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), objective)
    assert all(math.isfinite(svi.step(*args)) for _ in range(2))
    loss = objective.differentiable_loss(model, guide, *args)
    named = [(n, p) for n, p in guide.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    missing = [n for (n, _), g in zip(named, grads, strict=True)
               if (g is None or not torch.isfinite(g).all()) and n not in unused]
    assert named and missing == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", MODELS)
def test_every_guide_family_runs_on_every_model(name, family):
    model, args = _tiny(name)
    if name == "latent_input":
        guide = models.LatentInputGuide(model, _guide(family, model.decoder))
    else:
        guide = _guide(family, model)
    with pyro.validation_enabled(False):
        _runs(model, guide, args, Trace_ELBO())


@pytest.mark.parametrize("name", [m for m in MODELS if m not in ("feature_map",
                                                                  "latent_input")])
def test_the_amortized_guide_runs_on_the_amortized_variants(name):
    model, args = _tiny(name, amortized=True)
    guide = dgp.guides.Amortized(model, rule="AR2P", num_paths=3)
    # the last layer's quadrature nodes are not used where its f is integrated analytically
    _runs(model, guide, args, dgp.AmortizedELBO(), unused=("nodes.layer2_unconstrained",))


def test_latent_input_guide_names_a_layer_guide_of_another_model():
    model, _ = _tiny("latent_input")
    with pytest.raises(ValueError, match="model.decoder"):
        models.LatentInputGuide(model, dgp.guides.MeanField(_tiny("regression")[0]))
