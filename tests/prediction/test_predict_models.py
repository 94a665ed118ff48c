"""``predict`` on hand-written models: a plain ``PyroModule`` of GP layers whose observation is
a Pyro distribution (the mixture of the site's distributions over guide draws) or a package
likelihood not exposed as ``.likelihood`` (the analytic mixture), and the errors that say what
``predict`` needs."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule

import models
import pyro_dgp as dgp
from pyro_dgp import metrics
from pyro_dgp.prediction import DrawMixturePredictive, MixturePredictive

DT = torch.float64


@pytest.fixture(autouse=True)
def _local_params():
    with pyro.settings.context(module_local_params=True):
        yield


def _inputs(N=40):
    return torch.linspace(-2, 2, N, dtype=DT).unsqueeze(-1)


def _counts(X, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.poisson(torch.exp(1 + torch.sin(2 * X[:, 0])), generator=g)


class HandPoisson(PyroModule):
    """A user's Poisson DGP: two GP layers, ``y ~ Poisson(exp(f))`` by ``pyro.sample``; with
    ``analytic=True`` the same model's observation through the gallery's Poisson likelihood
    (the analytic mixture), for comparison."""

    def __init__(self, X, analytic=False):
        super().__init__()
        Z = X[::4].clone()
        self.inner = dgp.GPLayer(1, 1, inducing_points=Z, mean="identity")
        self.outer = dgp.GPLayer(1, 1, inducing_points=Z)
        self.analytic = analytic
        self.counts = models.Poisson()

    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.outer(self.inner(X, plate=plate), plate=plate)
        with plate:
            if self.analytic:
                return self.counts(f, y)
            return pyro.sample("y", dist.Poisson(f.squeeze(-1).exp()), obs=y)


class HandGaussian(PyroModule):
    """One GP layer and a package likelihood held as ``.noise`` (not ``.likelihood``)."""

    def __init__(self, X):
        super().__init__()
        self.layer = dgp.GPLayer(1, 1, inducing_points=X[::4].clone())
        self.noise = dgp.likelihoods.Gaussian(torch.tensor(0.1, dtype=DT))

    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.layer(X, plate=plate)
        with plate:
            return self.noise(f, y)


def test_predict_scores_a_trained_hand_written_poisson_dgp():
    X = _inputs()
    y = _counts(X)
    model = HandPoisson(X)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=15, lr=0.02, progress=False)
    pred = dgp.predict(model, guide, X, num_samples=50, seed=1)
    assert isinstance(pred, DrawMixturePredictive)
    assert pred.mean.shape == pred.variance.shape == (40,)
    assert bool((pred.variance >= pred.mean * 0.999).all())  # over-dispersed: Var >= E
    lo, hi = pred.quantiles([0.025, 0.975])
    assert bool((lo == lo.round()).all() and (hi == hi.round()).all())  # counts
    report = metrics.count_report(pred, y)
    assert set(report) == {"nll", "rmse", "coverage95"}
    assert all(math.isfinite(v) for v in report.values())
    assert math.isfinite(metrics.crps(pred, y))
    # the same seed, the same numbers
    again = dgp.predict(model, guide, X, num_samples=50, seed=1)
    assert torch.equal(again.log_prob(y), pred.log_prob(y))


def test_a_poisson_site_predicts_what_the_analytic_poisson_mixture_does():
    """The mixture of Poisson(exp(f_s)) over draws f_s ~ N(loc_s, var_s) estimates the
    analytic mixture of int Poisson(y | e^f) N(f; loc_s, var_s) df: same mean and density up
    to Monte Carlo error over S = 4000 draws."""
    X = _inputs(8)
    model = HandPoisson(X)
    guide = dgp.guides.MeanField(model)
    drawn = dgp.predict(model, guide, X, num_samples=4000, seed=0)
    model.analytic = True
    exact = dgp.predict(model, guide, X, num_samples=4000, seed=0)
    assert isinstance(exact, MixturePredictive)
    assert isinstance(drawn, DrawMixturePredictive)
    y = torch.tensor([0.0, 1, 2, 3, 0, 1, 5, 2], dtype=DT)
    se = (exact.variance / 4000).sqrt()
    assert bool(((drawn.mean - exact.mean).abs() < 5 * se).all())
    assert torch.allclose(drawn.log_prob(y), exact.log_prob(y), atol=0.05)


def test_a_package_likelihood_site_gives_the_analytic_mixture():
    X = _inputs(20)
    y = torch.sin(2 * X[:, 0])
    model = HandGaussian(X)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=20, lr=0.02, progress=False)
    pred = dgp.predict(model, guide, X, num_samples=20, seed=0)
    assert isinstance(pred, MixturePredictive) and pred.likelihood is model.noise
    report = metrics.regression_report(pred, y)
    assert all(math.isfinite(v) for v in report.values())


def test_the_observation_site_path_equals_the_likelihood_path():
    """On a model with ``.likelihood``, ``observed="y"`` reads the Gaussian of the last layer
    at the site instead of from the guide: the same predictive to the bit."""
    X = _inputs(15)
    model = models.RegressionDGP(X, hidden=(1,), num_inducing=5)
    guide = dgp.guides.MeanField(model)
    by_likelihood = dgp.predict(model, guide, X, num_samples=7, seed=3)
    by_site = dgp.predict(model, guide, X, num_samples=7, seed=3, observed="y")
    assert torch.equal(by_site.loc, by_likelihood.loc)
    assert torch.equal(by_site.var, by_likelihood.var)


def test_a_softmax_dgp_predicts_class_probabilities():
    X = _inputs(12).repeat(1, 2)
    model = models.MulticlassDGP(X, num_classes=3, hidden=(2,), num_inducing=4)
    guide = dgp.guides.MeanField(model)
    pred = dgp.predict(model, guide, X, num_samples=2000, seed=0)
    assert isinstance(pred, DrawMixturePredictive) and pred.categorical
    probs = pred.class_probabilities()
    assert probs.shape == (12, 3)
    assert torch.allclose(probs.sum(-1), torch.ones(12, dtype=DT))
    reference = models.class_probabilities(guide, X, num_samples=2000, seed=5)
    assert torch.allclose(probs, reference, atol=0.03)  # two Monte Carlo estimates
    y = torch.tensor([0, 1, 2] * 4, dtype=DT)
    report = metrics.classification_report(pred, y)
    assert set(report) == {"accuracy", "nll", "brier", "ece"}
    nll = -probs[torch.arange(12), y.long()].log().mean()
    assert report["nll"] == pytest.approx(float(nll), rel=1e-10)
    with pytest.raises(ValueError, match="class labels must be whole numbers in \\[0, 3\\)"):
        metrics.classification_report(pred, torch.full((12,), 3.0, dtype=DT))
    with pytest.raises(ValueError, match="categorical.*classification_report"):
        metrics.regression_report(pred, y)


class _NoObservation(PyroModule):
    def __init__(self, X):
        super().__init__()
        self.layer = dgp.GPLayer(1, 1, inducing_points=X[::4].clone())

    def forward(self, X, y=None):
        return self.layer(X)


class _TwoObservations(HandPoisson):
    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.outer(self.inner(X, plate=plate), plate=plate).squeeze(-1)
        with plate:
            pyro.sample("extra", dist.Normal(f, 1.0))
            return pyro.sample("y", dist.Poisson(f.exp()), obs=y)


class _TwoOutputs(HandPoisson):
    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.outer(self.inner(X, plate=plate), plate=plate)
        with plate:  # two y per point
            return pyro.sample("y", dist.Normal(f.expand(*f.shape[:-1], 2), 1.0).to_event(1),
                               obs=y)


def test_predict_says_what_it_needs_when_no_observation_is_found():
    X = _inputs(8)
    model = _NoObservation(X)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="no observation site; predict\\(\\) needs a model with "
                                         "a .likelihood .*pyro.sample\\(name, distribution, "
                                         "obs=y\\)"):
        dgp.predict(model, guide, X, num_samples=3)


def test_predict_asks_which_site_among_several_and_reads_the_one_named():
    X = _inputs(8)
    model = _TwoObservations(X)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="several sites .*'extra'.*'y'.*observed='<name>'"):
        dgp.predict(model, guide, X, num_samples=3)
    pred = dgp.predict(model, guide, X, num_samples=3, observed="y")
    assert isinstance(pred.components[0], torch.distributions.Poisson)
    with pytest.raises(ValueError, match="no sample site observed='z'; its candidate"):
        dgp.predict(model, guide, X, num_samples=3, observed="z")


def test_predict_names_an_observation_that_is_not_one_y_per_point():
    X = _inputs(8)
    model = _TwoOutputs(X)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="site 'y' must be a torch distribution of event shape "
                                         "\\(\\).*Independent of event shape \\(2,\\)"):
        dgp.predict(model, guide, X, num_samples=3)
