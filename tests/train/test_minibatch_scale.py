"""Minibatching a hand-written model: ``fit`` warns when the model's observations are not
scaled ``N / B`` (a data plate without the full size), and not when they are."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp.infer.minibatch import MinibatchScaleWarning

DT = torch.float64


class _Hand(PyroModule):
    """One GP layer and a Gaussian likelihood; ``scaled``: the data plate knows ``N``."""

    def __init__(self, scaled: bool):
        super().__init__()
        self.g = dgp.GPLayer(1, 1, inducing_points=torch.linspace(-1, 1, 4, dtype=DT)[:, None])
        self.scaled = scaled
        self.num_data = None  # set by fit

    def forward(self, x, y=None):
        f = self.g(x).squeeze(-1)
        B = x.shape[-2]
        if self.scaled:
            plate = pyro.plate("data", size=self.num_data or B, subsample=torch.arange(B))
        else:
            plate = pyro.plate("data", B)
        with plate:
            return pyro.sample("y", dist.Normal(f, 0.1), obs=y)


def _data():
    X = torch.linspace(-1, 1, 40, dtype=DT)[:, None]
    return X, torch.sin(3 * X[:, 0])


def _fit(model, batch_size):
    X, y = _data()
    pyro.clear_param_store()
    guide = dgp.guides.MeanField(model)
    return dgp.fit(model, guide, X, y, num_steps=2, batch_size=batch_size, progress=False,
                   final_elbo_particles=0)


def test_unscaled_data_plate_on_minibatches_warns_with_the_numbers():
    with pytest.warns(MinibatchScaleWarning, match=r"10 of 40 points.*'y' by 1,.*N / B = 4"):
        _fit(_Hand(scaled=False), batch_size=10)


@pytest.mark.parametrize(("scaled", "batch_size"), [(True, 10), (False, None), (False, 40),
                                                    (False, 100)])
def test_no_warning_when_scaled_or_full_batch(scaled, batch_size):
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinibatchScaleWarning)
        _fit(_Hand(scaled=scaled), batch_size=batch_size)


def test_deep_gp_minibatches_are_scaled():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinibatchScaleWarning)
        _fit(model, batch_size=8)


def test_the_check_leaves_the_global_random_stream_alone():
    """The check traces the model once on its own seeded stream: the minibatch run from a
    seed gives the same losses with and without it."""
    X, y = _data()

    def losses(check: bool):
        pyro.clear_param_store()
        model = _Hand(scaled=True)
        guide = dgp.guides.MeanField(model)
        from pyro_dgp.train import training

        saved = training.check_minibatch_scale
        if not check:
            training.check_minibatch_scale = lambda *a: None
        try:
            return dgp.fit(model, guide, X, y, num_steps=3, batch_size=10, progress=False,
                           final_elbo_particles=0, seed=1).losses
        finally:
            training.check_minibatch_scale = saved

    assert losses(True) == losses(False)
