"""``predict``, ``MixturePredictive`` and the metrics given bad input: a clear error naming the
argument (a guide of another model, non-finite units, labels that are not binary)."""

import math

import pytest
import torch
from bad_input_data import line_data, sine_data

import pyro_dgp as dgp
from pyro_dgp.guides import MeanField
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import MixturePredictive

DT = torch.float64


@pytest.fixture
def data():
    return line_data()


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


def test_predict_rejects_a_guide_of_another_model(data):
    X, y = data
    a = dgp.DeepGP.regression(X, y, num_inducing=5)
    b = dgp.DeepGP.regression(X, -y, num_inducing=5)
    guide = MeanField(a)
    guide(X, y)
    with pytest.raises(ValueError, match="predict: the guide MeanField was built for the model"):
        dgp.predict(b, guide, X, num_samples=2)


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


def test_mixture_predictive_checks_draws_and_variances():
    lik = Gaussian(0.1)
    with pytest.raises(ValueError, match=r"at least one draw \(S >= 1\)"):
        MixturePredictive(torch.zeros(0, 4), torch.zeros(0, 4), lik)
    with pytest.raises(ValueError, match="var must be non-negative"):
        MixturePredictive(torch.zeros(2, 4), -torch.ones(2, 4), lik)


@pytest.fixture(scope="module")
def classifier():
    X, _ = sine_data(N=40, D=2, seed=1)
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
