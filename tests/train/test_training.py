"""Training works, is reproducible, resumes exactly, and guards against divergence."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO

import pyro_dgp as dgp
from pyro_dgp.infer.elbo import AnalyticKL_ELBO
from pyro_dgp.linalg import CholeskyError

DT = torch.float64


@pytest.fixture(scope="module")
def step():
    return dgp.datasets.step(n_train=100, n_test=200, seed=0)


def _fit_and_score(data, num_layers, steps, **kwargs):
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=num_layers,
                                  num_inducing=20, **kwargs)
    guide = dgp.guides.MeanField(model)
    if steps:
        dgp.fit(model, guide, data.X_train, data.y_train, num_steps=steps, lr=0.02,
                progress=False)
    pred = dgp.predict(model, guide, data.X_test, num_samples=100)
    return dgp.metrics.nll(pred, data.y_test)


@pytest.mark.slow  # about 6 s: three fits
def test_two_layers_beat_one_on_a_step_and_both_beat_a_bad_initialisation(step):
    deep = _fit_and_score(step, 2, 600)
    shallow = _fit_and_score(step, 1, 600)
    bad = _fit_and_score(step, 2, 0, lengthscale=100.0, noise_variance=10.0)
    print(f"test NLL: DGP2 {deep:.3f}  GP {shallow:.3f}  bad init {bad:.3f}")
    assert deep < shallow - 0.1
    assert shallow < bad - 0.5


def _small(data, seed=0, **kwargs):
    pyro.set_rng_seed(seed)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=8,
                                  **kwargs)
    return model, dgp.guides.MeanField(model)


def _state(model, guide):
    return {**{"m." + k: v.clone() for k, v in model.state_dict().items()},
            **{"g." + k: v.clone() for k, v in guide.state_dict().items()}}


def test_same_seed_same_run(step):
    runs = []
    for _ in range(2):
        model, guide = _small(step)
        r = dgp.fit(model, guide, step.X_train, step.y_train, num_steps=15, batch_size=32,
                    seed=3, progress=False)
        runs.append(r.losses)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("lr_decay", [None, 1.0, 0.1])  # None: the default cosine schedule
def test_checkpoint_resume_is_exact(step, tmp_path, lr_decay):
    X, y = step.X_train, step.y_train
    kw = dict(num_steps=20, batch_size=32, seed=5, progress=False, lr_decay=lr_decay)
    model, guide = _small(step)
    full = dgp.fit(model, guide, X, y, objective=Trace_ELBO(max_plate_nesting=1), **kw)
    reference = _state(model, guide)

    ckpt = tmp_path / "fit.pt"
    model, guide = _small(step)
    # interrupted at step 10 of 20 (so the learning-rate schedule is the 20-step one)
    with pytest.raises(KeyboardInterrupt):
        dgp.fit(model, guide, X, y, checkpoint=ckpt,
                objective=_FailingELBO(at=11, exc=KeyboardInterrupt()), **kw)
    model, guide = _small(step)  # a fresh process would rebuild the objects
    resumed = dgp.fit(model, guide, X, y, checkpoint=ckpt, resume=True,
                      objective=Trace_ELBO(max_plate_nesting=1), **kw)
    assert resumed.resumed_from == 10
    assert resumed.losses == full.losses
    state = _state(model, guide)
    assert state.keys() == reference.keys()
    for k in state:
        assert torch.equal(state[k], reference[k]), k


class _FailingELBO(Trace_ELBO):
    """Trace_ELBO whose loss turns NaN (or raises KeyboardInterrupt) at a given call."""

    def __init__(self, at, exc=None):
        super().__init__(max_plate_nesting=1)
        self.at, self.calls, self.exc = at, 0, exc

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self.calls += 1
        loss = super().differentiable_loss(model, guide, *args, **kwargs)
        if self.calls == self.at:
            if self.exc is not None:
                raise self.exc
            return loss * math.nan
        return loss


@pytest.mark.filterwarnings("ignore:Encountered NaN")
@pytest.mark.parametrize("failure", ["nan", "cholesky"])
def test_nan_guard_stops_and_restores_the_last_good_state(step, tmp_path, failure):
    """A NaN loss, or the Cholesky failure that non-finite parameters cause first (at a
    constant rate: a run of 3 steps then takes the same steps as the first 3 of 10)."""
    X, y = step.X_train, step.y_train
    model, guide = _small(step)
    # the loss turns NaN at step 4 (the ELBO's 5th call): the last parameters with a finite
    # loss are those at the start of step 3, i.e. after 3 updates
    exc = None if failure == "nan" else CholeskyError("layer 'layer1': K contains NaN or inf")
    with pytest.raises(dgp.TrainingDivergedError, match="at step 4") as info:
        dgp.fit(model, guide, X, y, num_steps=10, seed=1, progress=False,
                objective=_FailingELBO(at=5, exc=exc), checkpoint=tmp_path / "c.pt",
                lr_schedule="constant")
    if exc is not None:
        assert info.value.__cause__ is exc and "layer 'layer1'" in str(info.value)
    model_ref, guide_ref = _small(step)
    dgp.fit(model_ref, guide_ref, X, y, num_steps=3, seed=1, progress=False,
            objective=Trace_ELBO(max_plate_nesting=1), lr_schedule="constant")
    good, state = _state(model_ref, guide_ref), _state(model, guide)
    for k in good:
        assert torch.equal(state[k], good[k]), k
    saved = torch.load(tmp_path / "c.pt", weights_only=False)
    assert saved["step"] == 4 and len(saved["losses"]) == 4


@pytest.mark.filterwarnings("ignore:Encountered NaN")
def test_a_divergence_inside_a_pyro_trace_names_the_error_without_the_shape_table(step):
    """A Cholesky failure raised inside the model reaches fit wrapped by Pyro's traces (the
    message followed by a table of site shapes): the divergence names the error itself, and
    chains to it."""
    original = CholeskyError("layer 'layer2': the covariance matrix contains NaN or inf")

    def failing():
        pyro.sample("x", dist.Normal(0.0, 1.0))
        raise original

    with pytest.raises(CholeskyError) as wrapped:
        pyro.poutine.trace(failing).get_trace()
    assert "Trace Shapes" in str(wrapped.value) and wrapped.value.__cause__ is original
    model, guide = _small(step)
    with pytest.raises(dgp.TrainingDivergedError, match="at step 2") as info:
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=5, progress=False,
                objective=_FailingELBO(at=3, exc=wrapped.value))
    assert "layer 'layer2'" in str(info.value) and "Trace Shapes" not in str(info.value)
    assert info.value.__cause__ is original


def test_a_cholesky_failure_at_the_first_step_is_not_called_a_divergence(step):
    model, guide = _small(step)
    exc = CholeskyError("layer 'layer1': the covariance matrix is not positive definite")
    with pytest.raises(CholeskyError, match="layer 'layer1'"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=5, progress=False,
                objective=_FailingELBO(at=1, exc=exc))


@pytest.mark.filterwarnings("ignore:Encountered NaN")
def test_resume_after_divergence_takes_the_new_learning_rate(step, tmp_path):
    """The divergence message advises a smaller lr: a resumed run must use it (the
    optimizer's saved state would bring back the old one), and say it is not exact."""
    X, y = step.X_train, step.y_train
    ckpt = tmp_path / "div.pt"
    model, guide = _small(step)
    with pytest.raises(dgp.TrainingDivergedError):
        dgp.fit(model, guide, X, y, num_steps=10, seed=1, lr=0.5, progress=False,
                objective=_FailingELBO(at=5), checkpoint=ckpt, lr_schedule="constant")
    model, guide = _small(step)
    seen = []

    class _RecordLR(torch.optim.Adam):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    with pytest.warns(UserWarning, match="checkpoint was written with lr=0.5"):
        r = dgp.fit(model, guide, X, y, num_steps=10, seed=1, lr=0.01, progress=False,
                    checkpoint=ckpt, resume=True, optimizer=_RecordLR, lr_schedule="constant")
    assert r.resumed_from == 4 and seen == [0.01] * 6


def test_unseeded_runs_draw_their_own_minibatches(step):
    """seed=None leaves the random streams as they are: the minibatch stream follows
    torch's global one, so unseeded runs differ and a global seed reproduces them."""

    class _RecordBatches(Trace_ELBO):
        def differentiable_loss(self, model, guide, X, y):
            batches.append(X.clone())
            return super().differentiable_loss(model, guide, X, y)

    runs = []
    for global_seed in (0, 1, 0):
        batches = []
        model, guide = _small(step)
        torch.manual_seed(global_seed)
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=3, batch_size=16,
                seed=None, progress=False, objective=_RecordBatches(max_plate_nesting=1))
        runs.append(torch.stack(batches))
    assert torch.equal(runs[0], runs[2]) and not torch.equal(runs[0], runs[1])


