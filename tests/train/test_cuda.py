"""Device placement: everything follows the data onto the GPU (skipped without CUDA)."""

import math

import pytest
import torch
from registry_models import model_for

import pyro_dgp as dgp
from pyro_dgp.guides.registry import LOCAL_INDUCING_GUIDES

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fit_and_predict_on_cuda(dtype):
    data = dgp.datasets.step(n_train=64, n_test=32).to(device="cuda", dtype=dtype)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=10)
    assert all(p.device.type == "cuda" and p.dtype == dtype for p in model.parameters())
    for guide in (dgp.guides.MeanField(model), dgp.guides.MeanField(model, collapsed=False)):
        result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=20,
                         batch_size=32, progress=False)
        assert all(math.isfinite(loss) for loss in result.losses)
        assert all(p.device.type == "cuda" for p in guide.parameters())
        pred = dgp.predict(model, guide, data.X_test, num_samples=8)
        assert pred.mean.device.type == "cuda" and pred.mean.dtype == dtype
        assert torch.isfinite(pred.log_prob(data.y_test)).all()


def test_completed_autoguide_on_cuda():
    from pyro.infer.autoguide import AutoMultivariateNormal

    data = dgp.datasets.step(n_train=64, n_test=32).to(device="cuda")
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=10)
    guide = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=10, progress=False)
    assert all(p.device.type == "cuda" for p in guide.parameters())


def test_resume_on_cuda_is_exact(tmp_path):
    """Checkpoints hold the GPU's random stream too, and restoring them takes the CPU byte
    tensors that generators need (map_location moves them to the GPU)."""
    data = dgp.datasets.step(n_train=64, n_test=32).to(device="cuda")
    X, y = data.X_train, data.y_train

    def run(steps, ckpt, resume=False):
        import pyro

        pyro.clear_param_store()
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=10, seed=0)
        guide = dgp.guides.MeanField(model, collapsed=False)
        # a constant rate: the default schedule is a function of num_steps, so a 5-step run
        # resumed to 10 would not follow the 10-step run's rates
        result = dgp.fit(model, guide, X, y, num_steps=steps, batch_size=32, progress=False,
                         checkpoint=ckpt, resume=resume, seed=3, lr_schedule="constant")
        return result, guide

    full, g_full = run(10, tmp_path / "a.pt")
    run(5, tmp_path / "b.pt")
    resumed, g_res = run(10, tmp_path / "b.pt", resume=True)
    assert resumed.resumed_from == 5 and resumed.losses == full.losses
    for a, b in zip(g_full.parameters(), g_res.parameters(), strict=True):
        assert torch.equal(a, b)


def _cuda_data(dtype=torch.float64):
    return dgp.datasets.step(n_train=48, n_test=24).to(device="cuda", dtype=dtype)


def _on_cuda(tensors) -> bool:
    return all(t.device.type == "cuda" for t in tensors)


@pytest.mark.parametrize("name", sorted(dgp.guides.registry.GUIDES))
def test_every_guide_fits_predicts_and_exports_on_cuda(name):
    """Each registry guide on the model it fits: fit (minibatches), predict, the ELBO, a
    DataTree with sample paths on a grid (per-point draws at the data for the amortized
    guides, whose per-point inducing outputs make no sample paths) and the per-layer
    summary, all on the GPU."""
    import pyro

    from pyro_dgp.guides.registry import make_guide

    data = _cuda_data()
    pyro.clear_param_store()
    model = model_for(name, data.X_train, data.y_train, num_layers=2, num_inducing=8)
    guide = make_guide(name, model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=5, batch_size=24,
                     progress=False, final_elbo_particles=2, objective="auto")
    assert math.isfinite(result.final_elbo)
    assert _on_cuda(guide.parameters()) and _on_cuda(model.parameters())
    pred = dgp.predict(model, guide, data.X_test, num_samples=4, seed=0)
    assert pred.mean.device.type == "cuda"
    assert math.isfinite(dgp.metrics.crps(pred, data.y_test))
    grid = torch.linspace(-1, 1, 30, dtype=data.X_train.dtype, device="cuda")[:, None]
    local = name in LOCAL_INDUCING_GUIDES
    tree = dgp.to_datatree(model, guide, data.X_train, data.y_train, num_samples=4,
                           grid=None if local else grid, seed=0)
    assert tree["layers"].attrs["sample_paths"] == (0 if local else 1)
    assert len(dgp.layer_summary(tree)) == 2


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize(("name", "objective"), [("meanfield", "analytic-kl"),
                                                  ("meanfield-sampled", "renyi"),
                                                  ("autonormal", "renyi"),
                                                  ("coupled", "elbo"),
                                                  ("meanfield", "alpha")])
