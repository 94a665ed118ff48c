"""Checkpoints and saved fits load with ``weights_only=True``: a file whose pickle would run
code is refused with an error naming it, and runs nothing; every round trip is unchanged."""

import os
import pathlib

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.infer.checkpoint import load_fit, safe_load, save_fit

DT = torch.float64


class _RunsCode:
    """Unpickling this calls ``Path.touch`` on the marker file: code run by loading."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _hostile(path, marker, **payload):
    torch.save({"config": {"model": {}, "guide": "meanfield"}, "step": 0,
                "model": _RunsCode(marker), **payload}, path)


def _data():
    X = torch.linspace(-1, 1, 16, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X[:, 0])


def test_safe_load_refuses_a_pickle_that_runs_code_and_runs_nothing(tmp_path):
    path, marker = tmp_path / "their.pt", tmp_path / "ran"
    _hostile(path, marker)
    with pytest.raises(ValueError, match="refusing to load .*their.pt"):
        safe_load(path)
    assert not marker.exists()


def test_every_loader_refuses_it(tmp_path, capsys):
    X, y = _data()
    path, marker = tmp_path / "their.pt", tmp_path / "ran"
    _hostile(path, marker)
    with pytest.raises(ValueError, match="refusing to load"):
        load_fit(path, X, y)
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    with pytest.raises(ValueError, match="refusing to load"):
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=2, progress=False,
                checkpoint=path, resume=True)
    from pyro_dgp.cli import main
    assert main(["evaluate", str(path)]) != 0
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()


def test_checkpoints_load_with_weights_only_and_resume_exactly(tmp_path):
    X, y = _data()
    ckpt = tmp_path / "run.pt"

    def run(steps, resume=False):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4, name="m")
        guide = dgp.guides.MeanField(model, name="g")
        result = dgp.fit(model, guide, X, y, num_steps=steps, progress=False, seed=1,
                         checkpoint=ckpt, checkpoint_every=3, resume=resume,
                         final_elbo_particles=0)
        return result.losses

    full = run(10)
    os.remove(ckpt)
    run(6)
    state = torch.load(ckpt, weights_only=True)  # plain data: loads without pickled code
    assert state["step"] == 6
    assert run(10, resume=True) == full


def test_save_fit_round_trip_and_atomic_write(tmp_path, monkeypatch):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False, final_elbo_particles=0)
    config = {"model": {"num_layers": 2, "num_inducing": 4}, "guide": "meanfield",
              "dtype": "float64"}
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((a, b)),
                                                     real_replace(a, b)))
    path = tmp_path / "fit.pt"
    save_fit(path, model, guide, config)
    assert renames == [(path.with_name("fit.pt.tmp"), path)]
    model2, guide2, config2 = load_fit(path, X, y)
    assert config2 == config
    p1 = dgp.predict(model, guide, X, num_samples=5, seed=0)
    p2 = dgp.predict(model2, guide2, X, num_samples=5, seed=0)
    torch.testing.assert_close(p1.mean, p2.mean, rtol=0, atol=0)
