"""The options of ``SemiImplicit``: a start at a trained Gaussian guide (``init_from``), the
importance-weighted hierarchical bound (IWHVI: Sobolev and Vetrov 2019) and the discrete
mixing distribution (an equal-weight mixture of Gaussians with an exact ``log q``)."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

import pyro_dgp as dgp
from pyro_dgp.guides.mixing import ReverseNetwork, SemiImplicitNormal, surrogate_log_prob

DT = torch.float64
SMALL = {"num_mixing": 10, "noise_dim": 8, "hidden": (32, 32)}


def _step_data():
    data = dgp.datasets.step(n_train=40)
    return data.X_train, data.y_train


def _mean_se(x):
    return float(x.mean()), float(x.std() / math.sqrt(x.numel()))


def _u_draws(guide, X, S, seed):
    """``{layer: (S, D M)}`` draws of each layer's ``u`` in one vectorised run."""
    torch.manual_seed(seed)
    with torch.no_grad(), pyro.plate("_draws", S, dim=-2):
        trace = poutine.trace(guide).get_trace(X)
    return {name: trace.nodes[f"{name}.u"]["value"].reshape(S, -1) for name in guide.layer_names}


# ----------------------------------------------------------------- init_from
@pytest.fixture(scope="module")
def trained_meanfield():
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, seed=0)
    source = dgp.guides.MeanField(model, inner_variance=1e-2)
    dgp.fit(model, source, X, y, num_steps=60, lr=0.02, progress=False, seed=0,
            final_elbo_particles=0)
    return model, source, X


@pytest.mark.parametrize("component_scale", ["diagonal", "tril"])
def test_init_from_draws_u_with_the_source_guides_mean_and_variance(trained_meanfield,
                                                                    component_scale):
    model, source, X = trained_meanfield
    guide = dgp.guides.SemiImplicit(model, init_from=source, component_scale=component_scale,
                                    **SMALL)
    S, z = 20000, 4.5
    draws = _u_draws(guide, X, S, seed=0)
    for name in guide.layer_names:
        q = source.q(name)
        var = q.covariance_matrix.diagonal()
        # the source's q(u) is not its initial one: training moved the means
        assert (q.loc - source.site(name).layer.initial_u_loc().reshape(-1)).abs().max() > 0.05
        mean_se = (var / S).sqrt()
        assert ((draws[name].mean(0) - q.loc).abs() < z * mean_se).all(), name
        # the standard error of a Gaussian's sample variance: var sqrt(2 / (S - 1))
        var_se = var * math.sqrt(2 / (S - 1))
        assert ((draws[name].var(0) - var).abs() < z * var_se).all(), name
        if component_scale == "tril":  # the correlations within each output are kept
            centred = draws[name] - q.loc
            emp = centred.mT @ centred / S
            cov = q.covariance_matrix
            se = ((var.unsqueeze(-1) * var.unsqueeze(-2) + cov.square()) / S).sqrt()
            D, M = guide.site(name).shape
            block = torch.block_diag(*[torch.ones(M, M, dtype=torch.bool)] * D)
            assert ((emp - cov).abs()[block] < z * se[block]).all(), name


def test_init_from_predicts_as_the_source_guide(trained_meanfield):
    # MeanField's q(u) has a full M x M covariance per output: the "tril" components hold it
    model, source, X = trained_meanfield
    guide = dgp.guides.SemiImplicit(model, init_from=source, component_scale="tril", **SMALL)
    X_test = torch.linspace(-1.5, 1.5, 15, dtype=DT).unsqueeze(-1)
    S = 4000
    a = dgp.predict(model, guide, X_test, num_samples=S, seed=1)
    b = dgp.predict(model, source, X_test, num_samples=S, seed=2)
    for draws_a, draws_b in ((a.loc, b.loc), (a.var, b.var)):
        se = ((draws_a.var(0) + draws_b.var(0)) / S).sqrt()
        assert ((draws_a.mean(0) - draws_b.mean(0)).abs() < 4.5 * se).all()
    # a SemiImplicit at its own start predicts otherwise: the comparison can see it
    fresh = dgp.predict(model, dgp.guides.SemiImplicit(model, **SMALL), X_test,
                        num_samples=S, seed=1)
    se = ((fresh.loc.var(0) + b.loc.var(0)) / S).sqrt()
    assert ((fresh.loc.mean(0) - b.loc.mean(0)).abs() > 10 * se).any()