def test_objectives_on_cuda(name, objective, cuda_graph):
    import pyro

    from pyro_dgp.guides.registry import make_guide

    data = _cuda_data()
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=8)
    guide = make_guide(name, model)
    kwargs = dict(num_steps=5, objective=objective, num_particles=2, progress=False,
                  final_elbo_particles=0, cuda_graph=cuda_graph)
    if cuda_graph and objective == "renyi":  # its per-draw weights are not a differentiable_loss
        with pytest.raises(ValueError, match="RenyiELBO has none"):
            dgp.fit(model, guide, data.X_train, data.y_train, **kwargs)
        return
    result = dgp.fit(model, guide, data.X_train, data.y_train, **kwargs)
    assert all(math.isfinite(loss) for loss in result.losses)
    assert result.graph_steps == (4 if cuda_graph else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_natural_gradients_and_locations_model_on_cuda(dtype):
    import pyro

    data = _cuda_data(dtype)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=8)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=5, natural_gradient=0.1,
            progress=False, final_elbo_particles=0)
    assert _on_cuda(guide.parameters())
    loc = guide.q("layer2").loc
    assert loc.device.type == "cuda" and loc.dtype == dtype
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=8,
                                  inducing_scheme="propagated")
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=5, progress=False,
            final_elbo_particles=0)
    assert torch.isfinite(dgp.predict(model, guide, data.X_test, num_samples=4).mean).all()


# ------------------------------------------------------------------ CUDA graphs (fit option)


def _fit_losses(cuda_graph, steps=12, dtype=torch.float64, **kwargs):
    import pyro

    data = _cuda_data(dtype)
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=3, num_inducing=8,
                                  seed=0)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=steps, batch_size=24,
                     progress=False, final_elbo_particles=0, cuda_graph=cuda_graph, seed=1,
                     **kwargs)
    return result, guide


def test_cuda_graph_replays_the_eager_step():
    """The recorded step is the eager one: the same kernels and the same random draws (the
    default CUDA generator, advanced by each replay as by an eager step), so the losses and
    the fitted parameters agree to rounding; every step after the first is a replay."""
    eager, g_eager = _fit_losses(False)
    graph, g_graph = _fit_losses(True)
    assert graph.graph_steps == 11
    assert torch.allclose(torch.tensor(graph.losses), torch.tensor(eager.losses), rtol=1e-9)
    for a, b in zip(g_eager.parameters(), g_graph.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10)


def test_cuda_graph_float32_and_lr_schedule():
    eager, _ = _fit_losses(False, dtype=torch.float32, lr_decay=0.1)
    graph, _ = _fit_losses(True, dtype=torch.float32, lr_decay=0.1)
    assert graph.graph_steps == 11
    assert torch.allclose(torch.tensor(graph.losses), torch.tensor(eager.losses), rtol=1e-4)


def test_cuda_graph_resume_continues_the_run(tmp_path):
    constant = {"lr_schedule": "constant"}  # the default schedule depends on num_steps
    full, g_full = _fit_losses(True, checkpoint=tmp_path / "a.pt", **constant)
    _fit_losses(True, steps=5, checkpoint=tmp_path / "b.pt", **constant)
    resumed, g_res = _fit_losses(True, checkpoint=tmp_path / "b.pt", resume=True, **constant)
    assert resumed.resumed_from == 5
    assert torch.allclose(torch.tensor(resumed.losses), torch.tensor(full.losses), rtol=1e-9)


