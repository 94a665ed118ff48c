"""fit's learning-rate schedule, callbacks, early stopping on validation data, the warning of an
unstable run, progress lines off a terminal, and NumPy inputs."""

import io
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

import pyro_dgp as dgp
from pyro_dgp.train.monitor import TrainingInstabilityWarning, validation_loss
from pyro_dgp.train.progress import Progress


@pytest.fixture(scope="module")
def step():
    return dgp.datasets.step(n_train=60, n_test=40, seed=0)


def _small(data, layers=2, seed=0):
    pyro.set_rng_seed(seed)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=layers, num_inducing=8)
    return model, dgp.guides.MeanField(model)


def _state(model, guide):
    return {**{"m." + k: v.clone() for k, v in model.state_dict().items()},
            **{"g." + k: v.clone() for k, v in guide.state_dict().items()}}


def _recording_adam(seen):
    class Recording(torch.optim.Adam):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)
    return Recording


QUIET = dict(progress=False, final_elbo_particles=0)


# ----------------------------------------------------------------------- learning-rate schedule
def test_the_default_schedule_is_a_cosine_decay_to_a_tenth_of_lr(step):
    seen = []
    model, guide = _small(step, layers=1)
    dgp.fit(model, guide, step.X_train, step.y_train, num_steps=5, lr=0.02, seed=0,
            optimizer=_recording_adam(seen), **QUIET)
    # lr (0.1 + 0.9 (1 + cos(pi t / 4)) / 2) at t = 0..4
    assert seen == pytest.approx([0.02, 0.02 * (0.1 + 0.45 * (1 + math.sqrt(0.5))), 0.011,
                                  0.02 * (0.1 + 0.45 * (1 - math.sqrt(0.5))), 0.002], rel=1e-12)


def test_named_and_function_schedules(step):
    model, guide = _small(step, layers=1)
    runs = {}
    for name, kwargs in {"constant": dict(lr_schedule="constant"),
                         "cosine to 0.5": dict(lr_schedule="cosine", lr_decay=0.5),
                         "exponential": dict(lr_schedule="exponential"),
                         "function": dict(lr_schedule=lambda t, T: 1.0 / (1 + t))}.items():
        seen = runs[name] = []
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3, lr=0.02, seed=0,
                optimizer=_recording_adam(seen), **kwargs, **QUIET)
    assert runs["constant"] == [0.02] * 3
    assert runs["cosine to 0.5"] == pytest.approx([0.02, 0.015, 0.01], rel=1e-12)
    assert runs["exponential"] == pytest.approx([0.02, 0.02 * 0.1 ** 0.5, 0.002], rel=1e-12)
    assert runs["function"] == pytest.approx([0.02, 0.01, 0.02 / 3], rel=1e-12)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(lr_schedule="linear"), ValueError, "lr_schedule must be one of"),
    (dict(lr_schedule=3), TypeError, "lr_schedule must be one of"),
    (dict(lr_schedule="constant", lr_decay=0.5), ValueError, "lr_schedule='constant'"),
    (dict(lr_schedule=lambda t, T: 1.0, lr_decay=0.5), ValueError, "leave lr_decay out"),
    (dict(lr_schedule=lambda t, T: -1.0), ValueError, "positive and finite"),
])
def test_bad_schedules_are_refused_by_name(step, kwargs, error, match):
    model, guide = _small(step, layers=1)
    with pytest.raises(error, match=match):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2, **kwargs, **QUIET)


def test_a_resumed_run_warns_of_another_schedule(step, tmp_path):
    ckpt = tmp_path / "c.pt"
    model, guide = _small(step, layers=1)
    dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2, checkpoint=ckpt, **QUIET)
    with pytest.warns(UserWarning, match="resuming with lr_schedule=constant"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3, checkpoint=ckpt,
                resume=True, lr_schedule="constant", **QUIET)


# --------------------------------------------------------------------------------- callbacks
def test_callbacks_see_every_kth_step_and_the_last(step):
    seen = []
    model, guide = _small(step, layers=1)
    result = dgp.fit(model, guide, step.X_train, step.y_train, num_steps=10, lr=0.02,
                     callbacks=[seen.append], callback_every=3, **QUIET)
    assert [info.step for info in seen] == [3, 6, 9, 10]
    assert [info.loss for info in seen] == [result.losses[k - 1] for k in (3, 6, 9, 10)]
    N = len(step.y_train)
    assert seen[0].loss_per_point == pytest.approx(seen[0].loss / N)
    assert seen[0].model is model and seen[0].guide is guide and seen[0].validation is None
    assert seen[-1].lr == pytest.approx(0.002)
    assert result.stopped_at is None