def _interrupted_at_step_5(step, ckpt):
    """A 10-step fit (seed 2) interrupted by Ctrl-C in its 6th step, checkpointing to ``ckpt``."""
    model, guide = _small(step)
    with pytest.raises(KeyboardInterrupt):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=10, seed=2, progress=False,
                checkpoint=ckpt, objective=_FailingELBO(at=6, exc=KeyboardInterrupt()))


def test_interrupt_saves_a_checkpoint_that_resumes(step, tmp_path):
    X, y = step.X_train, step.y_train
    ckpt = tmp_path / "int.pt"
    _interrupted_at_step_5(step, ckpt)
    saved = torch.load(ckpt, weights_only=False)
    assert saved["step"] == 5 and len(saved["losses"]) == 5
    model, guide = _small(step)
    r = dgp.fit(model, guide, X, y, num_steps=10, seed=2, progress=False, checkpoint=ckpt,
                resume=True)
    assert r.resumed_from == 5 and len(r.losses) == 10


def test_float32_runs_in_float32(step):
    data = step.to(dtype=torch.float32)
    model, guide = _small(data)
    r = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=20, progress=False)
    assert all(math.isfinite(v) for v in r.losses)
    params = list(model.parameters()) + list(guide.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    pred = dgp.predict(model, guide, data.X_test, num_samples=10)
    assert pred.mean.dtype == torch.float32


def test_minibatches_scale_the_likelihood(step):
    X, y = step.X_train, step.y_train
    model, guide = _small(step)
    with torch.no_grad():
        full = [Trace_ELBO().loss(model, guide, X, y) for _ in range(200)]
        model.num_data = len(y)
        h1 = [Trace_ELBO().loss(model, guide, X[:50], y[:50]) for _ in range(100)]
        h2 = [Trace_ELBO().loss(model, guide, X[50:], y[50:]) for _ in range(100)]
    # minibatch estimates are unbiased for the full-data loss (averaged over the two halves:
    # a stratified mean, whose variance is that of each half's mean, quartered)
    f = torch.tensor(full, dtype=torch.float64)
    h1, h2 = torch.tensor(h1, dtype=torch.float64), torch.tensor(h2, dtype=torch.float64)
    h = (h1.mean() + h2.mean()) / 2
    se = math.sqrt(float(f.var() / len(f) + (h1.var() / len(h1) + h2.var() / len(h2)) / 4))
    # the collapsed guide's loss has no Monte Carlo noise here: se is rounding, and the sums
    # over 100 and 50 points round differently on different vector units
    rounding = 1e-12 * abs(float(h))
    assert abs(float(f.mean() - h)) < 4 * se + rounding
    assert abs(float(h1.mean() - h2.mean())) > 4 * se + rounding  # the halves differ


def test_classification_on_a_2d_toy():
    data = dgp.datasets.classification_2d(n_train=150, n_test=200, seed=0)
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.classification(data.X_train, data.y_train, num_layers=2,
                                      num_inducing=20)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=400, lr=0.02, progress=False)
    pred = dgp.predict(model, guide, data.X_test, num_samples=50)
    acc, auc = dgp.metrics.accuracy(pred, data.y_test), dgp.metrics.auc(pred, data.y_test)
    print(f"accuracy {acc:.3f} AUC {auc:.3f}")
    assert acc > 0.85 and auc > 0.9