def test_init_from_refuses_other_models_and_non_gaussian_guides(trained_meanfield):
    model, source, X = trained_meanfield
    other = dgp.DeepGP.regression(X, X.squeeze(-1), num_layers=2, num_inducing=6)
    with pytest.raises(ValueError, match="init_from is a guide of another model"):
        dgp.guides.SemiImplicit(model, init_from=dgp.guides.MeanField(other))
    with pytest.raises(ValueError, match="init_from must have a Gaussian q"):
        dgp.guides.SemiImplicit(model, init_from=dgp.guides.SemiImplicit(model, **SMALL))
    with pytest.raises(ValueError, match="init_from must be a Gaussian layer guide"):
        dgp.guides.SemiImplicit(model, init_from=lambda *args: None)


# ----------------------------------------------------------------- IWHVI
class OneLayerLinear:
    """``z = A eps + s xi``, ``eps ~ N(0, I_e)``, ``xi ~ N(0, I_m)``: a semi-implicit
    distribution with ``q(z) = N(0, A A^T + s^2 I)``. ``A = R diag(a)`` with ``R``
    orthogonal, so that the exact posterior ``q(eps | z) = N(P A^T z / s^2, P)``,
    ``P = (I + A^T A / s^2)^-1``, is diagonal: a reverse model of IWHVI's family."""

    def __init__(self, m=2, s=0.5, seed=0):
        g = torch.Generator().manual_seed(seed)
        R, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=DT))
        self.a = torch.tensor([1.5, 0.7], dtype=DT)
        self.A, self.s, self.m = R * self.a, s, m
        self.post_var = 1 / (1 + self.a.square() / s ** 2)  # diagonal of P

    def net(self, eps, cond=None):
        loc = (eps @ self.A.mT).unsqueeze(-2)  # event (1, m)
        return loc, torch.full_like(loc, self.s)

    def log_q(self, z):
        cov = self.A @ self.A.mT + self.s ** 2 * torch.eye(self.m, dtype=DT)
        return dist.MultivariateNormal(torch.zeros(self.m, dtype=DT), cov).log_prob(
            z.squeeze(-2))

    def reverse(self, scale_factor=1.0, shift=0.0):
        """``(z (..., m), c) -> (loc, scale)``: the exact ``q(eps | z)``, its scale times
        ``scale_factor`` and its mean moved by ``shift``."""
        def proposal(z, cond=None):
            loc = z @ self.A / self.s ** 2 * self.post_var + shift
            return loc, (scale_factor * self.post_var.sqrt()).expand(loc.shape)
        return proposal

    def surrogate(self, K, S, seed, proposal=None):
        """``(S,)`` draws of ``log q_K(z)`` (SIVI without a proposal, else IWHVI) and the
        exact ``log q(z)`` at the same draws ``z``."""
        torch.manual_seed(seed)
        q = SemiImplicitNormal(self.net, None, self.m, K, (1, self.m), (S,),
                               like=torch.zeros((), dtype=DT), proposal=proposal)
        z = q.rsample()
        return q.log_prob(z), self.log_q(z)


@pytest.mark.parametrize("K", [1, 5])
def test_iwhvi_with_the_exact_reverse_model_is_exact_at_every_k(K):
    # every weight q(z | eps_k) N(eps_k) / q(eps_k | z) is q(z): the bound is log q(z)
    family = OneLayerLinear()
    bound, exact = family.surrogate(K, 200, seed=0, proposal=family.reverse())
    torch.testing.assert_close(bound, exact, rtol=0, atol=1e-10)
    sivi, _ = family.surrogate(K, 200, seed=0)  # SIVI is not exact here
    assert (sivi - exact).abs().max() > 0.1


def test_iwhvi_is_tighter_than_sivi_and_tightens_with_k():
    # a reverse model off the posterior (scale 1.5 times, mean moved by 0.3): an upper bound
    # on log q(z) in expectation, below SIVI's at the same K, decreasing in K
    family = OneLayerLinear()
    proposal = family.reverse(scale_factor=1.5, shift=0.3)
    S, z = 4000, 4.0
    gaps = {}
    for K in (1, 10, 50):
        iw, exact = family.surrogate(K, S, seed=K, proposal=proposal)
        sivi, exact_again = family.surrogate(K, S, seed=K)  # the same draws of z
        assert torch.equal(exact, exact_again)
        gaps[K] = _mean_se(iw - exact)
        assert gaps[K][0] > -z * gaps[K][1], (K, gaps[K])  # E log q_K^IW >= log q
        paired = _mean_se(sivi - iw)
        assert paired[0] > z * paired[1], (K, paired)  # IWHVI strictly tighter here
    for small, large in ((1, 10), (10, 50)):
        diff = gaps[small][0] - gaps[large][0]
        assert diff > z * math.hypot(gaps[small][1], gaps[large][1]), gaps


