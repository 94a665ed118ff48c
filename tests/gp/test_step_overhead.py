"""Per-step Python work that a training step must not repeat: each test counts a call the hot
path used to make (a shape broadcast in Python, a ModuleList built per kernel call, an
attribute swapped per layer call) and checks the results are unchanged."""

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_dgp.gp.layer as layer_module
from pyro_dgp.guides.gaussian import mvn_site
from pyro_dgp.kernels import RBF, Sum, White


def _count_calls(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_q_u_is_built_without_a_python_shape_broadcast(monkeypatch):
    loc = torch.randn(3, 5, dtype=torch.float64)
    tril = torch.randn(3, 5, 5, dtype=torch.float64).tril()
    tril.diagonal(dim1=-2, dim2=-1).copy_(torch.rand(3, 5) + 0.5)
    reference = dist.MultivariateNormal(loc, scale_tril=tril).to_event(1)
    calls = _count_calls(monkeypatch, torch, "broadcast_shapes")
    q = mvn_site(loc, tril)
    assert not calls
    assert q.batch_shape == reference.batch_shape and q.event_shape == reference.event_shape
    x = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(q.log_prob(x), reference.log_prob(x))
    assert q.expand((2,)).sample().shape == (2, 3, 5)  # Pyro's plates expand it
    with pytest.raises(ValueError, match="scale_tril"):  # validated as torch validates it
        type(q.base_dist)(loc, -tril, validate_args=True)


def test_sum_kernel_parts_without_building_a_module_list(monkeypatch):
    kernel = Sum(RBF(2), White(2, variance=0.3))
    Z, X = torch.randn(4, 2), torch.randn(6, 2)
    calls = _count_calls(monkeypatch, torch.nn.ModuleList, "__init__")
    Kzz, Kzx, kxx = kernel.conditional_parts(Z, X)
    assert not calls
    assert torch.allclose(Kzz, kernel(Z)) and torch.allclose(Kzx, kernel(Z, X))
    assert torch.allclose(kxx, kernel(X, diag=True))


def test_a_layer_with_its_stored_inducing_inputs_swaps_nothing(monkeypatch):
    pyro.clear_param_store()
    layer = layer_module.GPLayer(2, 1, num_inducing=3)
    calls = _count_calls(monkeypatch, layer_module, "swapped")
    with layer.given_inducing_inputs(None):
        assert layer.current_inducing_inputs() is not None
    assert not calls
    Z = torch.randn(3, 2)
    with layer.given_inducing_inputs(Z):  # random inducing inputs still swap in and out
        assert layer.current_inducing_inputs() is Z
        with layer.given_inducing_inputs(None):  # and None inside restores the stored Z
            assert layer.current_inducing_inputs() is not Z
    assert layer.current_inducing_inputs() is not Z and len(calls) == 2