def test_student_t_regression_trains(step):
    model, guide = _small(step, likelihood="studentt")
    r = dgp.fit(model, guide, step.X_train, step.y_train, num_steps=150, lr=0.02,
                progress=False)
    assert r.losses[-1] < r.losses[0]
    pred = dgp.predict(model, guide, step.X_test, num_samples=20)
    assert torch.isfinite(pred.log_prob(step.y_test)).all()


def test_lr_decay_schedule_and_bad_values(step):
    X, y = step.X_train, step.y_train
    seen = []

    class Recording(torch.optim.Adam):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    model, guide = _small(step)
    dgp.fit(model, guide, X, y, num_steps=5, lr=0.02, lr_decay=0.01, optimizer=Recording,
            seed=0, progress=False)
    expected = [0.02 * 0.01 ** (t / 4) for t in range(5)]
    assert seen == pytest.approx(expected, rel=1e-12)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="lr_decay"):
            dgp.fit(model, guide, X, y, num_steps=2, lr_decay=bad, progress=False)


@pytest.mark.parametrize("likelihood", ["gaussian", "studentt"])
@pytest.mark.parametrize("guide_kind", ["meanfield", "sampled-u", "coupled", "chain",
                                        "autonormal"])
def test_pyro_svi_sees_and_trains_every_parameter(step, likelihood, guide_kind):
    """With Pyro's own SVI, every parameter of model and guide is collected by SVI.step (it
    optimises only parameters met as pyro.param statements while the loss is computed) and
    moves. The likelihood's noise is read where the expected log-likelihood is summed, after
    the model's call: it must be stated inside the call too."""
    from pyro import poutine
    from pyro.infer import SVI
    from pyro.infer.autoguide import AutoNormal

    X, y = step.X_train[:40], step.y_train[:40]
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, likelihood=likelihood)
    guide = {
        "meanfield": lambda: dgp.guides.MeanField(model),
        "sampled-u": lambda: dgp.guides.MeanField(model, collapsed=False),
        "coupled": lambda: dgp.guides.Coupled(model),
        "chain": lambda: dgp.guides.Chain(model),
        "autonormal": lambda: dgp.complete(AutoNormal(dgp.inducing_only(model)), model),
    }[guide_kind]()
    elbo = dgp.infer.objectives.make_objective("auto", guide)
    with torch.no_grad():
        guide(X, y)
    params = {id(p): n for m in (model, guide) for n, p in m.named_parameters()
              if p.requires_grad}
    before = {n: p.detach().clone() for m in (model, guide) for n, p in m.named_parameters()}
    with pyro.validation_enabled(False):
        with poutine.trace(param_only=True) as capture:
            elbo.loss(model, guide, X, y)
    seen = {id(site["value"].unconstrained()) for site in capture.trace.nodes.values()}
    assert sorted(n for i, n in params.items() if i not in seen) == []
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), elbo)
    for _ in range(2):
        svi.step(X, y)
    after = dict(n_p for m in (model, guide) for n_p in m.named_parameters())
    frozen = [n for i, n in params.items() if torch.equal(after[n].detach(), before[n])]
    assert frozen == []


