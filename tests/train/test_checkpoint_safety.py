"""Checkpoints and saved fits load with ``weights_only=True``: a file whose pickle would run
code is refused with an error naming it, and runs nothing; every round trip is unchanged."""

import os
import pathlib

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.train.checkpoint import safe_load
from pyro_dgp.train.saved import load_fit, save_fit

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


class _RunsShell:
    """Unpickling this runs a shell command (``os.system``, a module the weights-only loader
    blocks outright: torch's error then holds only its advice to load the file unsafely)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("payload", [_RunsCode, _RunsShell])
def test_the_refusal_names_the_file_unsafe_and_gives_no_advice_to_load_it(
        tmp_path, payload, capsys):
    """A file of os.system was called "corrupt or not a checkpoint", with torch's advice to
    re-run with weights_only=False ("will likely succeed, but it can result in arbitrary code
    execution") as the reason."""
    path, marker = tmp_path / "their.pt", tmp_path / "ran"
    torch.save({"model": payload(marker)}, path)
    with pytest.raises(ValueError, match=r"refusing to load .*their.pt.*: the file is unsafe"
                                         r".*GLOBAL") as info:
        safe_load(path)
    message = str(info.value)
    for advice in ("weights_only", "trusted source", "will likely succeed", "add_safe_globals"):
        assert advice not in message
    _refused_by_every_loader(path, "the file is unsafe", capsys)
    assert not marker.exists()


def _refused_by_every_loader(path, message, capsys):
    """load_fit, fit's resume and the CLI's evaluate (exit code 2) refuse ``path``."""
    X, y = _data()
    with pytest.raises(ValueError, match=message):
        load_fit(path, X, y)
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    with pytest.raises(ValueError, match=message):
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=2, progress=False,
                checkpoint=path, resume=True)
    from pyro_dgp.cli import main
    assert main(["evaluate", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_every_loader_refuses_it(tmp_path, capsys):
    X, y = _data()
    path, marker = tmp_path / "their.pt", tmp_path / "ran"
    _hostile(path, marker)
    _refused_by_every_loader(path, "refusing to load", capsys)
    assert not marker.exists()


def test_checkpoints_load_with_weights_only_and_resume_exactly(tmp_path):
    X, y = _data()
    ckpt = tmp_path / "run.pt"

    def run(steps, resume=False):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4, name="m")
        guide = dgp.guides.MeanField(model, name="g")
        # a constant rate: a run of 6 steps is then the first 6 of 10
        result = dgp.fit(model, guide, X, y, num_steps=steps, progress=False, seed=1,
                         checkpoint=ckpt, checkpoint_every=3, resume=resume,
                         final_elbo_particles=0, lr_schedule="constant")
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


# ------------------------------------------------------ unreadable files and what save_fit takes
def _garbage(path, kind):
    if kind == "random bytes":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    else:  # a checkpoint cut short
        X, y = _data()
        model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
        save_fit(path, model, dgp.guides.MeanField(model),
                 {"model": {"num_layers": 1, "num_inducing": 4}, "guide": "meanfield"})
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("kind", ["random bytes", "empty", "text", "truncated"])
def test_a_corrupt_file_is_called_unreadable_not_unsafe(tmp_path, kind, capsys):
    path = tmp_path / "bad.pt"
    _garbage(path, kind)
    with pytest.raises(ValueError, match=r"cannot read .*bad.pt.* \(corrupt or not a "
                                         r"checkpoint\)") as info:
        safe_load(path)
    assert "refusing" not in str(info.value) and "run code" not in str(info.value)
    _refused_by_every_loader(path, "corrupt or not a checkpoint", capsys)


def test_a_disallowed_global_is_the_only_security_refusal(tmp_path):
    import numpy as np

    path = tmp_path / "np.pt"
    torch.save({"x": np.zeros(3)}, path)  # harmless, but outside the weights-only allow-list
    with pytest.raises(ValueError, match=r"refusing to load .*could run code.*Unsupported "
                                         r"global"):
        safe_load(path)
    torch.save(torch.zeros(3), path)  # loads, but is no checkpoint
    with pytest.raises(ValueError, match="holds a Tensor, not a checkpoint"):
        safe_load(path)
    with pytest.raises(ValueError, match="cannot read .*Is a directory"):
        safe_load(tmp_path)
    with pytest.raises(FileNotFoundError):
        safe_load(tmp_path / "absent.pt")


class _HandWritten(pyro.nn.PyroModule):
    def __init__(self, Z):
        super().__init__()
        self.layer = dgp.GPLayer(1, 1, inducing_points=Z)

    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.layer(X, plate=plate)
        with plate:
            return pyro.sample("y", pyro.distributions.Normal(f.squeeze(-1), 0.1), obs=y)


@pytest.mark.parametrize("config, word", [
    ({"guide": "meanfield"}, '"model"'),
    ({"model": {"num_layers": 1}}, '"guide"'),
    ({"model": {"num_layers": 1}, "guide": "nope"}, "'nope'"),
    ({"model": {"num_layers": 1, "layers": 1}, "guide": "meanfield"}, "['layers']"),
    ({"model": {"num_layers": 2}, "guide": "meanfield"}, "2 layers, the model has 1"),
    ({"model": {"architecture": "avdgp", "hidden_dims": []}, "guide": "meanfield"},
     "per-point"),
    ({"model": {"num_layers": 1}, "guide": "meanfield", "note": object()}, "config['note']"),
    ("meanfield", "must be a dict"),
])
def test_save_fit_refuses_what_load_fit_cannot_rebuild(tmp_path, config, word):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    path = tmp_path / "f.pt"
    with pytest.raises(ValueError) as info:
        save_fit(path, model, dgp.guides.MeanField(model), config)
    assert word in str(info.value)
    assert not path.exists()


def test_save_fit_refuses_a_model_it_cannot_rebuild(tmp_path):
    X, y = _data()
    model = _HandWritten(torch.linspace(-1, 1, 4, dtype=DT).unsqueeze(-1))
    with pytest.raises(TypeError, match="save_fit saves a DeepGP .* got a _HandWritten"):
        save_fit(tmp_path / "f.pt", model, dgp.guides.MeanField(model), {"guide": "meanfield"})
    assert not (tmp_path / "f.pt").exists()


def test_load_fit_names_a_checkpoint_and_other_inputs(tmp_path):
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=2, progress=False, final_elbo_particles=0,
            checkpoint=tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="is a training checkpoint .*not a fit saved by"):
        load_fit(tmp_path / "checkpoint.pt", X, y)
    save_fit(tmp_path / "fit.pt", model, guide,
             {"model": {"num_layers": 1, "num_inducing": 4}, "guide": "meanfield"})
    with pytest.raises(ValueError, match=r"pass '.*fit.pt', written beside it"):
        load_fit(tmp_path / "checkpoint.pt", X, y)
    X3 = torch.cat([X, X, X], -1)
    with pytest.raises(ValueError, match="has 1 inputs, X_train has 3 columns"):
        load_fit(tmp_path / "fit.pt", X3, y)
    state = torch.load(tmp_path / "fit.pt", weights_only=True)
    del state["input_dim"]  # a fit saved before the input count was recorded
    torch.save(state, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="does not match the model its config builds on these "
                                         "data \\(3 inputs\\)"):
        load_fit(tmp_path / "old.pt", X3, y)
    load_fit(tmp_path / "old.pt", X, y)