def test_cholesky_inside_a_graph_is_nan_where_it_fails():
    """While a graph is recorded, :func:`~pyro_dgp.linalg.cholesky` cannot read ``info``
    back: a replay on a matrix that is not positive definite gives a NaN factor, one on a
    positive definite matrix the factor the eager call gives."""
    from pyro_dgp.linalg import capturing, cholesky

    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]], device="cuda", dtype=torch.float64)
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], device="cuda", dtype=torch.float64)
    K = good.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cholesky(K)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        assert capturing(K)
        L = cholesky(K)
    torch.cuda.current_stream().wait_stream(stream)
    K.copy_(bad)
    graph.replay()
    assert torch.isnan(L).all() and not capturing(K)
    K.copy_(2 * good)
    graph.replay()
    torch.testing.assert_close(L, cholesky(2 * good), rtol=1e-12, atol=0)


def test_cuda_graph_non_finite_replay_runs_the_step_eagerly():
    """A replay whose loss is not finite (a failed factor inside the graph) is run again
    eagerly, where a failed factor is retried with more jitter: here the recorded objective
    is NaN and the eager one is not, so every step is eager and training goes on, each rerun
    on the draws its replay took: the run is the eager run."""
    import pyro

    from pyro_dgp.infer.elbo import AnalyticKL_ELBO

    class NaNWhenRecorded(AnalyticKL_ELBO):
        def differentiable_loss(self, model, guide, *args, **kwargs):
            loss = super().differentiable_loss(model, guide, *args, **kwargs)
            return loss * math.nan if torch.cuda.is_current_stream_capturing() else loss

    pyro.clear_param_store()
    eager, _ = _fit_losses(False, steps=4, objective=AnalyticKL_ELBO())
    result, _ = _fit_losses(True, steps=4, objective=NaNWhenRecorded())
    assert result.graph_steps == 0 and len(result.losses) == 4
    assert all(math.isfinite(loss) for loss in result.losses)
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(eager.losses),
                               rtol=1e-9, atol=0)


def test_cuda_graph_of_a_step_that_reads_back_trains_eagerly_with_the_same_draws():
    """Pyro's own Trace_ELBO reads its value back (``.item()``): the check before recording
    names that, fit warns and trains eagerly, and the check's evaluation leaves the random
    stream as it was (the run equals one without the option)."""
    from pyro.infer import Trace_ELBO

    eager, _ = _fit_losses(False, objective=Trace_ELBO())
    with pytest.warns(UserWarning, match="cannot be recorded as a CUDA graph"):
        graph, _ = _fit_losses(True, objective=Trace_ELBO())
    assert graph.graph_steps == 0 and graph.losses == eager.losses


#: torch's LowRankMultivariateNormal factors its capacitance matrix with
#: ``torch.linalg.cholesky``, which reads its error code back to the host
READS_BACK = {"autolowrank"}


@pytest.mark.parametrize("name", sorted(dgp.guides.registry.GUIDES))
def test_cuda_graph_with_every_guide(name):
    """Every registry guide's step is recorded and replayed (its objective, "auto", reads
    nothing back to the host), but for READS_BACK, which trains eagerly with a warning that
    names the reason."""
    import warnings

    import pyro

    from pyro_dgp.guides.registry import make_guide

    data = _cuda_data()
    pyro.clear_param_store()
    model = model_for(name, data.X_train, data.y_train, num_layers=2, num_inducing=8)
    guide = make_guide(name, model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=6, batch_size=24,
                         progress=False, final_elbo_particles=2, cuda_graph=True)
    assert all(math.isfinite(loss) for loss in result.losses)
    assert math.isfinite(result.final_elbo)
    failed = [str(w.message) for w in caught if "CUDA graph" in str(w.message)]
    if name in READS_BACK:
        assert result.graph_steps == 0
        assert failed and "synchronizing CUDA operation" in failed[0], failed
    else:
        assert result.graph_steps == 5 and not failed, failed
