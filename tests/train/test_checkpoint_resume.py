"""Resuming from a checkpoint: refused on other data or past ``num_steps``, warned when a
setting that makes the run inexact changed or when there is no checkpoint to resume; old
checkpoints that do not record the settings still resume."""

import warnings

import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.train.saved import save_fit


@pytest.fixture(scope="module")
def data():
    return dgp.datasets.step(n_train=40, n_test=10, seed=0)


def _run(data, ckpt, n=None, **kwargs):
    X, y = data.X_train[:n], data.y_train[:n]
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    # a constant rate: a checkpoint of 4 steps resumes to 6 as their continuation (a decaying
    # schedule depends on num_steps: test_another_length_under_a_decaying_schedule_is_warned)
    kw = dict(num_steps=6, batch_size=16, seed=1, progress=False, final_elbo_particles=0,
              checkpoint=ckpt, lr_schedule="constant")
    return dgp.fit(model, guide, X, y, **{**kw, **kwargs})


def _resume_warnings(data, ckpt, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _run(data, ckpt, resume=True, **kwargs)
    return result, [w for w in caught if issubclass(w.category, UserWarning)]


@pytest.fixture
def ckpt(data, tmp_path):
    path = tmp_path / "run.pt"
    _run(data, path, num_steps=4)
    return path


def test_the_same_settings_resume_without_a_warning(data, ckpt):
    result, caught = _resume_warnings(data, ckpt)
    assert result.resumed_from == 4 and len(result.losses) == 6
    assert not caught


@pytest.mark.parametrize("setting, value", [("batch_size", 8), ("seed", 2), ("lr", 0.02)])
def test_a_changed_setting_is_warned_at_the_users_call(data, ckpt, setting, value):
    result, caught = _resume_warnings(data, ckpt, **{setting: value})
    assert result.resumed_from == 4
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{setting}={value}" in message and "checkpoint was written with" in message
    assert caught[0].filename == __file__


def test_a_missing_checkpoint_is_warned_and_training_starts_at_step_0(data, tmp_path):
    path = tmp_path / "none.pt"
    result, caught = _resume_warnings(data, path)
    assert result.resumed_from is None and len(result.losses) == 6
    assert len(caught) == 1 and "no checkpoint at" in str(caught[0].message)
    assert str(path) in str(caught[0].message) and "step 0" in str(caught[0].message)
    assert caught[0].filename == __file__


def test_num_steps_below_the_checkpoints_steps_is_refused(data, ckpt):
    before = torch.load(ckpt, weights_only=True)
    with pytest.raises(ValueError, match=r"num_steps=2 is below the 4 steps .*num_steps >= 4"):
        _run(data, ckpt, num_steps=2, resume=True)
    after = torch.load(ckpt, weights_only=True)  # the checkpoint is left as it was
    assert after["step"] == 4 and after["losses"] == before["losses"]
    result = _run(data, ckpt, num_steps=4, resume=True)  # its own length: nothing to run
    assert result.num_steps == 4 and len(result.losses) == 4


def test_other_data_is_refused_naming_both_sizes(data, ckpt):
    with pytest.raises(ValueError, match=r"N=40 points, this run has N=30"):
        _run(data, ckpt, n=30, resume=True)


def test_a_checkpoint_without_the_settings_still_resumes(data, ckpt):
    state = torch.load(ckpt, weights_only=True)
    assert (state["num_data"], state["batch_size"], state["seed"]) == (40, 16, 1)
    for key in ("num_data", "batch_size", "seed", "lr_schedule", "lr_decay", "num_steps"):
        del state[key]
    torch.save(state, ckpt)
    result, caught = _resume_warnings(data, ckpt, n=30, batch_size=8, seed=2)
    assert result.resumed_from == 4 and not caught


def test_another_length_under_a_decaying_schedule_is_warned(data, tmp_path):
    path = tmp_path / "cosine.pt"
    _run(data, path, num_steps=4, lr_schedule=None)
    result, caught = _resume_warnings(data, path, lr_schedule=None)
    assert result.resumed_from == 4 and len(caught) == 1
    message = str(caught[0].message)
    assert "num_steps=6" in message and "written with num_steps=4" in message
    assert caught[0].filename == __file__
    _run(data, path, num_steps=4, lr_schedule=None)  # the same length: no warning
    result, caught = _resume_warnings(data, path, num_steps=4, lr_schedule=None)
    assert result.resumed_from == 4 and not caught


def test_a_checkpoint_from_before_schedules_resumes_as_a_constant_rate(data, ckpt):
    """A checkpoint that records no schedule was written at a constant rate: resuming it under
    the default cosine schedule is warned, at ``lr_schedule='constant'`` it is not."""
    from pyro_dgp.train.checkpoint import atomic_save

    state = torch.load(ckpt, weights_only=True)
    for key in ("lr_schedule", "lr_decay", "num_steps"):
        del state[key]
    atomic_save(ckpt, state)
    result, caught = _resume_warnings(data, ckpt)
    assert result.resumed_from == 4 and not caught
    atomic_save(ckpt, state)
    result, caught = _resume_warnings(data, ckpt, lr_schedule=None)
    assert result.resumed_from == 4 and len(caught) == 1
    assert "lr_schedule=cosine; the checkpoint was written with lr_schedule=constant" in str(
        caught[0].message)


def test_another_function_schedule_is_warned(data, tmp_path):
    path = tmp_path / "function.pt"

    def halving(step, num_steps):
        return 0.5 ** step

    def steady(step, num_steps):
        return 1.0

    _run(data, path, num_steps=4, lr_schedule=halving)
    result, caught = _resume_warnings(data, path, num_steps=4, lr_schedule=halving)
    assert result.resumed_from == 4 and not caught
    result, caught = _resume_warnings(data, path, num_steps=4, lr_schedule=steady)
    assert len(caught) == 1 and "steady" in str(caught[0].message)


def test_a_saved_fit_is_not_taken_for_a_checkpoint(data, tmp_path):
    X, y = data.X_train, data.y_train
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=1, progress=False, final_elbo_particles=0)
    save_fit(tmp_path / "fit.pt", model, guide,
             {"model": {"num_layers": 1, "num_inducing": 5}, "guide": "meanfield"})
    with pytest.raises(ValueError, match="is a fit saved by save_fit .* not a training "
                                         "checkpoint"):
        _run(data, tmp_path / "fit.pt", resume=True)


