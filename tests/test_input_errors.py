"""Constructors and entry points reject bad settings with a message naming the problem, and
modules built on their own keep their own parameters, dtype and device."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp import kernels as K
from pyro_dgp.guides import Chain, Coupled, MeanField
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.likelihoods import Gaussian, StudentT
from pyro_dgp.prediction import MixturePredictive

DT = torch.float64


@pytest.fixture
def data():
    X = torch.linspace(-1, 1, 20, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X.squeeze(-1))


def _layer(**kw):
    return dgp.GPLayer(1, 1, inducing_points=torch.zeros(3, 1, dtype=DT), **kw)


# ------------------------------------------------------------------ 1. unique Pyro names
def test_top_level_layers_keep_their_own_parameters():
    X = torch.randn(6, 2)
    l1 = dgp.GPLayer(2, 2, inducing_points=torch.randn(4, 2), name="a",
                     kernel=K.RBF(2, lengthscale=0.3))
    l2 = dgp.GPLayer(2, 1, inducing_points=torch.randn(4, 2) + 5, name="b",
                     kernel=K.RBF(2, lengthscale=7.0))
    Z1, Z2 = l1.inducing_points.detach().clone(), l2.inducing_points.detach().clone()

    def model(X, y=None):
        f = l2(l1(X))
        with pyro.plate("obs", X.shape[0], dim=-1):
            pyro.sample("y", dist.Normal(f[..., 0], 0.1), obs=y)

    trace = pyro.poutine.trace(model).get_trace(X)
    assert {"a.u", "a.f", "b.u", "b.f"} <= set(trace.nodes)
    Trace_ELBO().loss(model, MeanField(model), X, torch.randn(6))
    assert torch.equal(l1.inducing_points, Z1) and torch.equal(l2.inducing_points, Z2)
    assert torch.allclose(l1.kernel.lengthscale, torch.tensor(0.3))
    assert torch.allclose(l2.kernel.lengthscale, torch.tensor(7.0))
    keys = list(pyro.get_param_store().keys())
    assert sum(k.endswith("inducing_points") for k in keys) == 2  # one each, not shared


def test_bare_kernels_and_likelihoods_do_not_share_parameters():
    X = torch.tensor([[0.0], [1.0]])
    k1, k2 = K.RBF(1, lengthscale=0.5), K.RBF(1, lengthscale=2.0)
    assert math.isclose(k1(X)[0, 1].item(), math.exp(-2), rel_tol=1e-6)
    assert math.isclose(k2(X)[0, 1].item(), math.exp(-1 / 8), rel_tol=1e-6)
    g1, g2 = Gaussian(0.01), Gaussian(1.0)
    f = torch.zeros(3, 1)
    with pyro.plate("data", 3, dim=-1):
        g1(f)
        g2(f, name="y2")
    assert math.isclose(g2.variance.item(), 1.0, rel_tol=1e-6)


def test_modules_inside_parents_keep_their_names(data):
    X, y = data
    model = dgp.DeepGP.regression(X, y, num_inducing=5, name="m")
    pyro.poutine.trace(model).get_trace(X, y)
    names = set(pyro.get_param_store().keys())
    assert {"m.layers.0.inducing_points", "m.layers.0.kernel.kernels.0.lengthscale",
            "m.layers.1.kernel.variance", "m.likelihood.variance"} <= names

    class Warp(PyroModule):
        def __init__(self):
            super().__init__()
            self.enc = _layer()

        def forward(self, X):
            return self.enc(X)

    warp = Warp()
    trace = pyro.poutine.trace(warp).get_trace(X)
    assert "enc.u" in trace.nodes and warp.enc.name == "enc"
    assert _layer().name == "gp" and _layer(name="a").name == "a"


# ------------------------------------------------------------------ 2. dtype and device
def test_parameters_follow_the_dtype_of_their_tensors():
    Z = torch.randn(4, 2, dtype=DT)
    layer = dgp.GPLayer(2, 3, inducing_points=Z, mean=torch.randn(2, 3))  # float32 W
    assert layer.kernel.lengthscale.dtype == DT and layer.kernel.variance.dtype == DT
    assert layer.mean_weight.dtype == DT
    assert layer(torch.randn(5, 2, dtype=DT)).dtype == DT
    v = torch.tensor(2.0, dtype=DT)
    assert K.RBF(2, variance=v).variance.dtype == DT
    assert K.Periodic(2, period=torch.ones(2, dtype=DT)).period.dtype == DT
    assert Gaussian(v).variance.dtype == DT
    assert StudentT(scale=v).scale.dtype == DT
    # Python numbers: torch's default dtype, as before
    assert K.RBF(2, variance=2.0).variance.dtype == torch.get_default_dtype()
    assert Gaussian(0.1).variance.dtype == torch.get_default_dtype()
    # ... and a layer moves its kernel, a model its likelihood, to the inducing inputs' dtype
    layer = dgp.GPLayer(2, 1, inducing_points=Z, kernel=K.RBF(2))
    model = dgp.DeepGP([layer], Gaussian(0.1))
    assert {p.dtype for p in model.parameters()} == {DT}


def test_fit_names_every_parameter_of_another_dtype():
    X = torch.linspace(-1, 1, 12, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=1, num_inducing=4)
    model.likelihood.to(torch.float32)  # the first parameter (inducing inputs) is still DT
    with pytest.raises(ValueError, match="likelihood"):
        dgp.fit(model, MeanField(model), X, X[:, 0], num_steps=1, progress=False)


# ------------------------------------------------------------------ 3. predict
def test_predict_rejects_a_guide_of_another_model(data):
    X, y = data
    a = dgp.DeepGP.regression(X, y, num_inducing=5)
    b = dgp.DeepGP.regression(X, -y, num_inducing=5)
    guide = MeanField(a)
    guide(X, y)
    with pytest.raises(ValueError, match="predict: the guide MeanField was built for the model"):
        dgp.predict(b, guide, X, num_samples=2)


# ------------------------------------------------------------------ 4, 5. DeepGP arguments
@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: dgp.DeepGP([K.RBF(1)], Gaussian()), TypeError,
         "DeepGP: layers must be GPLayer instances, got RBF at position 0"),
        (lambda: dgp.DeepGP(_layer(), Gaussian()), TypeError, "single GPLayer"),
        (lambda: dgp.DeepGP([_layer()], "gaussian"), TypeError,
         "DeepGP: likelihood must be a pyro_dgp.likelihoods.Likelihood, got str"),
        (lambda: dgp.DeepGP([_layer()], Gaussian(), num_data=0), ValueError,
         "DeepGP: num_data must be a positive integer, got 0"),
        (lambda: dgp.DeepGP([_layer()], Gaussian(), num_data=-5), ValueError, "num_data"),
        (lambda: dgp.DeepGP([_layer()], Gaussian(), num_data=2.5), ValueError, "num_data"),
        (lambda: dgp.DeepGP([_layer()], Gaussian(), num_data="10"), TypeError, "num_data"),
    ],
)
def test_deep_gp_checks_its_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"likelihood": 3}, TypeError, "likelihood must be one of .* or a pyro_dgp"),
        ({"likelihood": "studentt", "noise_variance": -0.01}, ValueError,
         "DeepGP.regression: noise_variance must be positive and finite, got -0.01"),
        ({"noise_variance": math.inf}, ValueError, "noise_variance must be positive and finite"),
        ({"seed": -1}, ValueError, "seed must be a non-negative integer, got -1"),
        ({"seed": 1.5}, ValueError, "seed must be a non-negative integer"),
    ],
)
def test_regression_checks_its_settings(data, kwargs, error, match):
    with pytest.raises(error, match=match):
        dgp.DeepGP.regression(*data, num_inducing=5, **kwargs)


# ------------------------------------------------------------------ 6. guides
@pytest.mark.parametrize("guide", [MeanField, Coupled, Chain])
@pytest.mark.parametrize("model", ["bogus", None])
def test_guides_reject_a_non_callable_model(guide, model):
    with pytest.raises(TypeError, match=f"{guide.__name__}: model must be a callable"):
        guide(model)


def test_make_guide_with_swapped_arguments(data):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(TypeError, match="make_guide: name must be a str") as exc:
        make_guide(model, "meanfield")
    assert "GPLayer(" not in str(exc.value)


# ------------------------------------------------------------------ 7. PCA with N < hidden
def test_regression_with_fewer_points_than_hidden_dims():
    X, y = torch.randn(8, 12, dtype=DT), torch.randn(8, dtype=DT)
    model = dgp.DeepGP.regression(X, y, hidden_dim=10, num_inducing=5)
    W = model.layers[0].mean_weight
    assert W.shape == (12, 10) and torch.equal(W[:, 8:], torch.zeros(12, 2, dtype=DT))
    f = model.layers[0].mean_function(X)
    assert torch.isfinite(f).all()
    guide = MeanField(model)
    assert math.isfinite(Trace_ELBO().loss(model, guide, X, y))


# ------------------------------------------------------------------ 8. inf
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: K.RBF(2, variance=math.inf), "RBF: variance"),
        (lambda: K.RBF(2, lengthscale=math.inf), "RBF: lengthscale"),
        (lambda: K.Periodic(2, period=math.inf), "Periodic: period"),
        (lambda: K.White(2, variance=math.inf), "White: variance"),
        (lambda: Gaussian(math.inf), "Gaussian: variance"),
        (lambda: StudentT(scale=math.inf), "StudentT: scale"),
        (lambda: StudentT(df=math.inf), "StudentT: df"),
        (lambda: _layer(jitter=math.inf), "GPLayer: jitter"),
    ],
)
def test_inf_settings_are_rejected(make, match):
    with pytest.raises(ValueError, match=f"{match} must be positive and finite, got inf"):
        make()


@pytest.mark.parametrize("guide", [MeanField, Coupled, Chain])
def test_inf_inner_variance_is_rejected(data, guide):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(ValueError, match=f"{guide.__name__}: inner_variance must be positive "
                                         "and finite, got inf"):
        guide(model, inner_variance=math.inf)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"y_std": math.inf}, "predict: y_std must be positive and finite, got inf"),
     ({"y_mean": math.nan}, "predict: y_mean must be finite, got nan")],
)
def test_predict_rejects_non_finite_units(data, kwargs, match):
    X, y = data
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    with pytest.raises(ValueError, match=match):
        dgp.predict(model, MeanField(model), X, num_samples=2, **kwargs)


# ------------------------------------------------------------------ 10. hyperparameter shapes
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: K.RBF(2, lengthscale=[1.0, 2.0, 3.0]),
         r"RBF: lengthscale must be a scalar or of shape \(2,\), got shape \(3,\)"),
        (lambda: K.Periodic(2, period=[1.0, 2.0, 3.0]), r"Periodic: period must be a scalar"),
        (lambda: K.RBF(2, lengthscale=[1.0, 2.0], ard=False),
         r"lengthscale must be a scalar \(ard=False\), got shape \(2,\)"),
        (lambda: K.RBF(2, variance=[1.0, 2.0]), r"RBF: variance must be a scalar"),
        (lambda: Gaussian(torch.tensor([0.1, 0.2])), r"Gaussian: variance must be a scalar"),
    ],
)
def test_hyperparameter_shapes_are_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_scalar_and_ard_hyperparameters_still_accepted():
    assert K.RBF(2, lengthscale=[1.0, 2.0]).lengthscale.shape == (2,)
    assert K.RBF(2, lengthscale=1.5).lengthscale.shape == (2,)
    assert K.RBF(2, lengthscale=1.5, ard=False).lengthscale.shape == ()
    assert K.RBF(2, variance=torch.tensor([2.0])).variance.shape == ()


# ------------------------------------------------------------------ 11. integer settings
@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: dgp.GPLayer(2, 1, inducing_points=torch.zeros(0, 2)), ValueError,
         "at least one row"),
        (lambda: dgp.GPLayer(2, 1, num_inducing=2.5), ValueError,
         "GPLayer: num_inducing must be a positive integer, got 2.5"),
        (lambda: dgp.GPLayer(2, 1, num_inducing="4"), TypeError, "num_inducing"),
        (lambda: dgp.GPLayer(2, 1, num_inducing=math.nan), ValueError, "num_inducing"),
        (lambda: dgp.GPLayer(2, 1, num_inducing=True), TypeError, "num_inducing"),
        (lambda: dgp.GPLayer(2, 1, num_inducing=10, inducing_points=torch.randn(4, 2)),
         ValueError, "num_inducing=10 but inducing_points has 4 rows"),
        (lambda: K.RBF(2.5), ValueError, "RBF: input_dim must be a positive integer, got 2.5"),
    ],
)
def test_integer_settings_are_not_truncated(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("rank, error", [(2.5, ValueError), (True, TypeError),
                                         ("a", TypeError), (math.nan, ValueError)], ids=repr)
def test_coupled_rank_must_be_a_positive_integer(data, rank, error):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(error, match="Coupled: rank must be a positive integer"):
        Coupled(model, rank=rank)


# ------------------------------------------------------------------ 12. minor
def test_layer_mean_and_kernel_are_checked():
    Z, X = torch.randn(4, 2, dtype=DT), torch.randn(6, 2, dtype=DT)
    with pytest.raises(ValueError, match="GPLayer: mean contains 4 NaN or inf"):
        dgp.GPLayer(2, 2, inducing_points=Z, mean=torch.full((2, 2), math.nan, dtype=DT))
    with pytest.raises(TypeError, match="GPLayer: kernel must be a pyro_dgp.kernels.Kernel"):
        dgp.GPLayer(2, 1, inducing_points=Z, kernel="rbf")
    layer = dgp.GPLayer(2, 2, inducing_points=Z, mean=lambda x: x[..., :3, :])
    with pytest.raises(ValueError, match=r"mean callable returned shape \(3, 2\) for inputs "
                                         r"of shape \(6, 2\)"):
        layer(X)


def test_mixture_predictive_checks_draws_and_variances():
    lik = Gaussian(0.1)
    with pytest.raises(ValueError, match=r"at least one draw \(S >= 1\)"):
        MixturePredictive(torch.zeros(0, 4), torch.zeros(0, 4), lik)
    with pytest.raises(ValueError, match="var must be non-negative"):
        MixturePredictive(torch.zeros(2, 4), -torch.ones(2, 4), lik)


def test_complete_and_inducing_only_need_callables():
    X = torch.linspace(-1, 1, 10, dtype=torch.float64).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=1, num_inducing=4)
    with pytest.raises(TypeError, match="inducing_only: model must be a callable"):
        dgp.inducing_only("model")
    with pytest.raises(TypeError, match="complete: guide must be a callable"):
        dgp.complete(None, model)


@pytest.mark.parametrize("scale, offset, warns", [
    (1.0, 0.0, False), (1e6, 0.0, True), (1e-6, 0.0, True), (1.0, 50.0, True)])
def test_regression_warns_on_unstandardised_targets(scale, offset, warns):
    """The defaults (noise variance 0.01, kernel variance 2, zero-mean last layer) assume
    standardised targets: raw-scale targets train to badly calibrated predictions without a
    word, so it says so, naming y's statistics."""
    import warnings

    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 2, generator=g, dtype=torch.float64)
    y = torch.randn(40, generator=g, dtype=torch.float64) * scale + offset
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    hits = [w for w in seen if "assume standardised data" in str(w.message)]
    assert bool(hits) == warns
    if warns:
        assert "y has mean" in str(hits[0].message)


