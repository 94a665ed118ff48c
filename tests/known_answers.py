"""Closed forms shared by several test files."""

import torch
from torch.distributions import MultivariateNormal, Normal, kl_divergence

import pyro_dgp as dgp
from pyro_dgp.kernels import RBF
from pyro_dgp.likelihoods import Gaussian

DT = torch.float64


def whitened_optimum(model, X, y):
    """``(m (M,), C (M, M))``: the optimal ``q(v) = N(m, C)`` of a whitened one-layer GP with
    a Gaussian likelihood (Titsias 2009 in whitened coordinates). With ``A = L^-1 K_ZX``
    ``(M, N)`` the expected log-likelihood is ``sum_i log N(y_i | a_i^T v, s2)`` up to terms
    free of ``v``, so ``C = (I + A A^T / s2)^-1`` and ``m = C A y / s2``; ``C`` is symmetrised
    against the inverse's rounding."""
    layer = model.layers[0]
    with torch.no_grad():
        L = layer.kzz_cholesky()
        A = torch.linalg.solve_triangular(L, layer.kernel(layer.inducing_points, X), upper=False)
        s2 = model.likelihood.variance
        C = torch.linalg.inv(torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
                             + A @ A.mT / s2)
        C = 0.5 * (C + C.mT)
        return C @ A @ y / s2, C


def single_layer(N=30, M=8, whiten=True, jitter=1e-12, Z=None, seed=0):
    """``(model, X (N, 1), y (N,))``: a one-layer float64 SVGP on a noisy sine, ``M`` inducing
    points."""
    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(-2.5, 2.5, N, dtype=DT).unsqueeze(-1)
    y = torch.sin(2 * X.squeeze(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    if Z is None:
        Z = torch.linspace(-2.2, 2.2, M, dtype=DT).unsqueeze(-1)
    kernel = RBF(1, variance=1.3, lengthscale=0.8)
    layer = dgp.GPLayer(1, 1, inducing_points=Z, kernel=kernel, whiten=whiten, jitter=jitter)
    model = dgp.DeepGP([layer], Gaussian(variance=0.05)).to(DT)
    return model, X, y


def dense_svgp_elbo(model, X, y, loc, tril):
    """Closed-form single-layer SVGP ELBO computed with dense algebra, independently of the
    library's conditional: sum_i E_q(f_i) log N(y_i | f_i, s2) - KL(q(u) || p(u))."""
    layer = model.layers[0]
    with torch.no_grad():
        Z = layer.inducing_points
        Kzz = layer.kernel(Z)
        Kzx = layer.kernel(Z, X)
        kxx = layer.kernel(X, diag=True)
        s2 = model.likelihood.variance
        m, S = loc[0], tril[0] @ tril[0].mT
        if layer.whiten:  # u = L v
            L = torch.linalg.cholesky(Kzz)
            m, S = L @ m, L @ S @ L.mT
        Kinv_Kzx = torch.linalg.solve(Kzz, Kzx)
        mean = Kinv_Kzx.mT @ m
        var = kxx - (Kzx * Kinv_Kzx).sum(0) + (Kinv_Kzx * (S @ Kinv_Kzx)).sum(0)
        ell = (Normal(mean, s2.sqrt()).log_prob(y) - 0.5 * var / s2).sum()
        kl = kl_divergence(MultivariateNormal(m, S), MultivariateNormal(torch.zeros_like(m), Kzz))
    return float(ell - kl)


def split_layers(guide, v):
    """Split joint values ``(..., T)`` of ``[vec u^1; ...; vec u^L]`` into the layers'
    ``(..., D, M)``, in ``guide``'s order."""
    out, lo = [], 0
    for site in (guide.site(name) for name in guide.layer_names):
        n = site.shape.numel()
        out.append(v[..., lo:lo + n].reshape(v.shape[:-1] + site.shape))
        lo += n
    return out