def bayesian_noise_model(X, y, noise=0.9, init_scale=0.01):
    """A 1-layer regression whose Gaussian noise variance is a PyroSample (prior median
    0.018), with a completed AutoNormal whose noise location is set to ``noise``."""
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroSample

    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    model.likelihood.variance = PyroSample(
        dist.LogNormal(torch.tensor(-4.0, dtype=DT), torch.tensor(0.1, dtype=DT)))
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model), init_scale=init_scale), model)
    with torch.no_grad():
        guide(X, y)
        located = [p for n, p in guide.inner.named_parameters()
                   if n.startswith("locs") and "likelihood.variance" in n]
        assert len(located) == 1
        located[0].fill_(math.log(noise))
    return model, guide


def test_bayesian_noise_of_the_library_likelihood_is_the_guides_draw(step):
    """A PyroSample noise variance on the Gaussian likelihood: the expected log-likelihood and
    the observation draws use the guide's value of it, not a fresh prior draw (they are
    evaluated after the model's call, where PyroModule would draw from the prior), in the
    one-pass model trace and in the replayed one."""
    from pyro import poutine

    X, y = step.X_train[:30], step.y_train[:30]
    model, guide = bayesian_noise_model(X, y)
    with torch.no_grad():
        name = next(n for n, site in poutine.trace(guide).get_trace(X, y).nodes.items()
                    if site["type"] == "sample" and n.endswith("likelihood.variance"))
        pyro.set_rng_seed(0)
        guide_trace, one_pass = guide.traces(X, y)
        replayed = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(X, y)
        noise = guide_trace.nodes[name]["value"]
        assert 0.8 < float(noise) < 1.0
        for trace in (one_pass, replayed):
            fn = trace.nodes["y"]["fn"]
            ref = -0.5 * (math.log(2 * math.pi) + noise.log()
                          + ((y - fn.loc).square() + fn.var) / noise)
            torch.testing.assert_close(fn.log_prob(y), ref, rtol=1e-12, atol=0)
        # draws of y: residuals standardised by var + the guide's noise are unit normal
        draws = torch.stack([fn.sample() for _ in range(200)])  # (200, 30)
        z = (draws - fn.loc) / (fn.var + noise).sqrt()
        assert float(z.std()) == pytest.approx(1.0, abs=4 / (2 * z.numel()) ** 0.5)


