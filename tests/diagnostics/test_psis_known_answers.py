"""Known answers for the importance weights of ``variational_pareto_k`` beyond one layer with
fixed hyperparameters (where tests/diagnostics/test_arviz.py checks them against the exact
posterior).

Whatever ``q`` is, as long as it covers the posterior, the weights are those of an exact
importance sampler whose target's normaliser is the marginal likelihood, so

    E_q[w] = p(y),    i.e.    logmeanexp(log w) -> log p(y)   as S grows.

- Two layers: ``log w`` is the weight of the extended proposal
  ``q(u) p(f^1 | u^1, X)`` against ``p(u, f^1 | y)`` (the last layer integrated out per
  point); ``E[w] = p(y)`` for any ``q(u)``.
- A Bayesian lengthscale (``PyroSample``) guided by a completed ``AutoNormal``: ``theta`` is
  ``(u, lengthscale)``, ``E[w] = int p(y | l) p(l) dl``.

``log p(y)`` is computed here independently of the library, by Gauss-Hermite quadrature over
the model's Gaussian structure, written out from the model's definition (numpy):

- Function values are conditionally independent across points given ``u`` (the model samples
  ``f_i ~ N(a_i^T v, k(x_i, x_i) - |a_i|^2)`` per point, with ``u = L v``, ``v ~ N(0, I)``,
  ``L L^T = K_ZZ + jitter mean(diag K_ZZ) I``, ``A = L^{-1} K_ZX``). So ``f`` at the N
  points is jointly Gaussian with covariance ``A^T A + diag(k(x_i, x_i) - |a_i|^2)``: the
  sparse model's own prior, not ``K(X, X)`` (the two differ where ``M < N``).
- The inner layer of ``DeepGP.regression`` has kernel ``RBF + White(inner_noise)``: the white
  noise enters ``K_ZZ`` and ``k(x, x)`` but not ``K_ZX``, and its mean is the identity (one
  input dim, one hidden dim). The last layer has an RBF kernel and zero mean.

Each ``q`` below is the prior or wider than the prior (``Cov q - I`` positive definite in the
whitened coordinates, shifted means, correlations; a wider shifted ``q(log l)``): then
``p / q`` is bounded, and so is every weight (the likelihood is), so the Monte Carlo standard
error estimated from the weights themselves is reliable. (A trained ``q`` need not
be: the likelihood stays flat far out in ``u^1``, where the inner values leave the last layer's
inducing inputs behind and it reverts to its prior, so the posterior keeps prior-like tails
there, and a ``q`` narrower than half the prior's variance gives ``E[w^2] = inf``.)

The tolerance is 4 standard errors of ``log mean(w)`` (delta method:
``sd(w) / (sqrt(S) mean(w))``) plus the quadrature's own error (bounded by raising its order).

The tests can fail (measured at their seeds, in a scratch script): ``log q``
dropped or scaled by 0.95, the Jacobian of ``q(l)`` or ``q(l)`` itself left out, ``f^1`` taken
from the guide's collapsed draw instead of ``p(f^1 | u^1)`` (all guides but the completed
autoguide, whose ``f^1`` is drawn from ``p(f^1 | u^1)`` anyway); and in the reference: twice
the observation noise, the inner white noise left out, ``K(X, X)`` in place of the sparse
prior, the lengthscale fixed at its prior median or its prior mean moved by 0.3.
"""

import itertools
import math
from functools import cache
from operator import attrgetter

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroSample

import pyro_dgp as dgp
from pyro_dgp.diagnostics.psis import variational_pareto_k

DT = torch.float64
JITTER = 1e-6  # passed to the model explicitly, so the reference does not rely on a default
S = 100_000  # importance draws per test


def _rbf(a: np.ndarray, b: np.ndarray, var: float, ls: float) -> np.ndarray:
    """``(..., n, m)`` RBF kernel between 1-D inputs ``a (..., n)`` and ``b (..., m)``."""
    return var * np.exp(-0.5 * (a[..., :, None] - b[..., None, :]) ** 2 / ls**2)


