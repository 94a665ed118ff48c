"""The collapsed estimator of the joint guides: exact per-point conditionals against dense
Gaussian conditioning, MeanField's marginals for independent layers, unbiasedness."""

import math

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

import pyro_dgp as dgp
from pyro_dgp.guides import Chain, Coupled, MeanField
from pyro_dgp.guides.joint_collapse import PointPosterior, collapsed_joint

DT = torch.float64


def _model(num_layers=2, N=8, M=4, hidden=2, whiten=True, D_in=2, per_output=False):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(N, D_in, generator=g, dtype=DT)
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    model = dgp.DeepGP.regression(X, y, num_layers=num_layers, num_inducing=M,
                                  hidden_dim=hidden, whiten=whiten, seed=0,
                                  kernel_per_output=per_output)
    return model, X, y


def _random_coupled(model, X, y, seed=1, **kwargs):
    guide = Coupled(model, estimator="collapsed", per_point=True, **kwargs)
    guide(X, y)
    g = torch.Generator().manual_seed(seed)
    T = guide.dim
    mean = 0.5 * torch.randn(T, generator=g, dtype=DT)
    L = 0.4 * torch.randn(T, T, generator=g, dtype=DT).tril(-1) / math.sqrt(T)
    guide.set_joint(mean, L + torch.diag(0.3 + 0.5 * torch.rand(T, generator=g, dtype=DT)))
    return guide


def _block(guide, index):
    mean, R, _, _ = guide.factor()
    site = guide.layer_sites[index]
    D, M = site.shape
    lo = sum(s.shape.numel() for s in guide.layer_sites[:index])
    return site, mean[lo : lo + D * M].reshape(D, M), R[lo : lo + D * M].reshape(D, M, -1)


def _projection(layer, x):
    """Dense ``a_n = K_ZZ^{-1/2} k_Z(x_n)`` (whitened), ``k~_n`` and ``m(x_n)`` at ``x (N, D)``,
    from the kernel alone."""
    Z = layer.inducing_points
    L = torch.linalg.cholesky(layer.kernel(Z) + 1e-12 * torch.eye(len(Z), dtype=DT))
    A = torch.linalg.solve_triangular(L, layer.kernel(Z, x), upper=False)  # (M, N)
    return A, layer.kernel(x, diag=True) - (A * A).sum(0), layer.mean_function(x)