def test_seconds_count_the_steps_of_every_call_of_a_resumed_run(step, tmp_path):
    """A run cut short and resumed reports the time of all its steps (a per-step time from
    the last call alone would divide few steps' time by all of them)."""
    X, y = step.X_train, step.y_train
    ckpt = tmp_path / "t.pt"
    _interrupted_at_step_5(step, ckpt)
    first = torch.load(ckpt, weights_only=False)["seconds"]
    assert first > 0
    model, guide = _small(step)
    r = dgp.fit(model, guide, X, y, num_steps=10, seed=2, progress=False, checkpoint=ckpt,
                resume=True)
    assert r.seconds > first
    saved = torch.load(ckpt, weights_only=False)["seconds"]
    assert first < saved <= r.seconds  # the checkpoint is written before the run returns
    # resumed at its end: no step runs, the time is the checkpoint's (not r's, which also
    # counts writing that checkpoint)
    again = dgp.fit(model, guide, X, y, num_steps=10, seed=2, progress=False, checkpoint=ckpt,
                    resume=True)
    assert again.resumed_from == 10 and saved <= again.seconds < saved + 5


class _NaNGradientELBO(AnalyticKL_ELBO):
    """A finite loss whose gradient is NaN at call ``at``: ``0 * sqrt(0 * p)`` is 0 forward and
    ``0 * inf`` backward."""

    def __init__(self, at: int, param, **kwargs):
        super().__init__(**kwargs)
        self.at, self.calls, self.param = at, 0, param

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self.calls += 1
        loss = super().differentiable_loss(model, guide, *args, **kwargs)
        if self.calls == self.at:
            loss = loss + 0 * (0 * self.param).sum().sqrt()
        return loss


@pytest.mark.filterwarnings("ignore:Encountered NaN")
def test_resume_after_a_nan_gradient_goes_on(step, tmp_path):
    """A NaN gradient poisons Adam's moments as well as the parameters: the divergence restores
    the parameters and clears the moments' non-finite entries, so the resumed run (the remedy
    the error message gives) trains on instead of diverging again at once."""
    X, y = step.X_train, step.y_train
    ckpt = tmp_path / "nan_grad.pt"
    model, guide = _small(step)
    guide(X, y)
    param = next(guide.parameters())
    with pytest.raises(dgp.TrainingDivergedError, match="at step 4"):
        dgp.fit(model, guide, X, y, num_steps=10, seed=1, progress=False,
                objective=_NaNGradientELBO(at=4, param=param), checkpoint=ckpt)
    saved = torch.load(ckpt, weights_only=False)
    for state in saved["optimizer"]["state"].values():
        for value in state.values():
            assert torch.isfinite(value).all()
    model, guide = _small(step)
    with pytest.warns(UserWarning, match="checkpoint was written with lr"):
        r = dgp.fit(model, guide, X, y, num_steps=10, seed=1, lr=0.005, progress=False,
                    checkpoint=ckpt, resume=True)
    assert r.resumed_from == 4 and all(math.isfinite(v) for v in r.losses)


