"""Cross-layer guides: closed-form KL, Chain = Coupled for matched parameters, unbiasedness."""

import contextlib
import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import MultivariateNormal, constraints, kl_divergence

import pyro_dgp as dgp
from pyro_dgp.guides import Chain, Coupled

DT = torch.float64


def _model(num_layers=2, whiten=True, N=30, M=6, hidden=2):
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(-2, 2, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * X.squeeze(-1)) + 0.05 * torch.randn(N, generator=g, dtype=DT)
    model = dgp.DeepGP.regression(X, y, num_layers=num_layers, num_inducing=M,
                                  hidden_dim=hidden, whiten=whiten)
    return model, X, y


def _random_joint(T, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    mean = 0.5 * torch.randn(T, generator=g, dtype=DT)
    L = torch.randn(T, T, generator=g, dtype=DT).tril(-1) * scale / math.sqrt(T)
    L = L + torch.diag(0.3 + 0.5 * torch.rand(T, generator=g, dtype=DT))
    return mean, L


def _set_coupled(guide, mean, L):
    guide.set_joint(mean, L)


def _prior_cov(guide):
    blocks = []
    for site in guide.layer_sites:
        D, M = site.shape
        K = (torch.eye(M, dtype=DT) if site.layer.whiten
             else site.layer.kzz_cholesky() @ site.layer.kzz_cholesky().mT)
        blocks += [K] * D
    return torch.block_diag(*blocks).detach()


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("rank", [None, 3])
def test_coupled_kl_matches_torch(whiten, rank):
    model, X, y = _model(whiten=whiten)
    guide = Coupled(model, rank=rank)
    guide(X, y)
    T = guide.dim
    with torch.no_grad():
        if rank is None:
            mean, L = _random_joint(T)
            _set_coupled(guide, mean, L)
            q = MultivariateNormal(mean, scale_tril=L)
        else:
            g = torch.Generator().manual_seed(1)
            guide.loc_unconstrained.copy_(torch.randn(T, generator=g, dtype=DT))
            guide.cov_factor_unconstrained.copy_(0.3 * torch.randn(T, rank, generator=g,
                                                                   dtype=DT))
            guide.cov_diag_unconstrained.copy_(torch.randn(T, generator=g, dtype=DT) - 1)
            _, W, d, _ = guide.factor()
            q = MultivariateNormal(guide.loc, covariance_matrix=W @ W.mT + torch.diag(d))
        p = MultivariateNormal(torch.zeros(T, dtype=DT), covariance_matrix=_prior_cov(guide))
        assert float(guide.kl()) == pytest.approx(float(kl_divergence(q, p)), rel=1e-9)


def _chain_from_joint(chain, mean, S):
    """Chain parameters representing N(mean, S) exactly (Gaussian conditioning)."""
    sites = chain.layer_sites
    n1 = sites[0].shape.numel()
    S11, S12, S22 = S[:n1, :n1], S[:n1, n1:], S[n1:, n1:]
    B = torch.linalg.solve(S11, S12).mT
    cond = S22 - B @ S12
    with torch.no_grad():
        chain.set_block(sites[0], mean[:n1], torch.linalg.cholesky(S11))
        chain.set_block(sites[1], mean[n1:], torch.linalg.cholesky(0.5 * (cond + cond.mT)), B)


@pytest.mark.slow
@pytest.mark.parametrize("whiten", [True, False])
def test_chain_represents_the_same_joint_as_coupled(whiten):
    model, X, y = _model(whiten=whiten)
    coupled, chain = Coupled(model), Chain(model)
    coupled(X, y)
    chain(X, y)
    mean, L = _random_joint(coupled.dim, seed=2)
    _set_coupled(coupled, mean, L)
    _chain_from_joint(chain, mean, L @ L.mT)
    with torch.no_grad():
        m_chain, S_chain = chain.joint()
        torch.testing.assert_close(m_chain, mean)
        torch.testing.assert_close(S_chain, L @ L.mT)
        assert float(chain.kl()) == pytest.approx(float(coupled.kl()), rel=1e-9)
    # same joint and the same estimator (both collapse the last layer): the same ELBO mean
    for per_point in (True, False):
        coupled.per_point = chain.per_point = per_point
        pyro.set_rng_seed(0)
        # 300 estimates each: the comparison is in units of their standard error
        a = _estimates(Trace_ELBO(), model, chain, X, y, 300)
        b = _estimates(Trace_ELBO(), model, coupled, X, y, 300)
        se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
        assert abs(float(a.mean() - b.mean())) < 3 * se


@pytest.mark.parametrize("Guide", [Coupled, pytest.param(Chain, marks=pytest.mark.slow)])
def test_per_point_draws_lower_the_variance_and_shared_draws_give_sample_paths(Guide):
    model, X, y = _model()
    guide = Guide(model)
    guide(X, y)
    mean, L = _random_joint(guide.dim, seed=5)
    if Guide is Coupled:
        _set_coupled(guide, mean, L)
    else:
        _chain_from_joint(guide, mean, L @ L.mT)
    assert guide.per_point is None and guide.draws_per_point(X.shape[0])  # N T^2 small
    assert not guide.draws_per_point(10**9 // guide.dim**2 + 1)  # over the budget
    pyro.set_rng_seed(1)
    est = {}
    for per_point in (True, False):
        guide.per_point = per_point
        est[per_point] = _estimates(Trace_ELBO(), model, guide, X, y, 400)
    a, b = est[True], est[False]
    se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
    assert abs(float(a.mean() - b.mean())) < 3 * se  # both unbiased for the same ELBO
    print(f"variance ratio per-point/shared = {float(a.var() / b.var()):.3f}")
    assert float(a.var()) < 0.5 * float(b.var())
    # per point, f^1 is not the function given the trace's u^1; under shared_draws it is
    layer1 = model.layers[0]
    guide.per_point = True
    for shared in (False, True):
        with torch.no_grad(), guide.shared_draws() if shared else contextlib.nullcontext():
            trace = poutine.trace(guide).get_trace(X, y)
            loc = dgp.likelihoods.marginal.source_of(trace.nodes["layer1.f"]["value"]).loc
            given_u = layer1.conditional(X, trace.nodes["layer1.u"]["value"])[0]
        assert torch.allclose(loc, given_u) == shared
    assert guide.draws_per_point(X.shape[0])  # the context is left


def _estimates(elbo, model, guide, X, y, n):
    with torch.no_grad():
        return torch.tensor([-elbo.loss(model, guide, X, y) for _ in range(n)], dtype=DT)


def _brute_force_elbo(model, mean, S, X, y, n=20000, seed=7, scale_tril=None):
    """E_q log p(y | f^L) - KL by plain Monte Carlo with dense algebra, no library guide: u
    of all layers jointly from N(mean, S), each inner f^l drawn from its conditional, the last
    layer's expected log-likelihood in closed form given u^L and f^{L-1}."""
    g = torch.Generator().manual_seed(seed)
    s2 = model.likelihood.variance.detach()
    T = mean.shape[0]
    if scale_tril is None:
        scale_tril = torch.linalg.cholesky(S)
    v = mean + torch.randn(n, T, generator=g, dtype=DT) @ scale_tril.mT

    def layer_sample(layer, x, u):  # u: (n, D, M) whitened; x: (n, N, Din)
        with torch.no_grad():
            Z = layer.inducing_points
            K = layer.kernel(Z)
            L = torch.linalg.cholesky(K + 1e-12 * torch.eye(len(Z), dtype=DT))
            Kzx = layer.kernel(Z, x)
            A = torch.linalg.solve_triangular(L, Kzx, upper=False)
            mean_f = (u @ A).mT + layer.mean_function(x)
            var = (layer.kernel(x, diag=True) - (A * A).sum(-2)).unsqueeze(-1)
            return mean_f, var

    f, offset = X.expand(n, *X.shape), 0
    for layer in model.layers:
        D, M = layer.output_dim, layer.num_inducing
        m, var = layer_sample(layer, f, v[:, offset:offset + D * M].reshape(n, D, M))
        offset += D * M
        f = m + var.sqrt() * torch.randn(m.shape, generator=g, dtype=DT)
    m, var = m.squeeze(-1), var.squeeze(-1)  # the last layer's, integrated in closed form
    ell = (torch.distributions.Normal(m, s2.sqrt()).log_prob(y) - 0.5 * var / s2).sum(-1)
    p = MultivariateNormal(torch.zeros(T, dtype=DT), torch.eye(T, dtype=DT))
    kl = kl_divergence(MultivariateNormal(mean, scale_tril=scale_tril), p)
    return float(ell.mean() - kl), float(ell.std() / math.sqrt(n))


@pytest.mark.slow
@pytest.mark.parametrize("per_point", [True, False])
@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_three_layer_cross_layer_estimators_are_unbiased(Guide, per_point):
    """Three layers against the dense brute force: q's joint (mean, S) from the guide's own
    factor, set randomly (Chain's couplings give its block-tridiagonal precision)."""
    model, X, y = _model(num_layers=3, N=10, M=3, hidden=2)
    for layer in model.layers:
        layer.jitter = 1e-12
    guide = Guide(model, per_point=per_point)
    guide(X, y)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=DT))
        mean, R, _, _ = guide.factor()  # lower triangular for both guides
    assert torch.equal(R, R.tril())
    reference, ref_se = _brute_force_elbo(model, mean, None, X, y, scale_tril=R)
    pyro.set_rng_seed(3)
    est = _estimates(Trace_ELBO(), model, guide, X, y, 1500)
    se = math.sqrt(float(est.var()) / len(est) + ref_se**2)
    assert abs(float(est.mean()) - reference) < 3 * se, (float(est.mean()), reference, se)