def test_a_callback_that_returns_true_stops_the_run(step):
    def enough(info):
        return info.step >= 4

    model, guide = _small(step, layers=1)
    result = dgp.fit(model, guide, step.X_train, step.y_train, num_steps=10, callbacks=[enough],
                     **QUIET)
    assert result.stopped_at == 4 and len(result.losses) == 4
    assert "enough" in result.stop_reason


# -------------------------------------------------------------------------- early stopping
def test_early_stopping_stops_after_patience_and_restores_the_best_iterate(step):
    scores, snapshots = iter([3.0, 2.0, 1.0, 2.0, 1.5, 0.5]), []

    def score(model, guide):
        snapshots.append(_state(model, guide))
        return next(scores)

    model, guide = _small(step, layers=1)
    result = dgp.fit(model, guide, step.X_train, step.y_train, num_steps=40,
                     validation=score, validate_every=5, patience=2, **QUIET)
    # best at the 3rd evaluation (step 15); two evaluations without improvement: stop at 25
    assert result.validation == [(5, 3.0), (10, 2.0), (15, 1.0), (20, 2.0), (25, 1.5)]
    assert result.best_step == 15 and result.best_validation == 1.0
    assert result.stopped_at == 25 and len(result.losses) == 25
    assert "early stopping" in result.stop_reason
    best, now = snapshots[2], _state(model, guide)
    for k in best:
        assert torch.equal(now[k], best[k]), k


class _UnscaledGaussian(pyro.nn.PyroModule):
    """A hand-written model whose data plate has no full size (its likelihood scaled 1)."""

    def __init__(self, X):
        super().__init__()
        self.layer = dgp.GPLayer(1, 1, inducing_points=X[::8].clone())

    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.layer(X, plate=plate)
        with plate:
            return pyro.sample("y", pyro.distributions.Normal(f.squeeze(-1), 0.1), obs=y)


def test_validation_of_a_model_that_does_not_scale_its_data_is_refused(step):
    """Held-out rows are scored as a minibatch of the training points: a model whose data plate
    scales by 1 would weigh them V / N, so the run is refused before its first step."""
    model = _UnscaledGaussian(step.X_train)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match=r"validation=\(X_val, y_val\) scores 40 held-out rows"
                       r".*observation site 'y' by 1,.*pyro\.plate\('data', size=N"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3,
                validation=(step.X_test, step.y_test), **QUIET)
    # a validation function is the model's own business
    dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3, validate_every=1,
            validation=lambda m, g: 1.0, **QUIET)


@pytest.mark.parametrize("score", [float("nan"), torch.tensor([1.0, 2.0]), "low"])
def test_a_validation_score_that_is_not_one_finite_number_is_named(step, score):
    model, guide = _small(step, layers=1)
    with pytest.raises((ValueError, TypeError), match="validation: the score after step 1"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3, validate_every=1,
                validation=lambda m, g: score, **QUIET)


def test_the_validation_loss_is_the_objective_per_point_on_held_out_data(step):
    # one layer with the analytic-KL objective: no draws, so the loss of the training data
    # as validation data is the negative ELBO per point exactly
    model, guide = _small(step, layers=1)
    X, y = step.X_train, step.y_train
    result = dgp.fit(model, guide, X, y, num_steps=20, validation=(X, y), validate_every=5,
                     progress=False)
    assert [s for s, _ in result.validation] == [5, 10, 15, 20]
    elbo = dgp.evaluate_elbo(model, guide, X, y, num_particles=1).value
    assert result.best_validation == pytest.approx(-elbo / len(y), rel=1e-10)
    assert result.final_elbo == pytest.approx(elbo, rel=1e-10)
    model, guide = _small(step, layers=1)  # NumPy validation data: the same scores
    arrays = dgp.fit(model, guide, X, y, num_steps=20, validation=(X.numpy(), y.numpy()),
                     validate_every=5, **QUIET)
    assert arrays.validation == result.validation
    # more validation rows than training rows: evaluated in chunks of at most N, the same mean
    X2, y2 = torch.cat([X, X]), torch.cat([y, y])
    objective = dgp.infer.make_objective("auto", guide)
    assert validation_loss(model, guide, objective, X2, y2, len(y), seed=0) == pytest.approx(
        -elbo / len(y), rel=1e-10)


