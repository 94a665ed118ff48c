"""Per-step Python work that a training step must not repeat: each test counts a call the hot
path used to make (a shape broadcast in Python, a ModuleList built per kernel call, an
attribute swapped per layer call) and checks the results are unchanged."""

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_dgp.gp.layer as layer_module
from pyro_dgp.gp.conditional import conditional
from pyro_dgp.gp.distributions import FunctionMarginal, WhitenedPrior, masked_out
from pyro_dgp.gp.kl import standard_normal_kl
from pyro_dgp.guides.gaussian import mvn_site
from pyro_dgp.kernels import RBF, Sum, White
from pyro_dgp.likelihoods import AnalyticObservation, Gaussian


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


def test_sites_expanded_to_their_own_shape_are_not_rebuilt(monkeypatch):
    loc, var = torch.randn(4, 2), torch.rand(4, 2) + 0.1
    f = FunctionMarginal(loc, var)
    masked = masked_out(f)
    obs = AnalyticObservation(Gaussian(0.5), loc[:, 0], var[:, 0], hyperparameters={})
    calls = _count_calls(monkeypatch, torch.Tensor, "sqrt")
    assert f.expand((4,)) is f and masked.expand((4,)) is masked and obs.expand((4,)) is obs
    assert not calls
    wider = masked.expand((3, 4))  # another shape: a new, expanded distribution
    assert wider.batch_shape == (3, 4) and torch.equal(wider.base_dist.var[1], var)
    assert obs.expand((3, 4)).loc.shape == (3, 4)


def test_kl_and_variances_carry_no_expand_of_their_own_shape():
    loc = torch.randn(3, 5, requires_grad=True)
    tril = (torch.eye(5) * 0.7).expand(3, 5, 5).clone().requires_grad_(True)
    q = mvn_site(loc, tril)
    assert q.base_dist.loc is loc
    kl = torch.distributions.kl_divergence(q, WhitenedPrior(3, 5))
    assert type(kl.grad_fn).__name__ != "ExpandBackward0"
    assert torch.allclose(kl, standard_normal_kl(loc, tril).sum())
    Kzx = torch.rand(5, 7)
    L = torch.linalg.cholesky(Kzx @ Kzx.mT + torch.eye(5))
    mean, var = conditional(Kzx, L, torch.full((7,), 2.0), loc, tril)
    assert var.shape == mean.shape == (7, 3)
    assert type(var.grad_fn).__name__ != "ExpandBackward0"


def _small_meanfield():
    """A two-layer model on 12 random points and its MeanField guide, set up."""
    import pyro_dgp as dgp

    pyro.clear_param_store()
    X, y = torch.randn(12, 2), torch.randn(12)
    model = dgp.DeepGP.regression(X, y, num_layers=2, hidden_dim=2, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    guide(X, y)
    return model, guide, X, y


def test_a_guides_traces_wrap_no_function_metadata(monkeypatch):
    """``poutine.trace(guide)`` copies a function's metadata onto its handler; a module has no
    ``__name__``, so each step raised and caught two errors there."""
    import functools


    model, guide, X, y = _small_meanfield()
    calls = _count_calls(monkeypatch, functools, "update_wrapper")
    guide_trace, model_trace = guide.traces(X, y)
    assert not calls
    assert {"layer1.u", "layer2.f"} <= set(guide_trace.nodes) and "y" in model_trace.nodes


def test_the_kl_takes_a_known_log_determinant_instead_of_the_factors_diagonal(monkeypatch):
    """A factor stored unconstrained comes with its log-determinant; the KL to the whitened
    prior uses it (the same value) and reads no ``diagonal`` of the factor, whose gradient
    would be a zero-filled ``(D, M, M)`` tensor per step."""
    from pyro_dgp.gp.distributions import CholeskyMVN
    from pyro_dgp.guides.params import preconditioned_cholesky

    raw = 0.3 * torch.randn(3, 5, 5, dtype=torch.float64)
    loc = torch.randn(3, 5, dtype=torch.float64)
    L, log_det = preconditioned_cholesky(raw)
    known, plain = mvn_site(loc, L, log_det), mvn_site(loc, L)
    prior = WhitenedPrior(3, 5, dtype=torch.float64)
    expected = torch.distributions.kl_divergence(
        dist.MultivariateNormal(loc, scale_tril=L), dist.MultivariateNormal(
            torch.zeros_like(loc), scale_tril=torch.eye(5, dtype=torch.float64))).sum()
    calls = _count_calls(monkeypatch, torch.Tensor, "diagonal")
    kl_known = torch.distributions.kl_divergence(known, prior)
    assert not calls
    torch.testing.assert_close(kl_known, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.distributions.kl_divergence(plain, prior), kl_known,
                               rtol=1e-14, atol=0)
    assert calls  # without it, the diagonal is read
    # scoring its own draw uses the same log-determinant; Pyro's plates keep it
    x = known.rsample()
    torch.testing.assert_close(known.log_prob(x), plain.log_prob(x), rtol=1e-12, atol=0)
    wide = known.base_dist.expand((2, 3))
    assert isinstance(wide, CholeskyMVN) and wide.log_det_cov.shape == (2, 3)
    torch.testing.assert_close(wide.half_log_det()[1], 0.5 * log_det, rtol=0, atol=0)


def test_a_run_looks_up_parameter_holders_once_and_traces_only_sample_sites(monkeypatch):
    """MeanField finds the modules that hold a site's parameters on its first read, not at
    every step (each module on the dotted path is a ``PyroModule.__getattr__`` call); a
    guide's own traces hold no subsample sites without a copy of each trace to prune them,
    and keep the param sites (Pyro's ``loss_and_grads`` steps only where a trace has
    some)."""
    from pyro.poutine.util import site_is_subsample

    from pyro_dgp.guides import params
    from pyro_dgp.infer import elbo as elbo_module

    model, guide, X, y = _small_meanfield()
    looked_up = _count_calls(monkeypatch, params, "deep_getattr")
    copies = _count_calls(monkeypatch, elbo_module, "prune_subsample_sites")
    with pyro.validation_enabled(False):
        model_trace, guide_trace = elbo_module.model_and_guide_traces(model, guide, (X, y), {})
    assert not looked_up and not copies
    for trace in (model_trace, guide_trace):
        assert not [n for n, s in trace.nodes.items() if site_is_subsample(s)]
    assert any(s["type"] == "param" for s in guide_trace.nodes.values())
    assert {"layer1.u", "layer2.f"} <= set(guide_trace.nodes) and "y" in model_trace.nodes


def test_a_layer_on_its_stored_inducing_inputs_builds_no_swap_context(monkeypatch):
    """``given_inducing_inputs`` (a generator-based context) is entered only where a call's
    inducing inputs are random."""
    import pyro_dgp as dgp

    pyro.clear_param_store()
    X, y = torch.randn(12, 2), torch.randn(12)
    model = dgp.DeepGP.regression(X, y, num_layers=2, hidden_dim=2, num_inducing=4)
    calls = _count_calls(monkeypatch, layer_module.GPLayer, "given_inducing_inputs")
    pyro.poutine.trace(model).get_trace(X, y)
    assert not calls