@pytest.mark.slow
@pytest.mark.parametrize("per_point", [True, False])
@pytest.mark.parametrize("name", ["coupled", "coupled-lowrank", "chain"])
def test_cross_layer_estimators_are_unbiased(name, per_point):
    model, X, y = _model(N=12, M=4, hidden=1)
    for layer in model.layers:  # tiny jitter so the brute force needs no jitter model
        layer.jitter = 1e-12
    coupled = Coupled(model, per_point=per_point)
    coupled(X, y)
    mean, L = _random_joint(coupled.dim, seed=4, scale=0.2)
    S = L @ L.mT
    if name == "coupled":
        guide = coupled
        _set_coupled(guide, mean, L)
    elif name == "chain":
        guide = Chain(model, per_point=per_point)
        guide(X, y)
        _chain_from_joint(guide, mean, S)
    else:  # W W^T + diag(d): the last layer collapses over the diagonal part's noise
        guide = Coupled(model, rank=2, per_point=per_point)
        guide(X, y)
        g = torch.Generator().manual_seed(6)
        with torch.no_grad():
            guide.loc_unconstrained.copy_(mean)
            guide.cov_factor_unconstrained.copy_(torch.randn(guide.dim, 2, generator=g,
                                                             dtype=DT))
            guide.cov_diag_unconstrained.copy_(torch.randn(guide.dim, generator=g,
                                                           dtype=DT) - 2)
            _, W, d, _ = guide.factor()
            S = W @ W.mT + torch.diag(d)
    reference, ref_se = _brute_force_elbo(model, mean, S, X, y)
    pyro.set_rng_seed(3)
    est = _estimates(Trace_ELBO(), model, guide, X, y, 1500)
    se = math.sqrt(float(est.var()) / len(est) + ref_se**2)
    assert abs(float(est.mean()) - reference) < 3 * se, (float(est.mean()), reference, se)