def test_early_stopping_resumes_exactly(step, tmp_path):
    X, y = step.X_train, step.y_train
    X_val, y_val = step.X_test, step.y_test
    kw = dict(num_steps=30, batch_size=20, seed=2, validation=(X_val, y_val), validate_every=3,
              patience=2, lr=0.05, **QUIET)
    model, guide = _small(step)
    full = dgp.fit(model, guide, X, y, **kw)
    reference = _state(model, guide)

    def interrupt(info):
        if info.step == 8:
            raise KeyboardInterrupt

    ckpt = tmp_path / "c.pt"
    model, guide = _small(step)
    with pytest.raises(KeyboardInterrupt):
        dgp.fit(model, guide, X, y, checkpoint=ckpt, callbacks=[interrupt], **kw)
    model, guide = _small(step)
    resumed = dgp.fit(model, guide, X, y, checkpoint=ckpt, resume=True, **kw)
    assert resumed.resumed_from == 8
    assert resumed.losses == full.losses and resumed.validation == full.validation
    assert (resumed.best_step, resumed.stopped_at) == (full.best_step, full.stopped_at)
    state = _state(model, guide)
    for k in reference:
        assert torch.equal(state[k], reference[k]), k
    model, guide = _small(step)
    with pytest.warns(UserWarning, match="validation every 4 steps; the checkpoint validated "
                      "every 3"):
        dgp.fit(model, guide, X, y, checkpoint=ckpt, resume=True, **{**kw, "validate_every": 4})


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(patience=3), "pass validation"),
    (dict(validation=([[0.0]], [0.0])), "X_val must be a torch.Tensor"),
    (dict(validation=(torch.zeros(4, 2, dtype=torch.float64),
                      torch.zeros(4, dtype=torch.float64))), "X_val has 2 columns"),
    (dict(validation=(torch.zeros(4, 1), torch.zeros(4))), "X_val is torch.float32"),
    (dict(validation=(torch.zeros(4, 1, dtype=torch.float64),
                      torch.zeros(3, dtype=torch.float64))), "y_val has 3 rows"),
    (dict(callbacks=["print"]), "callbacks must be a list of functions"),
    (dict(progress="yes"), "progress must be True, False or a number"),
])
def test_bad_watcher_settings_are_refused_by_name(step, kwargs, match):
    model, guide = _small(step, layers=1)
    with pytest.raises((TypeError, ValueError), match=match):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2,
                **{**QUIET, **kwargs})


# ---------------------------------------------------------------------- unstable training
def test_a_far_rise_of_the_smoothed_loss_warns_and_a_normal_run_does_not(step):
    X, y = step.X_train, step.y_train
    model, guide = _small(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingInstabilityWarning)
        dgp.fit(model, guide, X, y, num_steps=200, lr=0.02, **QUIET)
    model, guide = _small(step)
    with pytest.warns(TrainingInstabilityWarning, match="smoothed training loss rose"):
        result = dgp.fit(model, guide, X, y, num_steps=30, lr=50.0, **QUIET)
    assert result.losses[-1] > 5 * result.losses[0]


# -------------------------------------------------------------------------------- progress
def test_progress_off_a_terminal_prints_lines_not_a_bar(step, capsys):
    model, guide = _small(step, layers=1)
    dgp.fit(model, guide, step.X_train, step.y_train, num_steps=20, progress=True,
            final_elbo_particles=0)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "\r" not in err and len(lines) == 10, err
    assert lines[0].startswith("SVI step 2/20: elbo=") and lines[-1].startswith("SVI step 20/20")
    dgp.fit(model, guide, step.X_train, step.y_train, num_steps=20, progress=8,
            final_elbo_particles=0)
    assert [line.split(":")[0] for line in capsys.readouterr().err.strip().splitlines()] == [
        "SVI step 8/20", "SVI step 16/20", "SVI step 20/20"]


def test_progress_on_a_terminal_is_a_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = Progress(True, 3, 0, stream=stream)
    for k in (1, 2, 3):
        progress.update(k, {"elbo": "0.1/pt"})
    progress.close()
    assert progress.bar is not None and "\r" in stream.getvalue()


