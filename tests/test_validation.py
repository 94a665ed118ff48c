"""Bad input gets a clear error that names the problem."""

import pytest
import torch

import pyro_dgp as dgp

DT = torch.float64


@pytest.fixture
def data():
    X = torch.linspace(-1, 1, 20, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X.squeeze(-1))


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
        ({"num_inducing": 21}, "num_inducing must be at most 20"),
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


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": -5}, "batch_size must be a positive integer"),
        ({"num_steps": 0}, "num_steps must be a positive integer"),
        ({"lr": 0.0}, "lr must be positive"),
        ({"objective": "kl"}, "objective must be"),
        ({"num_particles": 0}, "num_particles must be a positive integer"),
        ({"resume": True}, "resume=True needs a checkpoint"),
    ],
)
def test_fit_rejects_bad_settings(data, kwargs, match):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match=match):
        dgp.fit(model, guide, *data, **{"num_steps": 2, "progress": False, **kwargs})


def test_fit_rejects_data_of_another_dtype(data):
    X, y = data
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    expected = r"X is torch.float32 .* parameter\(s\) are not: .*inducing_points \(torch.float64"
    with pytest.raises(ValueError, match=expected):
        dgp.fit(model, dgp.guides.MeanField(model), X.float(), y.float(), progress=False)
    with pytest.raises(ValueError, match="y is torch.float32 .* but X is torch.float64"):
        dgp.fit(model, dgp.guides.MeanField(model), X, y.float(), progress=False)


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


def test_model_and_predict_reject_bad_inputs(data):
    X, y = data
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="has 2 columns, expected 1"):
        model(torch.zeros(4, 2, dtype=DT))
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        dgp.predict(model, guide, X, num_samples=0)
    with pytest.raises(ValueError, match="NaN or inf"):
        dgp.predict(model, guide, X * torch.nan)


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


@pytest.mark.parametrize(
    "value, error",
    [(None, TypeError), (float("inf"), ValueError), (float("nan"), ValueError),
     (0, ValueError), (-1, ValueError), (2.5, ValueError), ("3", TypeError),
     (True, TypeError)],
    ids=repr,
)
def test_check_positive_int_names_the_parameter_and_the_value(value, error):
    from pyro_dgp.validation import check_positive_int

    with pytest.raises(error, match=r"^num_inducing must be a positive integer, got ") as exc:
        check_positive_int(value, "num_inducing")
    assert repr(value) in str(exc.value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 2.5, "3"], ids=repr)
def test_model_names_num_inducing_for_values_int_cannot_take(data, value):
    """(``None`` is the default: ``min(100, N)``, tests/test_user_inputs.py.)"""
    with pytest.raises((TypeError, ValueError), match="num_inducing must be a positive integer"):
        dgp.DeepGP.regression(*data, num_inducing=value)


def test_check_positive_int_accepts_whole_numbers():
    from pyro_dgp.validation import check_positive_int

    assert check_positive_int(3, "n") == 3
    assert check_positive_int(3.0, "n") == 3
    assert check_positive_int(torch.tensor(4), "n") == 4
    with pytest.raises(ValueError, match="n must be at most 3, got 4"):
        check_positive_int(4, "n", upper=3)