@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_trace_mean_field_elbo_equals_trace_elbo_for_joint_guides(Guide):
    model, X, y = _model()
    guide = Guide(model)
    guide(X, y)
    values = []
    for elbo in (Trace_ELBO(), TraceMeanField_ELBO()):
        pyro.set_rng_seed(11)
        with torch.no_grad():
            values.append(elbo.loss(model, guide, X, y))
    assert values[0] == pytest.approx(values[1], rel=1e-12)


@pytest.mark.parametrize("name", ["coupled", "coupled-lowrank", "chain", "chain-per-point"])
def test_cross_layer_guides_train(name):
    from pyro_dgp.guides.registry import make_guide

    model, X, y = _model(N=40, M=8)
    guide = make_guide(name, model)
    r = dgp.fit(model, guide, X, y, num_steps=150, lr=0.02, progress=False)
    assert r.losses[-1] < r.losses[0]
    pred = dgp.predict(model, guide, X, num_samples=20)
    assert torch.isfinite(pred.log_prob(y)).all()


def test_trace_mean_field_is_warned_against_for_completed_joint_autoguides():
    from pyro.infer.autoguide import AutoMultivariateNormal

    model, X, y = _model()
    guide = dgp.complete(AutoMultivariateNormal(dgp.inducing_only(model)), model)
    with pytest.warns(UserWarning, match="TraceMeanField_ELBO"):
        dgp.fit(model, guide, X, y, num_steps=2, objective="analytic-kl", progress=False)


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_joint_guides_start_at_meanfields_q(Guide, whiten):
    """At initialisation the joint guides' KL is MeanField's (the same per-layer q, also for
    unwhitened layers); after init_from a fitted MeanField, each layer's block marginal is
    MeanField's q and the closed-form KL is the sum of its per-layer KLs."""
    model, X, y = _model(whiten=whiten)
    joint = Guide(model)
    mf = dgp.guides.MeanField(model, inner_variance=joint.inner_variance)  # the same start
    with torch.no_grad():
        mf(X, y)
        joint(X, y)
    kl_mf = sum(dgp.diagnostics.layer_kl(model, mf, X).values())
    assert float(joint.kl()) == pytest.approx(kl_mf, rel=1e-9)
    dgp.fit(model, mf, X, y, num_steps=30, lr=0.05, progress=False)
    joint.init_from(mf)
    with torch.no_grad():
        for site in joint.layer_sites:
            mean, cov = joint.marginal(site)
            loc, tril = mf.q_params(mf._sites[site.name.rsplit(".", 1)[0]])
            torch.testing.assert_close(mean, loc.reshape(-1), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(cov, torch.block_diag(*(tril @ tril.mT)), rtol=1e-9,
                                       atol=1e-12)
        kl_mf = sum(dgp.diagnostics.layer_kl(model, mf, X).values())
        assert float(joint.kl()) == pytest.approx(kl_mf, rel=1e-9)
    other = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, hidden_dim=2)
    stranger = dgp.guides.MeanField(other)
    stranger(X, y)
    with pytest.raises(ValueError, match="another model"):
        joint.init_from(stranger)
    with pytest.raises(ValueError, match="run both guides"):
        Guide(model).init_from(mf)


