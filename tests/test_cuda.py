"""Device placement: everything follows the data onto the GPU (skipped without CUDA)."""

import math

import pytest
import torch

import pyro_dgp as dgp

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
