"""The model builders (``DeepGP.regression``, ``DeepGP.classification``, ``DeepGP``) and the
layers (``GPLayer``) given bad data or settings: a clear error naming the argument, warnings
that name what to do, and the inputs a user meets early (scale, labels, small data sets,
half precision, duplicated inputs) handled or refused."""

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from bad_input_data import line_data, sine_data, untrained_meanfield
from pyro.infer import Trace_ELBO
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp import kernels as K
from pyro_dgp.gp.architectures import kmeans
from pyro_dgp.guides import MeanField
from pyro_dgp.likelihoods import Gaussian, StudentT

DT = torch.float64


@pytest.fixture
def data():
    return line_data()


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda X, y: (X, y[:-1]), "same number of data points"),
        (lambda X, y: (X.squeeze(-1), y), r"shape \(N, D\)"),
        (lambda X, y: (torch.where(X > 0.5, torch.nan, X), y), "NaN or inf"),
        (lambda X, y: (X, torch.where(y > 0.5, torch.inf, y)), "NaN or inf"),
        (lambda X, y: (X, y.unsqueeze(-1)), r"1-D of shape \(N,\)"),
    ],
)
def test_regression_rejects_bad_data(data, change, match):
    X, y = change(*data)
    with pytest.raises(ValueError, match=match):
        dgp.DeepGP.regression(X, y, num_inducing=5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_inducing": 0}, "num_inducing must be a positive integer"),
        ({"num_inducing": -3}, "num_inducing must be a positive integer"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"hidden_dim": 0}, "hidden_dim must be a positive integer"),
        ({"kernel": "cosine"}, "kernel must be one of"),
        ({"likelihood": "poisson"}, "likelihood must be one of"),
        ({"noise_variance": -1.0}, "variance must be positive"),
        ({"lengthscale": 0.0}, "must be positive"),
    ],
)
def test_regression_rejects_bad_settings(data, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dgp.DeepGP.regression(*data, **{"num_inducing": 5, **kwargs})


def test_probit_labels_must_be_binary(data):
    X, _ = data
    y = torch.tensor([0.0, 1.0, 2.0] + [0.0] * 17, dtype=DT)
    with pytest.raises(ValueError, match=r"binary labels must be 0 or 1, found \[2.0\]"):
        dgp.DeepGP.classification(X, y, num_inducing=5)
    model = dgp.DeepGP.classification(X, (y > 0).to(DT), num_inducing=5)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="binary labels"):
        dgp.fit(model, guide, X, y - 1, num_steps=1, progress=False)


def test_every_entry_point_rejects_inputs_of_another_dtype_naming_the_layer(data):
    """predict, to_datatree and a hand-written model built in the default float32 all meet
    float64 data (or the reverse) with an error naming the layer, not a matmul error."""
    X, y = data
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    match = "layer 'layer1' holds torch.float64 parameters on cpu but its input is torch.float32"
    with pytest.raises(ValueError, match=match):
        dgp.predict(model, guide, X.float(), num_samples=2)
    with pytest.raises(ValueError, match=match):
        dgp.to_datatree(model, guide, X.float(), y.float(), num_samples=2)
    layer = dgp.GPLayer(1, 1, inducing_points=torch.zeros(3, 1), name="warp")  # float32
    with pytest.raises(ValueError, match="layer 'warp' holds torch.float32"):
        dgp.DeepGP([layer], dgp.likelihoods.Gaussian())(X, y)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_dim": 0, "output_dim": 1, "num_inducing": 3}, "input_dim must be a positive"),
        ({"input_dim": 1, "output_dim": 1, "num_inducing": 0}, "num_inducing must be a positive"),
        ({"input_dim": 2, "output_dim": 1, "inducing_points": torch.zeros(3, 1)},
         r"inducing_points must have shape \(M, 2\)"),
        ({"input_dim": 2, "output_dim": 3, "num_inducing": 3, "mean": "identity"},
         "mean='identity' needs input_dim == output_dim"),
        ({"input_dim": 1, "output_dim": 1, "num_inducing": 3, "jitter": 0.0},
         "jitter must be positive"),
    ],
)
def test_gp_layer_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dgp.GPLayer(**kwargs)


def test_cholesky_failure_names_the_layer():
    Z = torch.zeros(4, 1, dtype=DT)  # identical inducing points: K_ZZ has rank one
    layer = dgp.GPLayer(1, 1, inducing_points=Z, name="warp").to(DT)
    with torch.no_grad():
        layer.kernel.variance = torch.tensor(-1.0, dtype=DT)  # negative definite
    with pytest.raises(dgp.CholeskyError, match="layer 'warp'"):
        layer.kzz_cholesky()


