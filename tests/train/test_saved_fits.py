"""The registry of model builders behind saved fits (``pyro_dgp.train.saved``): a builder
registered by name is rebuilt by ``load_fit`` and checked by ``save_fit``, as the two built
in (``"dsvi"``, ``"avdgp"``) are."""

import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.train.saved import MODELS, load_fit, model_from_config, register_model, save_fit

DT = torch.float64


@pytest.fixture
def one_layer_model():
    """A builder registered as ``"one-layer"`` (``DeepGP.regression`` of one layer), removed
    afterwards."""
    def build(X, y, task, **options):
        return dgp.DeepGP.regression(X, y, num_layers=1, **options)
    entry = register_model("one-layer", build, options={"num_inducing", "seed"},
                           num_layers=lambda options: 1, about="one GP layer")
    yield entry
    del MODELS["one-layer"]


def _data():
    X = torch.linspace(-2, 2, 20, dtype=DT).unsqueeze(-1)
    return X, torch.sin(X[:, 0])


def test_the_built_in_builders_are_registered():
    assert {"dsvi", "avdgp"} <= set(MODELS)
    assert MODELS["avdgp"].per_point_inducing and not MODELS["dsvi"].per_point_inducing


def test_a_registered_builder_saves_and_loads_with_the_same_predictions(one_layer_model,
                                                                         tmp_path):
    X, y = _data()
    config = {"model": {"architecture": "one-layer", "num_inducing": 5, "seed": 1},
              "guide": "meanfield"}
    model = model_from_config(config["model"], X, y)
    assert len(model.layers) == 1
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0)
    save_fit(tmp_path / "fit.pt", model, guide, config)
    loaded, loaded_guide, _ = load_fit(tmp_path / "fit.pt", X, y)
    want = dgp.predict(model, guide, X, seed=0).mean
    got = dgp.predict(loaded, loaded_guide, X, seed=0).mean
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_a_registered_builder_refuses_an_option_it_does_not_take(one_layer_model, tmp_path):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    config = {"model": {"architecture": "one-layer", "num_layers": 1}, "guide": "meanfield"}
    with pytest.raises(ValueError, match=r"\['num_layers'\], which the one-layer builder"):
        save_fit(tmp_path / "fit.pt", model, dgp.guides.MeanField(model), config)


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'dsvi' is already registered"):
        register_model("dsvi", lambda X, y, task: None, options=(), num_layers=len)


def test_a_fit_with_a_kernel_per_output_saves_loads_and_names_a_config_that_disagrees(tmp_path):
    X, y = _data()
    config = {"model": {"num_layers": 2, "hidden_dim": 2, "num_inducing": 5,
                        "kernel_per_output": True}, "guide": "meanfield"}
    model = model_from_config(config["model"], X, y)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0)
    save_fit(tmp_path / "fit.pt", model, guide, config)
    loaded, loaded_guide, _ = load_fit(tmp_path / "fit.pt", X, y)
    assert loaded.layers[0].kernel_outputs == 2
    torch.testing.assert_close(dgp.predict(loaded, loaded_guide, X, seed=0).mean,
                               dgp.predict(model, guide, X, seed=0).mean, rtol=1e-12, atol=0)
    shared = {"model": {**config["model"], "kernel_per_output": False}, "guide": "meanfield"}
    with pytest.raises(ValueError, match=r"kernel_per_output=False, but the model's layers "
                                         r"\['layer1'\] have a kernel per output"):
        save_fit(tmp_path / "other.pt", model, guide, shared)
