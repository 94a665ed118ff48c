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
        result = dgp.fit(model, guide, X, y, num_steps=steps, batch_size=32, progress=False,
                         checkpoint=ckpt, resume=resume, seed=3)
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


@pytest.mark.parametrize(("name", "objective"), [("meanfield", "meanfield"),
                                                  ("meanfield-sampled", "renyi"),
                                                  ("autonormal", "renyi"),
                                                  ("coupled", "elbo")])
def test_objectives_on_cuda(name, objective):
    import pyro

    from pyro_dgp.guides.registry import make_guide

    data = _cuda_data()
    pyro.clear_param_store()
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=8)
    guide = make_guide(name, model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=5, objective=objective,
                     num_particles=2, progress=False, final_elbo_particles=0)
    assert all(math.isfinite(loss) for loss in result.losses)


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
                                  inducing="locations")
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, data.X_train, data.y_train, num_steps=5, progress=False,
            final_elbo_particles=0)
    assert torch.isfinite(dgp.predict(model, guide, data.X_test, num_samples=4).mean).all()