def test_block_preconditioner_keeps_within_block_entries_and_scales_cross_blocks():
    from pyro_dgp.guides.params import (
        block_preconditioner,
        preconditioned_cholesky,
        unconstrained_tril,
    )

    like = torch.zeros((), dtype=DT)
    scale = block_preconditioner([2, 2, 3], like)
    assert scale.shape == (7, 7) and scale.dtype == DT
    assert torch.equal(scale[:2, :2], torch.ones(2, 2, dtype=DT))
    assert torch.equal(scale[4:, 4:], torch.ones(3, 3, dtype=DT))
    assert torch.allclose(scale[2:4, :2], torch.full((2, 2), 7**-1.0, dtype=DT))
    assert torch.allclose(scale[4:, :4], torch.full((3, 4), 7**-1.0, dtype=DT))
    assert torch.equal(block_preconditioner([5], like), torch.ones(5, 5, dtype=DT))
    raw = torch.randn(7, 7, dtype=DT)  # the entries above the diagonal are unused
    L, logdet = preconditioned_cholesky(raw, scale.tril(-1))
    # known answer: torch's lower-Cholesky transform, then the scales; log det from diag L
    expected = torch.distributions.transform_to(constraints.lower_cholesky)(raw) * scale
    torch.testing.assert_close(L, expected, rtol=0, atol=0)
    torch.testing.assert_close(logdet, 2 * L.diagonal().log().sum(), rtol=1e-15, atol=0)
    torch.testing.assert_close(unconstrained_tril(L, scale), raw.tril(), rtol=1e-15,
                               atol=1e-15)
    # its hand-written backward, of both outputs and batched, against finite differences
    batch = torch.randn(2, 7, 7, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda r: preconditioned_cholesky(r, scale.tril(-1).expand(2, 7, 7)), (batch,))
    # unit scales (MeanField's factors): exactly torch's transform and its inverse
    L1, logdet1 = preconditioned_cholesky(raw)
    lower = torch.distributions.transform_to(constraints.lower_cholesky)
    torch.testing.assert_close(L1, lower(raw), rtol=0, atol=0)
    torch.testing.assert_close(logdet1, 2 * L1.diagonal().log().sum(), rtol=1e-15, atol=0)
    torch.testing.assert_close(unconstrained_tril(L1), lower.inv(L1), rtol=0, atol=0)
    assert torch.autograd.gradcheck(preconditioned_cholesky, (batch,))
    # a joint guide's per-layer blocks are parameterised as MeanField's: one unit of a raw
    # within-block entry is one unit of the factor
    model, X, y = _model()
    guide = Coupled(model)
    guide(X, y)
    grad, = torch.autograd.grad(guide.factor()[1][1, 0], guide.scale_tril_unconstrained)
    assert float(grad[1, 0]) == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_three_layer_per_point_and_shared_estimators_agree(Guide):
    """Three layers: two drawn per point (each point's u^2 drawn given its own u^1), the
    last collapsed; the same ELBO as one shared draw, within 3 standard errors."""
    model, X, y = _model(num_layers=3, N=15, M=4, hidden=1)
    guide = Guide(model)
    guide(X, y)
    mean, L = _random_joint(guide.dim, seed=8, scale=0.2)
    if Guide is Coupled:
        _set_coupled(guide, mean, L)
    else:  # Chain's own parameterisation: random blocks and couplings
        g = torch.Generator().manual_seed(9)
        for site in guide.layer_sites:
            n = site.shape.numel()
            prev = guide.layer_sites[site.index - 1].shape.numel() if site.index else 0
            guide.set_block(site, 0.5 * torch.randn(n, generator=g, dtype=DT),
                            0.4 * torch.eye(n, dtype=DT),
                            0.3 * torch.randn(n, prev, generator=g, dtype=DT) if prev else None)
    est = {}
    for per_point in (True, False):
        guide.per_point = per_point
        pyro.set_rng_seed(4)
        est[per_point] = _estimates(Trace_ELBO(), model, guide, X, y, 500)
    a, b = est[True], est[False]
    se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
    assert abs(float(a.mean() - b.mean())) < 3 * se
    assert float(a.var()) < float(b.var())