def test_iwhvi_starts_at_the_sivi_surrogate_on_a_deep_gp():
    # the reverse models start at N(0, I): the same noises give the same log q_K
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = dgp.guides.SemiImplicit(model, bound="iwhvi", **SMALL)
    torch.manual_seed(0)
    with torch.no_grad():  # mixing that matters
        for name in guide.layer_names:
            out = guide.mixing_network(name).body[-1]
            out.weight.normal_(0.0, 0.5 * out.in_features)

    def log_q(bound):
        guide.bound = bound
        torch.manual_seed(1)
        with torch.no_grad(), pyro.plate("_draws", 50, dim=-2):
            trace = poutine.trace(guide).get_trace(X)
            trace.compute_log_prob()
        return torch.stack([trace.nodes[f"{n}.u"]["log_prob"] for n in guide.layer_names])

    torch.testing.assert_close(log_q("iwhvi"), log_q("sivi"), rtol=1e-10, atol=1e-10)


def test_trained_reverse_models_tighten_the_bound_on_a_deep_gp():
    # the reverse models trained by the bound itself (its gradient in them is the ELBO's):
    # at the same draws of u, E log q_K^IW falls below SIVI's surrogate at the same K
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = dgp.guides.SemiImplicit(model, bound="iwhvi", num_mixing=10, noise_dim=2,
                                    hidden=(16,))
    guide(X)
    torch.manual_seed(0)
    with torch.no_grad():  # mixing that matters
        for name in guide.layer_names:
            out = guide.mixing_network(name).body[-1]
            out.weight.normal_(0.0, 0.5 * out.in_features)

    def log_q(bound, S, seed, grad=False):
        guide.bound = bound
        torch.manual_seed(seed)
        with torch.set_grad_enabled(grad), pyro.plate("_draws", S, dim=-2):
            trace = poutine.trace(guide).get_trace(X)
            trace.compute_log_prob()
        return sum(trace.nodes[f"{n}.u"]["log_prob"].reshape(S) for n in guide.layer_names)

    opt = torch.optim.Adam(guide.proposals.parameters(), lr=0.05)
    for step in range(100):
        opt.zero_grad()
        log_q("iwhvi", 64, 100 + step, grad=True).mean().backward()
        opt.step()
    S = 2000
    gap = _mean_se(log_q("sivi", S, seed=1) - log_q("iwhvi", S, seed=1))  # the same u
    assert gap[0] > 4 * gap[1], gap


def test_reverse_network_starts_at_the_mixing_distribution():
    net = ReverseNetwork(6, 4, 3, (5,), like=torch.zeros((), dtype=DT))
    loc, scale = net(torch.randn(7, 6, dtype=DT), torch.randn(7, 4, dtype=DT))
    assert loc.shape == scale.shape == (7, 3)
    torch.testing.assert_close(loc, torch.zeros_like(loc))
    torch.testing.assert_close(scale, torch.ones_like(scale))


def test_iwhvi_trains_its_reverse_models_and_predicts():
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6)
    guide = dgp.guides.SemiImplicit(model, bound="iwhvi", **SMALL)
    result = dgp.fit(model, guide, X, y, num_steps=30, lr=0.01, progress=False,
                     final_elbo_particles=2)
    assert all(math.isfinite(v) for v in result.losses) and math.isfinite(result.final_elbo)
    out = guide.proposals.layer2.body[-1]
    assert out.weight.abs().max() > 0  # the reverse model left its start
    pred = dgp.predict(model, guide, X, num_samples=8, seed=0)
    assert torch.isfinite(pred.mean).all()


# ----------------------------------------------------------------- discrete mixing
def _random_outputs(guide, seed, tril=False):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in guide.layer_names:
            net = guide.mixing_network(name)
            out = net.body[-1]
            out.weight.copy_(0.5 * out.in_features * torch.randn(out.weight.shape, generator=g,
                                                                 dtype=DT))
            if tril:
                net.tril_raw.copy_(0.5 * torch.randn(net.tril_raw.shape, generator=g, dtype=DT))