def test_regression_warns_on_inputs_far_from_the_origin():
    import warnings

    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 2, generator=g, dtype=torch.float64) + 1e4
    y = torch.randn(40, generator=g, dtype=torch.float64)
    with pytest.warns(UserWarning, match="X has columns with"):
        dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    with warnings.catch_warnings():  # probit labels are 0/1: only X is checked
        warnings.simplefilter("error")
        dgp.DeepGP.regression(X - 1e4, (y > 0).double(), num_layers=1, num_inducing=5,
                              likelihood="probit")


# ------------------------------------------------- errors inside a Pyro trace (user's first)
class _BadScale(PyroModule):
    """A hand-written model whose likelihood has a negative scale (the user's error)."""

    def __init__(self):
        super().__init__()
        self.g = dgp.GPLayer(1, 1, inducing_points=torch.linspace(-1, 1, 4,
                                                                  dtype=torch.float64)[:, None])

    def forward(self, x, y=None):
        f = self.g(x).squeeze(-1)
        with pyro.plate("data", x.shape[-2]):
            return pyro.sample("y", pyro.distributions.Normal(f, -0.1), obs=y)


@pytest.mark.parametrize("entry", ["fit", "predict_like", "elbo"])
def test_error_inside_a_trace_reaches_the_user_unwrapped(entry):
    """Pyro re-raises an error inside a trace with the trace's shape table appended (once per
    nested trace); the public entry points re-raise the user's own error, the table kept as a
    note."""
    X = torch.linspace(-1, 1, 10, dtype=torch.float64)[:, None]
    y = X[:, 0].clone()
    model = _BadScale()
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError) as err:
        if entry == "fit":
            dgp.fit(model, guide, X, y, num_steps=2, progress=False)
        elif entry == "elbo":
            dgp.evaluate_elbo(model, guide, X, y, num_particles=2)
        else:
            dgp.to_datatree(model, guide, X, y, num_samples=3, seed=0)
    message = str(err.value)
    assert message.startswith("Expected parameter scale")
    assert "Trace Shapes" not in message  # the table is a note, not the message
    assert err.value.__cause__ is None
    notes = getattr(err.value, "__notes__", [])
    assert len(notes) == 1 and "Trace Shapes" in notes[0] and "g.u" in notes[0]


def test_unwrap_leaves_other_errors_alone():
    from pyro_dgp.errors import unwrap_trace_error

    inner = ValueError("bad")
    outer = ValueError("bad\nsomething else")
    outer.__cause__ = inner
    assert unwrap_trace_error(outer) is outer
    assert unwrap_trace_error(inner) is inner