def test_no_module_imports_tqdm_auto():
    # tqdm.auto, imported in a Jupyter kernel without ipywidgets, warns TqdmWarning (Pyro's
    # own import of it, in pyro.infer.mcmc, does so first: that one is the environment's)
    package = Path(dgp.__file__).parent
    importing = re.compile(r"^\s*(from tqdm\.auto(notebook)? import|import tqdm\.auto)", re.M)
    assert not [p.name for p in package.rglob("*.py") if importing.search(p.read_text())]


# ------------------------------------------------------------------------------- inputs
def test_numpy_arrays_train_and_predict_as_their_float64_tensors(step):
    X, y = step.X_train, step.y_train
    model, guide = _small(step)
    from_tensors = dgp.fit(model, guide, X, y, num_steps=5, batch_size=20, seed=1, **QUIET)
    model, guide = _small(step)
    from_arrays = dgp.fit(model, guide, X.numpy(), y.numpy(), num_steps=5, batch_size=20,
                          seed=1, **QUIET)
    assert from_arrays.losses == from_tensors.losses
    pred = dgp.predict(model, guide, step.X_test.numpy(), num_samples=4, seed=0)
    assert pred.mean.dtype == torch.float64
    torch.testing.assert_close(
        pred.mean, dgp.predict(model, guide, step.X_test, num_samples=4, seed=0).mean)


def test_the_builders_take_numpy_arrays_as_their_float64_tensors(step):
    X, y = step.X_train, step.y_train
    for build in (dgp.DeepGP.regression, dgp.DeepGP.classification):
        labels = (y > 0).numpy() if build == dgp.DeepGP.classification else y.numpy()
        from_arrays = build(X.numpy(), labels, num_inducing=5, seed=0)
        from_tensors = build(X, torch.as_tensor(labels), num_inducing=5, seed=0)
        assert {p.dtype for p in from_arrays.parameters()} == {torch.float64}
        for a, b in zip(from_arrays.parameters(), from_tensors.parameters(), strict=True):
            torch.testing.assert_close(a, b)


def test_a_batch_size_above_n_warns_full_batch(step):
    model, guide = _small(step, layers=1)
    N = len(step.y_train)
    with pytest.warns(UserWarning, match=f"batch_size={N + 1} is more than the {N} training"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=1, batch_size=N + 1,
                **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=1, batch_size=N, **QUIET)


def test_a_memory_map_is_still_read_as_a_stream(step, tmp_path):
    np.save(tmp_path / "X.npy", step.X_train.numpy())
    np.save(tmp_path / "y.npy", step.y_train.numpy())
    X = np.load(tmp_path / "X.npy", mmap_mode="r")
    y = np.load(tmp_path / "y.npy", mmap_mode="r")
    model, guide = _small(step, layers=1)
    result = dgp.fit(model, guide, X, y, num_steps=2, objective=Trace_ELBO(max_plate_nesting=1),
                     **QUIET)
    assert len(result.losses) == 2


@pytest.mark.slow
def test_the_demos_gp_ends_converged_under_the_default_schedule():
    # the demo's one-layer GP on the step function, lr 0.02, 1,500 steps: at a constant rate
    # its ELBO fell from +0.09 to -1.7 per point near step 1,000 and had not recovered
    data = dgp.datasets.step(n_train=100, n_test=200, seed=0)
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=1, num_inducing=20)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=1500, lr=0.02,
                     seed=0, threads=1, **QUIET)
    tail = torch.tensor(result.losses[-500:]) / 100
    assert float(tail.max() - tail.min()) < 0.1  # no spike in the last third
    assert float(tail[-50:].mean()) <= float(tail.min()) + 0.01  # ends at its best


def test_a_loss_past_1e154_is_tracked_not_an_overflow_error():
    """The smoothed square of a residual past 1e154 is inf (then a warning), not Python's
    OverflowError out of fit (a three-layer Chain started at 1e-5 reached 1e200)."""
    from pyro_dgp.train.monitor import LossMonitor

    monitor = LossMonitor(num_data=1)
    for loss in (10.0, 9.0, 1e200, 1e300):
        monitor.update(loss)
    assert math.isinf(monitor.noise) and monitor.rise() > 1e150
