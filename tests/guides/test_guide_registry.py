"""Guides by name (``pyro_dgp.guides.registry``) for the semi-implicit and amortized families:
which model each fits, the refusals that name the remedy, and the command line and saved fits
round-tripping them."""

import json

import pyro
import pytest
import torch
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp.cli import main
from pyro_dgp.guides.registry import (
    GUIDES,
    LOCAL_INDUCING_GUIDES,
    has_local_inducing,
    make_guide,
)
from pyro_dgp.train.saved import load_fit, save_fit

DT = torch.float64


def _data(N=20):
    X = torch.linspace(-1, 1, N, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X[:, 0])


def test_each_name_builds_its_family_on_the_model_it_fits():
    X, y = _data()
    dsvi = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    avdgp = dgp.gp.avdgp_regression(X, y, hidden_dims=(2,), num_inducing=3)
    assert has_local_inducing(dsvi) is False and has_local_inducing(avdgp) is True
    assert has_local_inducing(lambda x: x) is None  # not a module: cannot be told
    for name, structured, components in (("ssivi", True, "diagonal"),
                                         ("sivi", False, "diagonal"),
                                         ("ssivi-tril", True, "tril")):
        guide = make_guide(name, dsvi)
        assert isinstance(guide, dgp.guides.SemiImplicit) and guide.structured is structured
        assert guide.component_scale == components
    for name in sorted(LOCAL_INDUCING_GUIDES):
        guide = make_guide(name, avdgp)
        assert isinstance(guide, dgp.guides.Amortized)
        assert guide.rule == name.removeprefix("amortized-").upper()
    assert LOCAL_INDUCING_GUIDES <= set(GUIDES)


def test_a_guide_that_does_not_fit_the_model_is_refused_naming_the_remedy():
    X, y = _data()
    dsvi = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    avdgp = dgp.gp.avdgp_regression(X, y, hidden_dims=(2,), num_inducing=3)
    with pytest.raises(ValueError, match=r"'amortized-ar2p' needs a model of AmortizedGPLayers"
                                         r".*avdgp_regression.*--model avdgp"):
        make_guide("amortized-ar2p", dsvi)
    with pytest.raises(ValueError, match=r"AmortizedGPLayers .* 'ssivi' does not support; "
                                         r"choose one of \['amortized-ar1'"):
        make_guide("ssivi", avdgp)
    with pytest.raises(ValueError, match="unknown guide 'amortized'"):
        make_guide("amortized", avdgp)


class HandWrittenAmortized(PyroModule):
    """A hand-written model of one amortized layer: the registry finds it among the
    submodules."""

    def __init__(self):
        super().__init__()
        self.f = dgp.AmortizedGPLayer(1, 1, inducing_offsets=torch.zeros(2, 1, dtype=DT))

    def forward(self, x, y=None):
        f = self.f(x).squeeze(-1)
        with pyro.plate("data", x.shape[-2]):
            return pyro.sample("y", pyro.distributions.Normal(f, 0.1), obs=y)


def test_a_hand_written_amortized_model_takes_the_amortized_guides():
    X, y = _data(8)
    model = HandWrittenAmortized()
    assert has_local_inducing(model) is True
    guide = make_guide("amortized-ar2", model)
    loss = dgp.AmortizedELBO().loss(model, guide, X, y)
    assert torch.isfinite(torch.as_tensor(loss))
    with pytest.raises(ValueError, match="does not support"):
        make_guide("meanfield", model)


def _fit_and_evaluate(tmp_path, capsys, extra):
    args = ["fit", "--data", "step", "--steps", "3", "--batch-size", "50", "--samples", "4",
            "--output", str(tmp_path), "--quiet", *extra]
    assert main(args) == 0
    fitted = json.loads((tmp_path / "metrics.json").read_text())
    err = capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "fit.pt")]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for k in ("nll", "rmse", "crps", "coverage95"):
        assert evaluated[k] == pytest.approx(fitted[k], rel=1e-12), k
    return err


@pytest.mark.parametrize("extra", [["--guide", "ssivi", "--inducing", "5"],
                                   ["--model", "avdgp", "--guide", "amortized-ar2pp",
                                    "--layers", "3"]],
                         ids=["ssivi", "avdgp-ar2pp"])
def test_command_line_fit_and_evaluate_of_the_new_families_reproduce(tmp_path, capsys, extra):
    """``pyro-dgp fit`` then ``evaluate`` from the saved fit gives the same scores: the
    guide's lazily built parameters (networks, encoders, quadrature nodes) round-trip. The
    amortized model is the paper's architecture: a DSVI option given with it is noted."""
    err = _fit_and_evaluate(tmp_path, capsys, extra)
    if "avdgp" in extra:
        assert "--layers does not apply to --model avdgp" in err


def test_command_line_refuses_an_amortized_guide_without_the_amortized_model(tmp_path,
                                                                             capsys):
    args = ["fit", "--data", "step", "--steps", "2", "--guide", "amortized-ar2p", "--output",
            str(tmp_path), "--quiet"]
    assert main(args) == 2
    assert "--model avdgp" in capsys.readouterr().err


def test_a_saved_amortized_fit_loads_with_the_same_predictions(tmp_path):
    data = dgp.datasets.step(n_train=30, n_test=10, seed=0)
    model = dgp.gp.avdgp_regression(data.X_train, data.y_train, seed=3)
    guide = make_guide("amortized-ar2p", model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=3, progress=False,
            objective=dgp.AmortizedELBO(), final_elbo_particles=0)
    save_fit(tmp_path / "fit.pt", model, guide,
             {"model": {"architecture": "avdgp", "seed": 3}, "guide": "amortized-ar2p"})
    loaded, loaded_guide, _ = load_fit(tmp_path / "fit.pt", data.X_train, data.y_train)
    want = dgp.predict(model, guide, data.X_test).log_prob(data.y_test)
    got = dgp.predict(loaded, loaded_guide, data.X_test).log_prob(data.y_test)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