@pytest.mark.parametrize("whiten", [True, False])
def test_second_layer_equals_dense_gaussian_conditioning(whiten):
    """Layer 2 at one point given its drawn f^1: the law of u^2 given f^1(x_n) by dense
    conditioning of the joint Gaussian of (v, f^1(x_n)), pushed through layer 2's conditional
    at x = f^1(x_n); equal to rounding."""
    model, X, y = _model(whiten=whiten)
    for layer in model.layers:
        layer.jitter = 1e-12
    guide = _random_coupled(model, X, y)
    state = PointPosterior()
    with torch.no_grad():
        site1, m1, R1 = _block(guide, 0)
        draw = collapsed_joint(site1, X, m1, R1, state)
        f1 = draw.rsample()
        site2, m2, R2 = _block(guide, 1)
        loc2, var2 = collapsed_joint(site2, f1, m2, R2, state)
        mean, R, _, _ = guide.factor()
        S = R @ R.mT
        l1, l2 = model.layers
        Lz1 = l1.kzz_cholesky() if not whiten else None
        Lz2 = l2.kzz_cholesky() if not whiten else None
        A1, k1, mf1 = _projection(l1, X)
        A2, k2, mf2 = _projection(l2, f1)
        D1, M1 = site1.shape
        n1 = D1 * M1
        for n in range(X.shape[0]):
            a1 = A1[:, n] if whiten else torch.linalg.solve_triangular(
                Lz1.mT, A1[:, n : n + 1], upper=True).squeeze(-1)  # K_ZZ^-1 k_Z(x) unwhitened
            H = torch.zeros(D1, mean.shape[0], dtype=DT)  # f^1(x_n) = mf + H v + noise
            for d in range(D1):
                H[d, d * M1 : (d + 1) * M1] = a1
            c = mf1[n] + H @ mean
            V = H @ S @ H.mT + torch.diag(k1[n].expand(D1))
            torch.testing.assert_close(draw.base_dist.loc[n], c)
            torch.testing.assert_close(draw.output_scale_tril[n] @ draw.output_scale_tril[n].mT,
                                       V)
            gain = S @ H.mT @ torch.linalg.inv(V)
            mean_v = mean + gain @ (f1[n] - c)
            cov_v = S - gain @ H @ S
            mu2, S2 = mean_v[n1:], cov_v[n1:, n1:]
            a2 = A2[:, n] if whiten else torch.linalg.solve_triangular(
                Lz2.mT, A2[:, n : n + 1], upper=True).squeeze(-1)
            torch.testing.assert_close(loc2[n, 0], mf2[n, 0] + a2 @ mu2)
            torch.testing.assert_close(var2[n, 0], a2 @ S2 @ a2 + k2[n])


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("per_output", [False, True])
@pytest.mark.parametrize("Guide", [Coupled, Chain])
def test_independent_layers_give_meanfields_collapsed_marginals(Guide, per_output, whiten):
    """A joint q with no cross-layer terms (started at MeanField's q): each layer's marginal
    given the same f below equals MeanField's collapsed estimator's (a kernel per output or
    one per layer, whitened or not)."""
    model, X, y = _model(per_output=per_output, whiten=whiten)
    mf = MeanField(model)
    mf(X, y)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in mf.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=DT))
    guide = Guide(model, estimator="collapsed", per_point=True)
    guide(X, y)
    guide.init_from(mf)
    state = PointPosterior()
    with torch.no_grad():
        x = X
        for index, site in enumerate(guide.layer_sites):
            out = collapsed_joint(*_block(guide, index)[:1], x, *_block(guide, index)[1:], state)
            loc, var = (out.base_dist.loc, out.var) if not site.is_last else out
            ref = site.layer.conditional(x, *mf.q_params(mf.site(site.name)))
            torch.testing.assert_close(loc, ref[0])
            torch.testing.assert_close(var, ref[1])
            if not site.is_last:
                assert torch.equal(out.output_scale_tril, out.output_scale_tril.tril())
                x = out.rsample()


@pytest.mark.slow
@pytest.mark.parametrize("rank", [None, 2])
@pytest.mark.parametrize("num_layers", [2, 3])
def test_collapsed_estimator_is_unbiased_and_of_no_higher_variance(num_layers, rank):
    """The same q: the collapsed and the sampled per-point estimators' ELBOs agree within 3
    standard errors, and the collapsed one's variance is not above the sampled one's beyond 3
    standard errors of the two variances (Rao-Blackwell: per point it is the sampled
    estimate's expectation given the point's inner draws of f, whose law is the same)."""
    model, X, y = _model(num_layers=num_layers, N=10, M=3, hidden=2)
    guide = Coupled(model, rank=rank, per_point=True)
    guide(X, y)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=DT))
    est = {}
    for estimator in ("sampled", "collapsed"):
        guide.estimator = estimator
        pyro.set_rng_seed(4)
        with torch.no_grad():
            est[estimator] = torch.tensor([-Trace_ELBO().loss(model, guide, X, y)
                                           for _ in range(1000)], dtype=DT)
    a, b = est["collapsed"], est["sampled"]
    se = math.sqrt(float(a.var() / len(a) + b.var() / len(b)))
    assert abs(float(a.mean() - b.mean())) < 3 * se, (float(a.mean()), float(b.mean()), se)
    n = len(a)
    var_se = math.sqrt(2 / (n - 1)) * math.hypot(float(a.var()), float(b.var()))
    assert float(a.var()) < float(b.var()) + 3 * var_se, (float(a.var()), float(b.var()))


def test_collapsed_estimator_trains_and_gives_gradients_to_every_parameter():
    model, X, y = _model(num_layers=3, N=10, M=3, hidden=2)
    guide = Chain(model, estimator="collapsed", per_point=True)
    loss = Trace_ELBO().differentiable_loss(model, guide, X, y)
    loss.backward()
    grads = [p.grad for p in guide.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    result = dgp.fit(model, guide, X, y, num_steps=30, seed=0, progress=False)
    assert math.isfinite(result.losses[-1])


def test_an_unknown_estimator_is_refused_by_name():
    model, _, _ = _model()
    with pytest.raises(ValueError, match="estimator must be 'sampled' or 'collapsed'"):
        Coupled(model, estimator="exact")
