"""Inputs a user meets early: data on a small scale, labels that are not 0/1, small data
sets, zero rows, half precision, duplicated inputs, and settings of the wrong type: each is
fitted, converted or refused with a message naming the problem."""

import warnings

import numpy as np
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.gp.architectures import kmeans

DT = torch.float64


def _data(N=60, D=1, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=DT)
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    return X.to(dtype), y.to(dtype)


def _standardise_warnings(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


# ------------------------------------------------------------------ 1. input scale
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-2, 1e-3, 1e-6])
def test_inputs_on_a_small_scale_are_warned_about(scale, dtype):
    """Along a column of standard deviation 0.01 the starting lengthscale ln 2 sees a
    constant: 1,000 steps fit the constant mean (NLL ~1.0 on a sine); it says so."""
    X, y = _data(dtype=dtype)
    X = torch.cat([X, X * scale], -1)
    msgs = _standardise_warnings(lambda: dgp.DeepGP.regression(X, y, num_inducing=10))
    hits = [m for m in msgs if "assume standardised data" in m]
    assert len(hits) == 1
    assert "column(s) [1] have a standard deviation below 0.1" in hits[0]
    assert "standardise them" in hits[0]


def test_standardised_and_moderately_scaled_inputs_are_not_warned_about():
    X, y = _data()
    for scale in (1.0, 0.3, 0.3 / X.std().item()):
        msgs = _standardise_warnings(lambda s=scale: dgp.DeepGP.regression(X * s, y,
                                                                           num_inducing=10))
        assert not msgs, (scale, msgs)


def test_constant_columns_are_not_warned_about():
    """A constant column is harmless to the kernel and the mean (naval's standardised splits
    hold two): no warning, the small-spread one included."""
    X, y = _data(D=2)
    X = torch.cat([X[:, :1], torch.zeros_like(X[:, :1]), X[:, 1:]], -1)
    assert _standardise_warnings(lambda: dgp.DeepGP.regression(X, y, num_inducing=10)) == []


def test_large_inputs_are_warned_about_in_float32():
    """In float32 at X * 1e6 the fit diverges (TrainingDivergedError): the build has said
    why before."""
    X, y = _data(dtype=torch.float32)
    with pytest.warns(UserWarning, match="X has columns with .* standardise them"):
        dgp.DeepGP.regression(X * 1e6, y, num_inducing=10)


# ------------------------------------------------------------------ 2. labels
@pytest.fixture(scope="module")
def classifier():
    X, _ = _data(N=40, D=2, seed=1)
    y = (X[:, 0] * X[:, 1] > 0).to(DT)
    model = dgp.DeepGP.classification(X, y, num_inducing=8)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0)
    return dgp.predict(model, guide, X, num_samples=4, seed=0), y


@pytest.mark.parametrize("metric", ["nll", "crps", "rmse", "coverage", "accuracy", "auc"])
@pytest.mark.parametrize("bad", [lambda y: 2 * y, lambda y: torch.full_like(y, 0.5),
                                 lambda y: y - 1 + 0.3])
def test_classification_scores_refuse_labels_that_are_not_binary(classifier, metric, bad):
    pred, y = classifier
    with pytest.raises(ValueError, match="binary labels must be 0/1 or -1/1, got the values"):
        getattr(dgp.metrics, metric)(pred, bad(y))


@pytest.mark.parametrize("as_labels", [lambda y: y.long(), lambda y: y.bool(),
                                       lambda y: y.to(torch.int32), lambda y: 2 * y - 1])
def test_classification_scores_take_integer_boolean_and_signed_labels(classifier, as_labels):
    pred, y = classifier
    for metric in ("nll", "crps", "accuracy", "auc", "rmse", "coverage"):
        assert getattr(dgp.metrics, metric)(pred, as_labels(y)) == pytest.approx(
            getattr(dgp.metrics, metric)(pred, y), rel=1e-12)


def test_regression_report_refuses_a_classifier(classifier):
    pred, y = classifier
    with pytest.raises(ValueError, match="regression_report scores a regression predictive, "
                                         "but this one is binary .*metrics.accuracy"):
        dgp.metrics.regression_report(pred, y)


@pytest.mark.parametrize("as_labels", [lambda y: y.long(), lambda y: y.bool(),
                                       lambda y: y.to(torch.uint8)])
def test_classification_takes_integer_and_boolean_labels(as_labels):
    X, _ = _data(N=30, D=2)
    y = (X[:, 0] > 0).to(DT)
    model = dgp.DeepGP.classification(X, as_labels(y), num_inducing=6)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, X, as_labels(y), num_steps=2, progress=False,
                     final_elbo_particles=0)
    assert np.isfinite(result.losses).all()
    with pytest.raises(ValueError, match=r"binary labels must be 0 or 1, found \[2.0\]"):
        dgp.DeepGP.classification(X, 2 * y.long(), num_inducing=6)