def test_near_singular_kzz_warns_and_recovers_with_more_jitter():
    # 200 inducing points on [0, 1] under an RBF of lengthscale 1: K_ZZ has eigenvalues ~ -1e-14
    Z = torch.linspace(0, 1, 200, dtype=DT).unsqueeze(-1)
    layer = dgp.GPLayer(1, 1, inducing_points=Z, name="warp", jitter=1e-16).to(DT)
    with pytest.warns(dgp.NumericalWarning, match="layer 'warp'"):
        L = layer.kzz_cholesky()
    assert torch.isfinite(L).all()


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 2.5, "3"], ids=repr)
def test_model_names_num_inducing_for_values_int_cannot_take(data, value):
    """(``None`` is the default: ``min(100, N)``, test_default_num_inducing_is_at_most_the_data.)"""
    with pytest.raises((TypeError, ValueError), match="num_inducing must be a positive integer"):
        dgp.DeepGP.regression(*data, num_inducing=value)


def _layer(**kw):
    return dgp.GPLayer(1, 1, inducing_points=torch.zeros(3, 1, dtype=DT), **kw)


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


def test_regression_with_fewer_points_than_hidden_dims():
    X, y = torch.randn(8, 12, dtype=DT), torch.randn(8, dtype=DT)
    model = dgp.DeepGP.regression(X, y, hidden_dim=10, num_inducing=5)
    W = model.layers[0].mean_weight
    assert W.shape == (12, 10) and torch.equal(W[:, 8:], torch.zeros(12, 2, dtype=DT))
    f = model.layers[0].mean_function(X)
    assert torch.isfinite(f).all()
    guide = MeanField(model)
    assert math.isfinite(Trace_ELBO().loss(model, guide, X, y))


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


def _standardise_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-2, 1e-3, 1e-6])
def test_inputs_on_a_small_scale_are_warned_about(scale, dtype):
    """Along a column of standard deviation 0.01 the starting lengthscale ln 2 sees a
    constant: 1,000 steps fit the constant mean (NLL ~1.0 on a sine); it says so."""
    X, y = sine_data(dtype=dtype)
    X = torch.cat([X, X * scale], -1)
    msgs = _standardise_warnings(lambda: dgp.DeepGP.regression(X, y, num_inducing=10))
    hits = [m for m in msgs if "assume standardised data" in m]
    assert len(hits) == 1
    assert "column(s) [1] have a standard deviation below 0.1" in hits[0]
    assert "standardise them" in hits[0]


def test_standardised_and_moderately_scaled_inputs_are_not_warned_about():
    X, y = sine_data()
    for scale in (1.0, 0.3, 0.3 / X.std().item()):
        msgs = _standardise_warnings(lambda s=scale: dgp.DeepGP.regression(X * s, y,
                                                                           num_inducing=10))
        assert not msgs, (scale, msgs)


def test_constant_columns_are_not_warned_about():
    """A constant column is harmless to the kernel and the mean (naval's standardised splits
    hold two): no warning, the small-spread one included."""
    X, y = sine_data(D=2)
    X = torch.cat([X[:, :1], torch.zeros_like(X[:, :1]), X[:, 1:]], -1)
    assert _standardise_warnings(lambda: dgp.DeepGP.regression(X, y, num_inducing=10)) == []


def test_large_inputs_are_warned_about_in_float32():
    """In float32 at X * 1e6 the fit diverges (TrainingDivergedError): the build has said
    why before."""
    X, y = sine_data(dtype=torch.float32)
    with pytest.warns(UserWarning, match="X has columns with .* standardise them"):
        dgp.DeepGP.regression(X * 1e6, y, num_inducing=10)


@pytest.mark.parametrize("as_labels", [lambda y: y.long(), lambda y: y.bool(),
                                       lambda y: y.to(torch.uint8)])
def test_classification_takes_integer_and_boolean_labels(as_labels):
    X, _ = sine_data(N=30, D=2)
    y = (X[:, 0] > 0).to(DT)
    model = dgp.DeepGP.classification(X, as_labels(y), num_inducing=6)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, X, as_labels(y), num_steps=2, progress=False,
                     final_elbo_particles=0)
    assert np.isfinite(result.losses).all()
    with pytest.raises(ValueError, match=r"binary labels must be 0 or 1, found \[2.0\]"):
        dgp.DeepGP.classification(X, 2 * y.long(), num_inducing=6)