def _sparse_prior_cov(Z, x, var, ls, white=0.0):
    """``(..., N, N)`` covariance of the layer's ``f(x)`` with ``u`` integrated out, as the
    model defines it: ``A^T A + diag(k(x, x) - |a_i|^2)`` (f_i independent given ``u``), with
    the white noise in ``K_ZZ`` and ``k(x, x)`` only and the relative jitter in ``K_ZZ``.
    ``x`` may carry batch dims (one covariance per quadrature node)."""
    Kzz = _rbf(Z, Z, var, ls) + white * np.eye(len(Z))
    Kzz = Kzz + JITTER * np.mean(np.diag(Kzz)) * np.eye(len(Z))
    L = np.linalg.cholesky(Kzz)
    A = np.linalg.solve(L, _rbf(Z, x, var, ls))  # (..., M, N): broadcasts L over the batch
    resid = var + white - (A * A).sum(-2)
    return np.swapaxes(A, -1, -2) @ A + resid[..., :, None] * np.eye(x.shape[-1])


def _mvn_zero_logpdf(y: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """``log N(y; 0, cov)`` for a batch of covariances ``(..., N, N)``."""
    L = np.linalg.cholesky(cov)
    alpha = np.linalg.solve(L, np.broadcast_to(y, cov.shape[:-1])[..., None])[..., 0]
    logdet = 2 * np.log(np.diagonal(L, axis1=-2, axis2=-1)).sum(-1)
    return -0.5 * (len(y) * math.log(2 * math.pi) + logdet + (alpha * alpha).sum(-1))


def _gauss_hermite(order: int, dim: int):
    """Nodes ``(G, dim)`` and log-weights ``(G,)`` of ``E f(z)``, ``z ~ N(0, I_dim)``, on a
    tensor-product grid of ``order`` points per dimension."""
    t, w = np.polynomial.hermite.hermgauss(order)
    z, lw = math.sqrt(2) * t, np.log(w / math.sqrt(math.pi))
    nodes = np.array(list(itertools.product(z, repeat=dim)))
    log_weights = np.array(list(itertools.product(lw, repeat=dim))).sum(1)
    return nodes, log_weights


def _log_mean_and_se(log_w: np.ndarray) -> tuple[float, float]:
    """``log mean(w)`` and its standard error ``sd(w) / (sqrt(S) mean(w))`` (delta method)."""
    w = np.exp(log_w - log_w.max())
    return float(np.log(w.mean()) + log_w.max()), float(w.std() / w.mean() / math.sqrt(len(w)))


def _assert_log_marginal(res, reference: float, quad_err: float) -> None:
    est, se = _log_mean_and_se(res.log_weights)
    assert res.log_marginal == pytest.approx(est, abs=1e-9)
    # the weights are bounded by construction (q wider than the prior), so their variance is
    # finite and the standard error meaningful; k-hat only guards that premise (bounded but
    # widely spread weights can still read above 0.5: 0.54 for the coupled q below)
    assert res.k < 0.7, res.k
    assert se < 0.05, se  # the test has power: a bias of 0.2 nats cannot hide in 4 se
    assert abs(est - reference) < 4 * se + quad_err, (est, reference, se, quad_err)


def _autonormal_sites(inner: AutoNormal) -> list[str]:
    return [n.removesuffix("_unconstrained") for n, _ in inner.locs.named_parameters()]


def _set_autonormal(inner: AutoNormal, params) -> None:
    """Set every site of an AutoNormal to ``params(site name) = (loc, scale)`` (of the site's
    unconstrained value), and check that it reads them back."""
    inv = torch.distributions.transform_to(inner.scale_constraint).inv
    for name in _autonormal_sites(inner):
        loc, scale = (torch.as_tensor(v, dtype=DT) for v in params(name))
        for holder, value in ((inner.locs, loc), (inner.scales, inv(scale))):
            raw = attrgetter(name + "_unconstrained")(holder)
            raw.copy_(value.expand(raw.shape))
        for holder, want in ((inner.locs, loc), (inner.scales, scale)):
            got = attrgetter(name)(holder)  # the constrained value
            torch.testing.assert_close(got, want.expand(got.shape))


# ------------------------------------------------------------------------- two layers
X2 = torch.tensor([[-1.0], [0.1], [0.9]], dtype=DT)
Y2 = torch.tensor([1.5, -1.0, 1.2], dtype=DT)
# kernel variance and lengthscale (both layers), inner white noise, observation noise: chosen
# so that log p(y) is sensitive to the model (noise away from its ML-II optimum: 1.1 times the
# noise moves log p(y) by 0.04, leaving out the white noise by 0.08, K(X, X) in place of the
# sparse prior by 0.23 nats)
VAR, LS, WHITE, NOISE = 1.0, 0.8, 0.1, 0.3


def _two_layer_model():
    return dgp.DeepGP.regression(
        X2, Y2, num_layers=2, hidden_dim=1, num_inducing=2, noise_variance=NOISE,
        kernel_variance=VAR, lengthscale=LS, inner_noise=WHITE, jitter=JITTER)


def _two_layer_log_py(Z1, Z2, order, noise=None):
    """``log p(y) = log E_{h ~ N(X, C1)} N(y; 0, C2(h) + noise I)``: ``h`` the inner layer's
    values at the N = 3 points (identity mean, covariance ``C1``, white noise included),
    ``C2(h)`` the last layer's sparse prior covariance at them; 3-D Gauss-Hermite over the
    Cholesky-whitened ``h``."""
    x, y = X2[:, 0].numpy(), Y2.numpy()
    C1 = _sparse_prior_cov(Z1, x, VAR, LS, WHITE)
    nodes, log_weights = _gauss_hermite(order, len(x))
    H = x + nodes @ np.linalg.cholesky(C1).T  # (G, N) inner values
    C2 = _sparse_prior_cov(Z2, H, VAR, LS) + (NOISE if noise is None else noise) * np.eye(len(x))
    return float(np.logaddexp.reduce(_mvn_zero_logpdf(y, C2) + log_weights))


@cache
def _two_layer_reference():
    """``(log p(y), quadrature error bound)``. Gauss-Hermite converges slowly here (the
    integrand is analytic only in a strip: 1.5e-5 off at 40 points per dim, 5e-6 at 60, against
    100): the bound is ten times the change from 60 to 80 points per dim, far below the Monte
    Carlo tolerance either way."""
    model = _two_layer_model()
    Z1, Z2 = (layer.inducing_points.detach()[:, 0].numpy() for layer in model.layers)
    coarse, fine = _two_layer_log_py(Z1, Z2, 60), _two_layer_log_py(Z1, Z2, 80)
    err = 10 * abs(fine - coarse)
    assert err < 2e-3, (coarse, fine)
    return fine, err


def _wide_joint_q():
    """``(mean (4,), Cov (4, 4))`` over ``[v^1; v^2]`` (whitened u of both layers): not the
    prior, not the posterior, with cross-layer correlations; every eigenvalue of ``Cov`` is
    above 1.3 (and so is every eigenvalue of its blocks and every variance)."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(4, 4, generator=g, dtype=DT)
    cov = 1.3 * torch.eye(4, dtype=DT) + 0.3 * G @ G.T
    return torch.tensor([0.4, -0.3, 0.3, 0.6], dtype=DT), cov


def _two_layer_guide(kind, model):
    mean, cov = _wide_joint_q()
    if kind == "prior":  # q(u) = p(u): w = p(y | u, f^1) under the prior, E[w] = p(y)
        mean, cov = torch.zeros(4, dtype=DT), torch.eye(4, dtype=DT)
    if kind in ("prior", "meanfield"):  # independent layers: the diagonal blocks of cov
        guide = dgp.guides.MeanField(model)
        guide(X2, Y2)
        for i, name in enumerate(("layer1.u", "layer2.u")):
            b = slice(2 * i, 2 * i + 2)
            guide.set_q_params(name, mean[b][None], torch.linalg.cholesky(cov[b, b])[None])
    elif kind == "coupled":
        guide = dgp.guides.Coupled(model)
        guide(X2, Y2)
        guide.set_joint(mean, torch.linalg.cholesky(cov))
    elif kind == "chain":  # q(v1) q(v2 | v1): v2 = m2 + B (v1 - m1) + L2 e
        guide = dgp.guides.Chain(model)
        guide(X2, Y2)
        first, last = guide.layer_sites
        B = cov[2:, :2] @ torch.linalg.inv(cov[:2, :2])
        guide.set_block(first, mean[:2], torch.linalg.cholesky(cov[:2, :2]))
        guide.set_block(last, mean[2:], torch.linalg.cholesky(cov[2:, 2:] - B @ cov[:2, 2:]),
                        coupling=B)
    else:  # a completed AutoNormal: independent coordinates, the diagonal of cov
        guide = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
        guide(X2, Y2)
        sd = cov.diagonal().sqrt()
        _set_autonormal(guide.inner, lambda name: (
            (mean[:2], sd[:2]) if name == "layer1.u" else (mean[2:], sd[2:])))
    if kind in ("coupled", "chain"):  # the joint q is the one intended
        loc, R, _, _ = guide.factor()
        torch.testing.assert_close(loc, mean)
        torch.testing.assert_close(R @ R.T, cov)
    return guide


@pytest.mark.parametrize("kind", ["prior", "meanfield", "coupled", "chain", "autonormal"])
def test_two_layer_weights_average_to_the_marginal_likelihood(kind):
    """L = 2: ``logmeanexp(log w) = log p(y)`` within 4 Monte Carlo standard errors (plus the
    quadrature error), for q = the prior, and for a wide, shifted, correlated q represented by
    each guide family (mean-field, joint, chain, completed autoguide: each with its own log q,
    the joint guides' through ``layers_log_q``)."""
    torch.set_num_threads(1)
    reference, quad_err = _two_layer_reference()
    model = _two_layer_model()
    with torch.no_grad():
        guide = _two_layer_guide(kind, model)
    res = variational_pareto_k(model, guide, X2, Y2, num_samples=S, seed=0)
    print(kind, _log_mean_and_se(res.log_weights), reference, res.k)
    _assert_log_marginal(res, reference, quad_err)


# ------------------------------------------------------------ Bayesian hyperparameters
XB = torch.linspace(-1.5, 1.5, 5, dtype=DT).unsqueeze(-1)
YB = torch.tensor([-0.6, -0.4, 0.15, 0.5, 0.35], dtype=DT)
LS_LOC, LS_SCALE, VAR_B, NOISE_B = -0.3, 0.5, 1.0, 0.2  # log-lengthscale prior N(-0.3, 0.5^2)


def _bayesian_lengthscale_model():
    model = dgp.DeepGP.regression(XB, YB, num_layers=1, num_inducing=4, noise_variance=NOISE_B,
                                  kernel_variance=VAR_B, jitter=JITTER)
    model.layers[0].kernel.lengthscale = PyroSample(
        dist.LogNormal(torch.tensor([LS_LOC], dtype=DT), LS_SCALE).to_event(1))
    return model


def _bayesian_log_py(Z, order, noise=None):
    """``log int N(y; 0, C(l) + noise I) LogNormal(l) dl``: Gauss-Hermite in ``log l``."""
    x, y = XB[:, 0].numpy(), YB.numpy()
    t, w = np.polynomial.hermite.hermgauss(order)
    ls = np.exp(LS_LOC + math.sqrt(2) * LS_SCALE * t)
    noise = NOISE_B if noise is None else noise
    cov = np.stack([_sparse_prior_cov(Z, x, VAR_B, s) for s in ls]) + noise * np.eye(len(x))
    return float(np.logaddexp.reduce(_mvn_zero_logpdf(y, cov) + np.log(w / math.sqrt(math.pi))))


@pytest.mark.parametrize("q", ["prior", "shifted"])
def test_bayesian_lengthscale_weights_average_to_the_marginal_likelihood(q):
    """A one-layer model whose RBF lengthscale is a ``PyroSample`` (LogNormal prior), guided by
    ``complete(AutoNormal(inducing_only(model)), model)``: ``theta = (u, l)``, ``log w`` counts
    ``log p(l)`` and the guide's ``log q(l)`` (a transformed Normal, its Jacobian included) and
    ``logmeanexp(log w) = log int p(y | l) p(l) dl`` within 4 Monte Carlo standard errors.
    ``q = prior``: AutoNormal set to the prior of both ``u`` and ``log l``. ``shifted``: a
    shifted ``q(log l)`` 1.2 times wider than the prior, and a wide shifted ``q(v)``."""
    torch.set_num_threads(1)
    model = _bayesian_lengthscale_model()
    guide = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    with torch.no_grad():
        guide(XB, YB)
        ls_q, u_q = {  # (loc, scale) of the lengthscale's log and of each whitened u
            "prior": ((LS_LOC, LS_SCALE), (0.0, 1.0)),
            "shifted": ((LS_LOC + 0.4, 1.2 * LS_SCALE), ([[-0.5, 0.1, 0.4, -0.2]], 1.3)),
        }[q]
        assert sorted(n.endswith("lengthscale") for n in _autonormal_sites(guide.inner)) == [0, 1]
        _set_autonormal(guide.inner, lambda name: ls_q if name.endswith("lengthscale") else u_q)
    Z = model.layers[0].inducing_points.detach()[:, 0].numpy()
    coarse, fine = _bayesian_log_py(Z, 60), _bayesian_log_py(Z, 120)
    quad_err = 10 * abs(fine - coarse)
    assert quad_err < 1e-4, (coarse, fine)
    res = variational_pareto_k(model, guide, XB, YB, num_samples=S, seed=0)
    print(q, _log_mean_and_se(res.log_weights), fine, res.k)
    _assert_log_marginal(res, fine, quad_err)