def test_cuda_graph_option_needs_cuda_data_and_a_plain_step(step):
    """``cuda_graph=True`` names what it needs (the GPU tests run it: tests/train/test_cuda.py)."""
    model = dgp.DeepGP.regression(step.X_train, step.y_train, num_layers=2, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    with pytest.raises(ValueError, match="CUDA device; it is on cpu"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2, cuda_graph=True)
    with pytest.raises(ValueError, match="does not combine with natural_gradient"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2, cuda_graph=True,
                natural_gradient=0.5)
    with pytest.raises(ValueError, match="does not combine with distributed"):
        dgp.fit(model, guide, step.X_train, step.y_train, num_steps=2, cuda_graph=True,
                distributed=True)


class EagerReplays:
    """A stand-in for :class:`~pyro_dgp.train.cuda_graph.GraphedLoss` on the CPU: each
    "replay" evaluates the loss and its gradient eagerly, as the graph would compute them; a
    failed Cholesky factor gives a NaN loss, as inside a graph. ``poison``: the replays'
    gradients are NaN (a graph gone wrong); ``nan_replays``: the replays (counted from 0) whose
    loss is NaN after they used their draws, as a graph's failed factor would; ``nan_reruns``:
    whether the eager reruns of those give NaN gradients too."""

    poison = False
    nan_replays: frozenset = frozenset()
    nan_reruns = False

    def __init__(self, loss_fn, params, example_inputs):
        self.loss_fn, self.params = loss_fn, list(params)
        self.calls, self.nan_last = 0, False

    def fits(self, *inputs):
        return True

    def eager(self, *inputs):
        for p in self.params:
            p.grad = None
        loss = self.loss_fn(*inputs)
        loss.backward()
        if self.nan_last and self.nan_reruns:
            for p in self.params:
                p.grad.fill_(math.nan)
        return loss.detach()

    def __call__(self, *inputs):
        self.nan_last, self.calls = self.calls in self.nan_replays, self.calls + 1
        try:
            loss = self.eager(*inputs)
        except CholeskyError:
            return torch.tensor(math.nan)
        for p in self.params:
            if self.poison and p.grad is not None:
                p.grad.fill_(math.nan)
        return torch.tensor(math.nan) if self.nan_last else loss


@pytest.fixture
def stand_in_graph(monkeypatch):
    """``fit(cuda_graph=True)`` on the CPU, its graph replaced by :class:`EagerReplays`
    (tests/train/test_cuda.py runs the real graph)."""
    import contextlib

    import pyro_dgp.train.cuda_graph as cuda_graph
    import pyro_dgp.train.trainer as trainer
    import pyro_dgp.train.training as training

    monkeypatch.setattr(training, "check_graph_options", lambda *a: None)
    monkeypatch.setattr(trainer, "side_stream", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cuda_graph, "GraphedLoss", EagerReplays)
    return EagerReplays


def _small_fit(data, **kwargs):
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=5,
                                  seed=0)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=6, progress=False,
                     final_elbo_particles=0, batch_size=50, **kwargs)
    return result, guide