def test_regression_still_refuses_integer_targets():
    X, y = _data()
    with pytest.raises(TypeError, match="y must be a floating-point tensor, got dtype "
                                        "torch.int64"):
        dgp.DeepGP.regression(X, y.round().long(), num_inducing=5)


# ------------------------------------------------------------------ 3 and 7. fit's settings
@pytest.fixture
def fitted():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    return model, dgp.guides.MeanField(model), X, y


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_particles": -1}, ValueError, "num_particles must be a positive integer, got -1"),
    ({"num_particles": 0, "threads": None}, ValueError, "num_particles must be a positive"),
    ({"num_particles": "2"}, TypeError, "num_particles must be a positive integer"),
    ({"lr": "0.01"}, TypeError, "lr must be a positive finite number, got '0.01'"),
    ({"lr": None}, TypeError, "lr must be a positive finite number, got None"),
    ({"lr": float("nan")}, ValueError, "lr must be positive and finite"),
    ({"lr_decay": "0.5"}, TypeError, r"lr_decay must be a number in \(0, 1\]"),
    ({"lr_decay": 0}, ValueError, r"lr_decay must be in \(0, 1\], got 0"),
    ({"seed": -1}, ValueError, "seed must be a non-negative integer, got -1"),
    ({"seed": "a"}, TypeError, "seed must be a non-negative integer, got 'a'"),
    ({"seed": 2**32}, ValueError, "seed must be at most 4294967295"),
    ({"optimizer": "adam"}, TypeError, "optimizer must be a torch.optim.Optimizer class"),
    ({"optimizer": None}, TypeError, "optimizer must be a torch.optim.Optimizer class"),
    ({"final_elbo_particles": -1}, ValueError,
     "final_elbo_particles must be a non-negative integer, got -1"),
    ({"threads": 0}, ValueError, "threads must be a positive integer, got 0"),
])
def test_fit_names_the_bad_setting(fitted, kwargs, error, match):
    model, guide, X, y = fitted
    with pytest.raises(error, match=match):
        dgp.fit(model, guide, X, y, num_steps=2, progress=False, **kwargs)


@pytest.mark.parametrize("option", ["whiten", "ard", "train_mean"])
@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_boolean_options_must_be_bools(option, value):
    X, y = _data()
    with pytest.raises(TypeError, match=f"DeepGP.regression: {option} must be True or False, "
                                        f"got {value!r}"):
        dgp.DeepGP.regression(X, y, num_inducing=5, **{option: value})


def test_boolean_options_take_numpy_bools():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_inducing=5, whiten=np.bool_(False),
                                  ard=np.bool_(True), train_mean=np.bool_(False))
    assert model.layers[0].whiten is False


# ------------------------------------------------------------------ 4. default M
@pytest.mark.parametrize("N, M", [(60, 60), (100, 100), (130, 100)])
@pytest.mark.parametrize("builder", ["regression", "classification"])
def test_default_num_inducing_is_at_most_the_data(N, M, builder):
    X, y = _data(N=N, D=2)
    if builder == "classification":
        y = (y > 0).to(DT)
    model = getattr(dgp.DeepGP, builder)(X, y)
    assert [layer.num_inducing for layer in model.layers] == [M, M]


def test_an_explicit_num_inducing_above_the_data_is_refused():
    X, y = _data(N=60)
    with pytest.raises(ValueError, match="num_inducing must be at most 60, got 100"):
        dgp.DeepGP.regression(X, y, num_inducing=100)


# ------------------------------------------------------------------ 5. zero rows
def test_zero_rows_are_refused_at_every_entry_point(fitted):
    model, guide, X, y = fitted
    dgp.fit(model, guide, X, y, num_steps=1, progress=False, final_elbo_particles=0)
    match = r"X has no rows \(shape \(0, 1\)\): at least one data point is needed"
    for call in (lambda: dgp.predict(model, guide, X[:0]),
                 lambda: dgp.layer_summary(dgp.to_datatree(model, guide, X[:0])),
                 lambda: dgp.to_datatree(model, guide, X[:0]),
                 lambda: dgp.fit(model, guide, X[:0], y[:0], num_steps=1, progress=False),
                 lambda: dgp.DeepGP.regression(X[:0], y[:0])):
        with pytest.raises(ValueError, match=match):
            call()


# ------------------------------------------------------------------ 6. half precision
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


# ------------------------------------------------------------------ 8. duplicated inputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distinct, M", [(10, 20), (10, 10), (1, 5), (10, 60)])
def test_kmeans_gives_distinct_centres_from_duplicated_inputs(distinct, M, dtype):
    """Fewer distinct inputs than inducing points: those inputs, then distinct points drawn
    near them, without scipy's empty-cluster or divide warnings."""
    X, y = _data(N=distinct, D=2, dtype=dtype)
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

    X, _ = _data(N=80, D=3)
    centres, _ = kmeans2(X.numpy(), 12, minit="++", seed=np.random.default_rng(4))
    assert torch.equal(kmeans(X, 12, seed=4), torch.as_tensor(centres))
    assert torch.equal(kmeans(X, 80, seed=4), X)
