"""Every registry guide follows its data's dtype, whatever torch's default dtype.

For each guide of ``pyro_dgp.guides.registry`` and its model (``registry_models``): float64
data under torch's default float32, and float32 data under the default float64. A few steps
of ``fit`` and a ``predict`` must leave every parameter of the model and the guide, every
value a guide run draws and every prediction in the data's dtype, and must give the same
numbers as the same run under a default equal to the data's dtype: nothing of the run (an
encoder's initial weights, say) may be drawn or computed in the default dtype and cast after.
"""

import pyro
import pytest
import torch
from registry_models import model_for

import pyro_dgp as dgp
from pyro_dgp.guides.registry import GUIDES, make_guide
from pyro_dgp.prediction import predict

#: (torch's default dtype, the data's dtype): each pair differs
CASES = [(torch.float32, torch.float64), (torch.float64, torch.float32)]


@pytest.fixture
def restore_default_dtype():
    old = torch.get_default_dtype()
    yield
    torch.set_default_dtype(old)


def _data(dtype):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(8, 2, generator=g, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + 0.1 * torch.randn(8, generator=g, dtype=torch.float64)
    return X.to(dtype), y.to(dtype)


def _run(name, default, data):
    """Losses, parameters, one guide run's draws and the predictive of a short fit of guide
    ``name`` on data of dtype ``data`` under torch's default dtype ``default``."""
    torch.set_default_dtype(default)
    pyro.clear_param_store()
    X, y = _data(data)
    model = model_for(name, X, y, num_layers=2, num_inducing=3)
    guide = make_guide(name, model)
    result = dgp.fit(model, guide, X, y, num_steps=2, lr=0.01, seed=0, progress=False,
                     final_elbo_particles=0)
    params = {f"model.{k}": v.detach() for k, v in model.named_parameters()}
    params.update({f"guide.{k}": v.detach() for k, v in guide.named_parameters()})
    pyro.set_rng_seed(0)
    trace = pyro.poutine.trace(guide).get_trace(X, y)
    draws = {k: site["value"].detach() for k, site in trace.nodes.items()
             if site["type"] == "sample" and site["value"].is_floating_point()}
    pred = predict(model, guide, X[:3], num_samples=4, seed=0)
    out = {"mean": pred.mean, "variance": pred.variance, "log_prob": pred.log_prob(y[:3])}
    return result.losses, params, draws, out


@pytest.mark.parametrize(("default", "data"), CASES, ids=["default32-data64", "default64-data32"])
@pytest.mark.parametrize("name", sorted(GUIDES))
def test_guide_follows_the_data_dtype_not_the_default(name, default, data,
                                                      restore_default_dtype):
    losses, params, draws, out = _run(name, default, data)
    wrong = [k for k, v in {**params, **draws, **out}.items() if v.dtype != data]
    assert not wrong, f"{name}: not {data} under default {default}: {wrong}"
    assert draws, f"{name}: the guide drew nothing"
    ref_losses, ref_params, ref_draws, ref_out = _run(name, data, data)
    # the same numbers as under a default equal to the data's dtype
    assert losses == ref_losses
    for got, ref in ((params, ref_params), (draws, ref_draws), (out, ref_out)):
        # in order: an autoguide's site names carry a per-instance number
        assert len(got) == len(ref)
        for (k, a), b in zip(got.items(), ref.values(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}: {k}")