def test_chain_three_layer_draws_and_factor_follow_its_conditionals():
    """Three layers, random blocks and couplings: the factor behind the KL and the ancestral
    draws both give q(v_l | v_{l-1}) = N(m_l + B_l (v_{l-1} - m_{l-1}), L_l L_l^T), with
    (m_l, L_l, B_l) as set (the draws within 4.5 Monte Carlo standard errors)."""
    model, X, y = _model(num_layers=3, N=15, M=4, hidden=1)
    chain = Chain(model)
    chain(X, y)
    g = torch.Generator().manual_seed(3)
    given = []  # the (m_l, L_l, B_l) set, from which the reference is built
    for site in chain.layer_sites:
        n = site.shape.numel()
        prev = chain.layer_sites[site.index - 1].shape.numel() if site.index else 0
        tril = 0.3 * torch.randn(n, n, generator=g, dtype=DT).tril(-1) + torch.diag(
            0.2 + 0.5 * torch.rand(n, generator=g, dtype=DT))
        loc = torch.randn(n, generator=g, dtype=DT)
        B = 0.5 * torch.randn(n, prev, generator=g, dtype=DT) if prev else None
        chain.set_block(site, loc, tril, B)
        given.append((loc, tril, B))
    with torch.no_grad():
        rows, means = [], []
        T, offset = chain.dim, 0
        for site, (m, L, B) in zip(chain.layer_sites, given, strict=True):
            stored = chain.block_params(site)  # round trip through the C = B L_{l-1} storage
            torch.testing.assert_close(stored[0], m)
            torch.testing.assert_close(stored[1], L)
            if B is not None:
                torch.testing.assert_close(stored[2], B)
            row = torch.zeros(m.shape[-1], T, dtype=DT)
            if B is not None:
                row = row + B @ rows[-1]
            row[:, offset:offset + m.shape[-1]] += L
            rows.append(row)
            means.append(m)
            offset += m.shape[-1]
        R_ref, mean_ref = torch.cat(rows), torch.cat(means)
        mean, R, _, _ = chain.factor()
        torch.testing.assert_close(mean, mean_ref)
        torch.testing.assert_close(R @ R.mT, R_ref @ R_ref.mT)
        torch.manual_seed(0)
        n = 40000
        v = chain.sample(torch.Size([n]))
        S = R_ref @ R_ref.mT
        se_mean = (S.diagonal() / n).sqrt()
        assert ((v.mean(0) - mean_ref).abs() < 4.5 * se_mean).all()
        emp = torch.cov(v.mT)
        se_cov = ((S.square() + S.diagonal()[:, None] * S.diagonal()[None, :]) / n).sqrt()
        assert ((emp - S).abs() < 4.5 * se_cov).all()