@pytest.mark.parametrize("nan_replays,graph_steps", [(frozenset(), 5), (frozenset({1, 2}), 3)])
def test_fit_with_replayed_steps_runs_the_eager_run(step, stand_in_graph, monkeypatch,
                                                    nan_replays, graph_steps):
    """fit's side of the graph: the first step eager, every later one a replay, the losses,
    the optimiser's updates and the batches those of the eager run. A NaN replay (a factor
    that failed inside the graph) is run again eagerly with the draws the replay used, so the
    run stays the eager run, loss for loss."""
    monkeypatch.setattr(stand_in_graph, "nan_replays", nan_replays)
    eager, g_eager = _small_fit(step)
    graph, g_graph = _small_fit(step, cuda_graph=True)
    assert graph.graph_steps == graph_steps
    assert graph.losses == eager.losses
    for a, b in zip(g_eager.parameters(), g_graph.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_replay_that_misleads_the_optimiser_is_taken_back(step, stand_in_graph,
                                                             monkeypatch):
    """The guard: replays with the right loss but NaN gradients make the next loss NaN even
    eagerly; fit takes that update back, warns, and trains eagerly to the end."""
    monkeypatch.setattr(stand_in_graph, "poison", True)
    with pytest.warns(UserWarning, match="update was taken back"):
        result, guide = _small_fit(step, cuda_graph=True)
    assert result.graph_steps == 1 and len(result.losses) == 6
    assert all(math.isfinite(loss) for loss in result.losses)
    assert all(torch.isfinite(p).all() for p in guide.parameters())


def test_a_run_that_diverges_after_an_eager_rerun_stops(step, stand_in_graph, monkeypatch):
    """The guard takes back only an update that came from a replay: an update from the eager
    rerun of a NaN replay that makes the next loss NaN stops the run, as an eager run stops."""
    monkeypatch.setattr(stand_in_graph, "nan_replays", frozenset({1, 2, 3, 4}))
    monkeypatch.setattr(stand_in_graph, "nan_reruns", True)
    with pytest.raises(dgp.TrainingDivergedError, match="at step 3"):
        _small_fit(step, cuda_graph=True)


def test_dropping_non_finite_moments_covers_scalar_parameters():
    """After a NaN gradient, every moment is repaired, a scalar parameter's 0-dim ones too
    (a kernel variance, the noise): otherwise the next update is NaN again."""
    from pyro_dgp.train.optim import drop_non_finite_moments, make_optimizer

    scalar, vector = torch.zeros((), requires_grad=True), torch.zeros(3, requires_grad=True)
    opt = make_optimizer(torch.optim.Adam, [scalar, vector], 0.1)
    scalar.grad, vector.grad = torch.tensor(math.nan), torch.tensor([1.0, math.nan, 2.0])
    opt.step()
    drop_non_finite_moments(opt)
    for state in opt.state.values():
        assert all(torch.isfinite(v).all() for v in state.values() if torch.is_tensor(v))
    with torch.no_grad():
        scalar.zero_(), vector.zero_()
    scalar.grad, vector.grad = torch.tensor(1.0), torch.ones(3)
    opt.step()
    assert torch.isfinite(scalar) and torch.isfinite(vector).all()


def test_a_second_model_object_of_the_same_names_is_warned_about(step):
    """Pyro's global parameter store goes by name: a fresh instance of a hand-written model
    class takes the parameters the first one trained. fit says so, naming them; after
    pyro.clear_param_store() the fresh instance starts from its own values, silently."""
    from pyro.distributions import constraints
    from pyro.nn import PyroModule, PyroParam

    class One(PyroModule):
        def __init__(self, Z):
            super().__init__()
            self.l1 = dgp.GPLayer(1, 1, inducing_points=Z)
            self.noise = PyroParam(Z.new_tensor(0.1), constraints.positive)

        def forward(self, x, y=None):
            plate = pyro.plate("data", x.shape[-2], dim=-1)
            f = self.l1(x, plate=plate)
            with plate:
                return pyro.sample("y", dist.Normal(f.squeeze(-1), self.noise), obs=y)

    X, y = step.X_train, step.y_train
    Z = torch.linspace(-1, 1, 5, dtype=X.dtype)[:, None]

    def fit_one():
        model = One(Z)
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=3, lr=0.05,
                progress=False, final_elbo_particles=0)
        return model

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fit_one()
    with pytest.warns(UserWarning, match=r"parameters of the model \(noise, l1.inducing_points"):
        fit_one()
    pyro.clear_param_store()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fit_one()