def test_a_checkpoint_of_another_model_or_guide_is_named(data, ckpt):
    X, y = data.X_train, data.y_train
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=3)
    with pytest.raises(ValueError, match="holds another model than this run's DeepGP .*size "
                                         "mismatch"):
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=6, batch_size=16, seed=1,
                progress=False, checkpoint=ckpt, resume=True, lr_schedule="constant")
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    with pytest.raises(ValueError, match="holds another guide than this run's Coupled"):
        dgp.fit(model, dgp.guides.Coupled(model), X, y, num_steps=6, batch_size=16, seed=1,
                progress=False, checkpoint=ckpt, resume=True, lr_schedule="constant")


def test_seed_none_resumes_with_the_checkpoints_seed(data, ckpt, tmp_path):
    """The checkpoint was written with seed=1: resumed with seed=None, the run is the
    uninterrupted seed-1 run (its final ELBO's draws are seeded by 1 too), unwarned, and its
    checkpoint still records seed 1."""
    whole = _run(data, tmp_path / "whole.pt", final_elbo_particles=2)
    result, caught = _resume_warnings(data, ckpt, seed=None, final_elbo_particles=2)
    assert not caught
    assert result.resumed_from == 4 and result.losses == whole.losses
    assert result.final_elbo == whole.final_elbo
    assert torch.load(ckpt, weights_only=True)["seed"] == 1