@pytest.mark.parametrize("component_scale", ["diagonal", "tril"])
def test_discrete_mixing_log_q_is_the_mixture_of_its_points(component_scale):
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    K = 4
    guide = dgp.guides.SemiImplicit(model, mixing="discrete", num_points=K,
                                    component_scale=component_scale, **SMALL)
    guide(X)
    _random_outputs(guide, seed=2, tril=component_scale == "tril")
    torch.manual_seed(0)
    with torch.no_grad(), pyro.plate("_draws", 30, dim=-2):
        trace = poutine.trace(guide).get_trace(X)
        trace.compute_log_prob()
    u = trace.nodes["layer1.u"]["value"].squeeze(-3)  # (30, D, M)
    net = guide.mixing_network("layer1")
    with torch.no_grad():
        loc, scale = net(net.points)  # (K, D, M)
        T = torch.eye(loc.shape[-1], dtype=DT) if net.unit_tril is None else net.unit_tril
        component = dist.MultivariateNormal(loc, scale_tril=T * scale.unsqueeze(-2))
        mixture = dist.MixtureSameFamily(
            dist.Categorical(logits=torch.zeros(K, dtype=DT)), dist.Independent(component, 1))
        expected = mixture.log_prob(u)
    got = trace.nodes["layer1.u"]["log_prob"].reshape(30)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert (loc[0] - loc[1]).abs().max() > 0.1  # the components differ


def test_discrete_mixing_draws_each_point_equally():
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=3)
    K, S = 3, 6000
    guide = dgp.guides.SemiImplicit(model, mixing="discrete", num_points=K, **SMALL)
    guide(X)
    torch.manual_seed(1)
    with torch.no_grad(), pyro.plate("_draws", S, dim=-2):
        trace = poutine.trace(guide).get_trace(X)
    fn = trace.nodes["layer1.u"]["fn"]
    while not isinstance(fn, SemiImplicitNormal):
        fn = fn.base_dist
    eps = fn.own_draw[1].reshape(S, -1)  # the noise of each draw: one of the points
    points = guide.mixing_network("layer1").points
    match = (eps.unsqueeze(-2) == points).all(-1)  # (S, K)
    assert (match.sum(-1) == 1).all()
    share = match.double().mean(0)
    se = math.sqrt((1 / K) * (1 - 1 / K) / S)
    assert ((share - 1 / K).abs() < 4.5 * se).all(), share


def test_discrete_mixing_trains():
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6)
    guide = dgp.guides.SemiImplicit(model, mixing="discrete", num_points=5, **SMALL)
    result = dgp.fit(model, guide, X, y, num_steps=30, lr=0.01, progress=False,
                     final_elbo_particles=2)
    assert all(math.isfinite(v) for v in result.losses) and math.isfinite(result.final_elbo)
    assert guide.mixing_network("layer1").points.shape == (5, SMALL["noise_dim"])


@pytest.mark.parametrize("kwargs, match", [
    ({"bound": "iw"}, "bound"),
    ({"mixing": "uniform"}, "mixing"),
    ({"num_points": 0}, "num_points"),
    ({"mixing": "discrete", "bound": "iwhvi"}, "mixing='discrete'"),
    ({"mixing": "discrete", "structured": False}, "mixing='discrete'"),
])
def test_bad_options_are_named(kwargs, match):
    X, y = _step_data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    with pytest.raises(ValueError, match=match):
        dgp.guides.SemiImplicit(model, **kwargs)


def test_surrogate_of_a_single_conditional_is_its_logsumexp():
    comps = torch.randn(4, 6, dtype=DT)
    torch.testing.assert_close(surrogate_log_prob([comps]),
                               torch.logsumexp(comps, -1) - math.log(6))


@pytest.mark.parametrize("options", [{"bound": "iwhvi"}, {"bound": "iwhvi", "structured": False},
                                     {"mixing": "discrete"}], ids=["iwhvi", "sivi-iw", "discrete"])
def test_options_run_in_float32(options):
    X, y = _step_data()
    X, y = X.float(), y.float()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6)
    guide = dgp.guides.SemiImplicit(model, **options, **SMALL)
    result = dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0)
    assert all(math.isfinite(v) for v in result.losses)
    assert all(p.dtype == torch.float32 for p in guide.parameters())