def test_regression_still_refuses_integer_targets():
    X, y = sine_data()
    with pytest.raises(TypeError, match="y must be a floating-point tensor, got dtype "
                                        "torch.int64"):
        dgp.DeepGP.regression(X, y.round().long(), num_inducing=5)


@pytest.fixture
def fitted():
    return untrained_meanfield()


@pytest.mark.parametrize("option", ["whiten", "ard", "train_mean"])
@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_boolean_options_must_be_bools(option, value):
    X, y = sine_data()
    with pytest.raises(TypeError, match=f"DeepGP.regression: {option} must be True or False, "
                                        f"got {value!r}"):
        dgp.DeepGP.regression(X, y, num_inducing=5, **{option: value})


def test_boolean_options_take_numpy_bools():
    X, y = sine_data()
    model = dgp.DeepGP.regression(X, y, num_inducing=5, whiten=np.bool_(False),
                                  ard=np.bool_(True), train_mean=np.bool_(False))
    assert model.layers[0].whiten is False


@pytest.mark.parametrize("N, M", [(60, 60), (100, 100), (130, 100)])
@pytest.mark.parametrize("builder", ["regression", "classification"])
def test_default_num_inducing_is_at_most_the_data(N, M, builder):
    X, y = sine_data(N=N, D=2)
    if builder == "classification":
        y = (y > 0).to(DT)
    model = getattr(dgp.DeepGP, builder)(X, y)
    assert [layer.num_inducing for layer in model.layers] == [M, M]


def test_an_explicit_num_inducing_above_the_data_is_refused():
    X, y = sine_data(N=60)
    with pytest.raises(ValueError, match="num_inducing must be at most 60, got 100"):
        dgp.DeepGP.regression(X, y, num_inducing=100)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_refused_naming_the_dtype(fitted, dtype):
    model, guide, X, y = fitted
    match = f"X has dtype {dtype}, but a deep GP needs float32 or float64"
    with pytest.raises(TypeError, match=match):
        dgp.DeepGP.regression(X.to(dtype), y.to(dtype), num_inducing=5)
    with pytest.raises(TypeError, match=match):
        dgp.fit(model, guide, X.to(dtype), y.to(dtype), num_steps=1, progress=False)
    with pytest.raises(TypeError, match=match):
        dgp.predict(model, guide, X.to(dtype))
    with pytest.raises(TypeError, match=f"y has dtype {dtype}"):
        dgp.DeepGP.regression(X, y.to(dtype), num_inducing=5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distinct, M", [(10, 20), (10, 10), (1, 5), (10, 60)])
def test_kmeans_gives_distinct_centres_from_duplicated_inputs(distinct, M, dtype):
    """Fewer distinct inputs than inducing points: those inputs, then distinct points drawn
    near them, without scipy's empty-cluster or divide warnings."""
    X, y = sine_data(N=distinct, D=2, dtype=dtype)
    Xd, yd = torch.cat([X] * 6), torch.cat([y] * 6)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Z = kmeans(Xd, M, seed=0)
        model = dgp.DeepGP.regression(Xd, yd, num_inducing=M)
    # a single distinct point is constant data: only the package's own warnings say so
    assert not [w for w in seen if "standardised" not in str(w.message)]
    assert Z.shape == (M, 2) and Z.dtype == dtype
    assert torch.unique(Z, dim=0).shape[0] == M
    assert torch.equal(torch.unique(Z[:distinct], dim=0), torch.unique(X, dim=0))
    assert torch.equal(Z, kmeans(Xd, M, seed=0))  # deterministic
    spread = Xd.std(0) if distinct > 1 else torch.ones(2, dtype=dtype) * X.abs().max(0).values
    assert bool(((Z[distinct:] - Z[:distinct].mean(0)).abs() <= Xd.abs().max(0).values
                 + 0.1 * spread).all())
    Z1 = model.layers[0].inducing_points.detach()
    assert torch.unique(Z1, dim=0).shape[0] == M


def test_kmeans_of_distinct_inputs_is_unchanged():
    """Inputs with more distinct rows than M: scipy's k-means++ centres as they were, in their
    order; M = N: the inputs themselves."""
    from scipy.cluster.vq import kmeans2

    X, _ = sine_data(N=80, D=3)
    centres, _ = kmeans2(X.numpy(), 12, minit="++", seed=np.random.default_rng(4))
    assert torch.equal(kmeans(X, 12, seed=4), torch.as_tensor(centres))
    assert torch.equal(kmeans(X, 80, seed=4), X)