@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_three_layer_loss_gradient_matches_finite_differences(Guide):
    """Three layers (so Chain's middle block enters the next one through a triangular solve):
    the loss backpropagates, and its gradient along random directions in the guide's
    parameters equals a central finite difference of the loss at the same draws."""
    from pyro_dgp.train.training import make_objective

    model, X, y = _model(num_layers=3, N=15, M=4, hidden=1)
    guide = Guide(model)
    guide(X, y)
    elbo = make_objective("auto", guide)
    params = [p for p in guide.parameters() if p.requires_grad]

    def loss():
        pyro.set_rng_seed(5)  # the same draws at every evaluation
        return elbo.differentiable_loss(model, guide, X, y)

    grads = torch.autograd.grad(loss(), params)
    g = torch.Generator().manual_seed(2)
    h = 1e-6
    for _ in range(3):
        dirs = [torch.randn(p.shape, generator=g, dtype=DT) for p in params]
        with torch.no_grad():
            for p, d in zip(params, dirs, strict=True):
                p.add_(h * d)
            up = float(loss())
            for p, d in zip(params, dirs, strict=True):
                p.sub_(2 * h * d)
            down = float(loss())
            for p, d in zip(params, dirs, strict=True):
                p.add_(h * d)
        directional = sum(float((gr * d).sum()) for gr, d in zip(grads, dirs, strict=True))
        assert (up - down) / (2 * h) == pytest.approx(directional, rel=1e-5, abs=1e-6)


def test_low_rank_coupled_names_itself_on_non_finite_parameters():
    from pyro_dgp.linalg import CholeskyError

    model, X, y = _model()
    guide = Coupled(model, rank=3)
    guide(X, y)
    with torch.no_grad():
        guide.cov_factor.unconstrained()[0, 0] = math.nan
    with pytest.raises(CholeskyError, match="Coupled \\(low rank\\)"):
        guide(X, y)
