"""``fit`` given bad settings or data: a clear error naming the setting, the dtype or the
parameter, and an error inside a Pyro trace reaching the user unwrapped."""

import pyro
import pytest
import torch
from bad_input_data import line_data, untrained_meanfield
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp.guides import MeanField

DT = torch.float64


@pytest.fixture
def data():
    return line_data()


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


def test_fit_names_every_parameter_of_another_dtype():
    X = torch.linspace(-1, 1, 12, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=1, num_inducing=4)
    model.likelihood.to(torch.float32)  # the first parameter (inducing inputs) is still DT
    with pytest.raises(ValueError, match="likelihood"):
        dgp.fit(model, MeanField(model), X, X[:, 0], num_steps=1, progress=False)


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


@pytest.fixture
def fitted():
    return untrained_meanfield()


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


@pytest.mark.parametrize("kwargs, error, match", [
    ({"restarts": 0}, ValueError, "restarts must be a positive integer, got 0"),
    ({"restarts": 2.5}, ValueError, "restarts must be a positive integer, got 2.5"),
    ({"restarts": "3"}, TypeError, "restarts must be a positive integer, got '3'"),
    ({"restarts": True}, TypeError, "restarts must be a positive integer, got True"),
    ({"restarts": 2, "jobs": 0}, ValueError, "jobs must be a positive integer, got 0"),
    ({"restarts": 2, "jobs": "many"}, ValueError, "jobs must be a positive integer or 'auto'"),
    ({"jobs": 2}, ValueError, r"jobs=2 sets the processes that train restarts: pass restarts"),
    ({"restarts": 2, "checkpoint": "fit.pt"}, ValueError,
     r"checkpoint='fit.pt' with restarts=2: every restart would write that one file; put the "
     r"field '\{restart\}'"),
    ({"restarts": 2, "distributed": True}, ValueError,
     "restarts is not available with distributed=True"),
    ({"restarts": 2, "seed": 2**32 - 1}, ValueError,
     "seed=4294967295 with restarts=2: restart k runs from seed \\+ k"),
    ({"restarts": 2, "seed": -1}, ValueError, "seed must be a non-negative integer, got -1"),
    ({"restarts": 2, "jobs": 2, "callbacks": [lambda info: None]}, TypeError,
     "jobs > 1 sends restart 1's model, guide, data and options to a worker process by pickle, "
     "which failed .*pass jobs=1"),
])
def test_fit_names_the_bad_restarts_setting(fitted, kwargs, error, match):
    model, guide, X, y = fitted
    with pytest.raises(error, match=match):
        dgp.fit(model, guide, X, y, num_steps=2, progress=False, **kwargs)


def test_restarts_refuse_a_guide_set_up_on_random_hyperparameters_sites(fitted):
    """A copy's ``PyroSample`` sites are named after its renamed module, so an autoguide that
    has run on the original's sites would not cover them."""
    model, _, X, y = fitted
    kernel = model.layers[0].kernel
    kernel.lengthscale = pyro.nn.PyroSample(
        pyro.distributions.LogNormal(torch.zeros(1, dtype=DT), 1.0).to_event(1))
    guide = dgp.complete(pyro.infer.autoguide.AutoNormal, model)
    guide(X, y)
    with pytest.raises(ValueError, match="random hyperparameters .* pass a guide that has not "
                                         "run yet"):
        dgp.fit(model, guide, X, y, num_steps=2, progress=False, restarts=2)
