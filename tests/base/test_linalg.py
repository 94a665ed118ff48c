"""Known answers for the Cholesky helper and the GP conditional: exact factors, jitter
escalation, failures that name the layer, and the conditional against dense linear algebra
(torch.linalg.solve), in both parameterisations and with batch dims."""

import warnings

import pyro
import pytest
import torch

from pyro_dgp import GPLayer
from pyro_dgp.gp.conditional import conditional
from pyro_dgp.kernels import RBF, Matern52
from pyro_dgp.linalg import CholeskyError, NumericalWarning, cholesky, default_jitter

DT = torch.float64


@pytest.fixture(autouse=True)
def _float64_local_params():
    """Hyperparameters built in float64 (exact), parameters module-local (no aliasing of
    same-named top-level modules through the global param store)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(DT)
    with pyro.settings.context(module_local_params=True):
        yield
    torch.set_default_dtype(old)


def _spd(M, seed=0, scale=1.0, batch=()):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, M, M, generator=g, dtype=DT)
    return scale * (A @ A.mT / M + torch.eye(M, dtype=DT))


def _rel_jitter_matrix(K, jitter):
    M = K.shape[-1]
    mean_diag = K.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None]
    return K + jitter * mean_diag * torch.eye(M, dtype=K.dtype)


# ------------------------------------------------------------------ cholesky
@pytest.mark.parametrize("jitter", [0.0, 1e-6, 1e-3])
def test_cholesky_exact_on_well_conditioned(jitter):
    K = _spd(6, scale=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no jitter escalation, hence no warning
        L = cholesky(K, jitter=jitter)
    assert torch.equal(L, L.tril())
    assert (L.diagonal() > 0).all()
    torch.testing.assert_close(L @ L.mT, _rel_jitter_matrix(K, jitter), rtol=1e-13, atol=1e-13)


def test_cholesky_default_jitter_depends_on_dtype():
    assert default_jitter(torch.float64) == 1e-6
    assert default_jitter(torch.float32) == 1e-5
    K = _spd(5, seed=1)
    L = cholesky(K)
    torch.testing.assert_close(L @ L.mT, _rel_jitter_matrix(K, 1e-6), rtol=1e-13, atol=1e-13)
    L32 = cholesky(K.float())
    assert L32.dtype == torch.float32
    torch.testing.assert_close(
        (L32 @ L32.mT).double(), _rel_jitter_matrix(K, 1e-5), rtol=1e-5, atol=1e-5
    )


def test_cholesky_singular_psd_with_duplicate_rows():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(6, 2, generator=g, dtype=DT)
    X = torch.cat([X, X[:2]])  # duplicate inducing points: K is exactly singular
    K = RBF(2, variance=1.5, lengthscale=0.8).to(DT)(X).detach()
    assert torch.linalg.matrix_rank(K, hermitian=True) < K.shape[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        L = cholesky(K, name="layer 'dup'")
    assert torch.isfinite(L).all() and torch.equal(L, L.tril())
    # whatever jitter was used is at most MAX_JITTER = 1e-2 relative to the mean diagonal
    err = (L @ L.mT - K).abs().max().item()
    assert err <= 1e-2 * 1.5 + 1e-12
    assert torch.allclose(L @ L.mT - K, (L @ L.mT - K).diagonal().diag_embed(), atol=1e-12)


def test_cholesky_escalation_warns_with_name_and_adds_more_jitter():
    # one eigenvalue at -5e-6 * mean diag: jitter 1e-6 fails, 1e-5 succeeds
    g = torch.Generator().manual_seed(3)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=DT))
    lam = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=DT)
    lam[-1] = -5e-6 * 3 / 4 / (1 + 5e-6 / 4)  # so that lam_4 = -5e-6 * mean(lam)
    K = Q @ torch.diag(lam) @ Q.T
    K = 0.5 * (K + K.T)
    mean_diag = K.diagonal().mean()
    assert lam[-1] / mean_diag == pytest.approx(-5e-6, rel=1e-6)
    with pytest.warns(NumericalWarning, match="layer 'inner'"):
        L = cholesky(K, jitter=1e-6, name="layer 'inner'")
    torch.testing.assert_close(L @ L.mT, _rel_jitter_matrix(K, 1e-5), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cholesky_escalation_stops_at_the_largest_jitter(dtype):
    """An eigenvalue at -5e-2 of the mean diagonal needs a relative jitter of 1e-1: more than
    MAX_JITTER (1e-2), which would change the model rather than its rounding. It raises,
    naming the layer, where the escalation used to reach 1e-1 (float64) or 1 (float32)."""
    from pyro_dgp.linalg import MAX_JITTER

    assert MAX_JITTER == 1e-2
    g = torch.Generator().manual_seed(3)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=DT))
    lam = torch.tensor([1.0, 1.0, 1.0, -0.05 * 3 / 4 / (1 + 0.05 / 4)], dtype=DT)
    K = Q @ torch.diag(lam) @ Q.T
    K = (0.5 * (K + K.T)).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        with pytest.raises(CholeskyError, match="layer 'wide'.*jitter 1.0e-02"):
            cholesky(K, name="layer 'wide'")
        # an eigenvalue at -5e-3 is still repaired, by 1e-2
        lam[-1] = -0.005 * 3 / 4 / (1 + 0.005 / 4)
        K = (Q @ torch.diag(lam) @ Q.T).to(dtype)
        L = cholesky(0.5 * (K + K.T), name="layer 'wide'")
    assert torch.isfinite(L).all()


@pytest.mark.parametrize(
    "K",
    [
        torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=DT),  # eigenvalues 3, -1
        torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=DT),  # mean diagonal 0
        -torch.eye(3, dtype=DT),
    ],
)
def test_cholesky_indefinite_raises_with_name(K):
    with pytest.raises(CholeskyError, match="layer 'mylayer'"):
        cholesky(K, name="layer 'mylayer'")
    assert issubclass(CholeskyError, RuntimeError)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_cholesky_non_finite_raises(bad):
    K = _spd(4)
    K[1, 2] = K[2, 1] = bad
    with pytest.raises(CholeskyError, match="kzz.*NaN or inf"):
        cholesky(K, name="kzz")


def test_cholesky_batched_matches_loop_with_per_batch_scale():
    K = _spd(5, seed=4, batch=(3,))
    K = K * torch.tensor([1.0, 10.0, 1e3], dtype=DT)[:, None, None]
    L = cholesky(K, jitter=1e-4)
    assert L.shape == (3, 5, 5)
    for b in range(3):
        torch.testing.assert_close(L[b], cholesky(K[b], jitter=1e-4), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(
            L[b] @ L[b].mT, _rel_jitter_matrix(K[b], 1e-4), rtol=1e-13, atol=1e-12
        )
    # two batch dims
    K2 = _spd(4, seed=5, batch=(2, 3))
    L2 = cholesky(K2, jitter=0.0)
    torch.testing.assert_close(L2, torch.linalg.cholesky(K2), rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------------ conditional
M, N, DIN, DOUT = 6, 7, 2, 3


def _problem(seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    k = Matern52(DIN, variance=1.4, lengthscale=[0.9, 1.6]).to(DT)
    Z = 1.5 * torch.randn(M, DIN, generator=g, dtype=DT)
    X = 1.5 * torch.randn(*batch, N, DIN, generator=g, dtype=DT)
    with torch.no_grad():
        Kzz = k(Z) + 1e-8 * torch.eye(M, dtype=DT)
        Kzx = k(Z, X)
        kxx = k(X, diag=True)
    Lzz = torch.linalg.cholesky(Kzz)
    return g, Kzz, Lzz, Kzx, kxx


def _random_tril(g, *shape):
    T = torch.randn(*shape, M, M, generator=g, dtype=DT).tril(-1) * 0.3
    return T + torch.diag_embed(0.2 + torch.rand(*shape, M, generator=g, dtype=DT))


def _dense_reference(Kzz, Kzx, kxx, m, S):
    """mean = Kxz Kzz^-1 m, var = kxx - diag(Kxz Kzz^-1 (Kzz - S) Kzz^-1 Kzx); one output,
    no batch dims: m (M,), S (M, M) or None."""
    alpha = torch.linalg.solve(Kzz, Kzx)  # (M, N)
    mean = alpha.T @ m
    inner = Kzz if S is None else Kzz - S
    var = kxx - (alpha * (inner @ alpha)).sum(0)
    return mean, var


@pytest.mark.parametrize("gaussian", [False, True])
def test_conditional_whitened_equals_unwhitened(gaussian):
    g, Kzz, L, Kzx, kxx = _problem()
    v = torch.randn(DOUT, M, generator=g, dtype=DT)
    Sv_tril = _random_tril(g, DOUT) if gaussian else None
    u = (L @ v.unsqueeze(-1)).squeeze(-1)  # u = L v
    Su_tril = None if Sv_tril is None else L @ Sv_tril  # S_u = L S_v L^T
    mw, vw = conditional(Kzx, L, kxx, v, Sv_tril, whiten=True)
    mu, vu = conditional(Kzx, L, kxx, u, Su_tril, whiten=False)
    assert mw.shape == vw.shape == (N, DOUT)
    torch.testing.assert_close(mw, mu, rtol=1e-10, atol=1e-11)
    torch.testing.assert_close(vw, vu, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("quadratic", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("gaussian", [False, True])
def test_conditional_matches_dense_reference(whiten, gaussian, quadratic):
    g, Kzz, L, Kzx, kxx = _problem(seed=1)
    loc = torch.randn(DOUT, M, generator=g, dtype=DT)
    tril = _random_tril(g, DOUT) if gaussian else None
    mean, var = conditional(Kzx, L, kxx, loc, tril, whiten=whiten, quadratic=quadratic)
    assert mean.shape == var.shape == (N, DOUT)
    for d in range(DOUT):
        m = L @ loc[d] if whiten else loc[d]
        S = None
        if gaussian:
            S = tril[d] @ tril[d].T
            if whiten:
                S = L @ S @ L.T
        ref_m, ref_v = _dense_reference(Kzz, Kzx, kxx, m, S)
        torch.testing.assert_close(mean[:, d], ref_m, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(var[:, d], ref_v, rtol=1e-9, atol=1e-10)
    if not gaussian:  # p(f | u): a variance reduction, never above k(x, x)
        assert (var <= kxx.unsqueeze(-1) + 1e-12).all()


@pytest.mark.parametrize("quadratic", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("gaussian", [False, True])
def test_conditional_with_batch_dims(whiten, gaussian, quadratic):
    S = 4
    g, Kzz, L, Kzx, kxx = _problem(seed=2, batch=(S,))
    assert Kzx.shape == (S, M, N) and kxx.shape == (S, N)
    loc = torch.randn(S, DOUT, M, generator=g, dtype=DT)  # a sample of u per particle
    tril = _random_tril(g, DOUT) if gaussian else None  # shared q(u) covariance
    mean, var = conditional(Kzx, L, kxx, loc, tril, whiten=whiten, quadratic=quadratic)
    assert mean.shape == var.shape == (S, N, DOUT)
    for s in range(S):
        for d in range(DOUT):
            m = L @ loc[s, d] if whiten else loc[s, d]
            Sm = None
            if gaussian:
                Sm = tril[d] @ tril[d].T
                if whiten:
                    Sm = L @ Sm @ L.T
            ref_m, ref_v = _dense_reference(Kzz, Kzx[s], kxx[s], m, Sm)
            torch.testing.assert_close(mean[s, :, d], ref_m, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(var[s, :, d], ref_v, rtol=1e-9, atol=1e-10)
    # an unbatched u broadcasts against batched x
    loc0 = loc[0]
    m0, v0 = conditional(Kzx, L, kxx, loc0, tril, whiten=whiten)
    for s in range(S):
        m1, v1 = conditional(Kzx[s], L, kxx[s], loc0, tril, whiten=whiten)
        torch.testing.assert_close(m0[s], m1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v0[s], v1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gaussian", [False, True])
def test_quadratic_form_has_the_projected_forms_gradients(gaussian):
    """The quadratic form (custom backward) and the projected form (autograd) are the same
    function: equal values and gradients for Kzx, L, kxx, m and S, with batch dims."""
    from pyro_dgp.gp.conditional import _QuadraticConditional

    g, Kzz, L, Kzx, kxx = _problem(seed=4, batch=(3,))
    loc = torch.randn(DOUT, M, generator=g, dtype=DT)
    tril = _random_tril(g, DOUT) if gaussian else None
    w_mean, w_var = torch.randn(2, 3, N, DOUT, generator=g, dtype=DT)
    grads = []
    for quadratic in (True, False):
        leaves = [t.clone().requires_grad_() for t in (Kzx, L, kxx, loc)]
        if tril is not None:
            leaves.append(tril.clone().requires_grad_())
        mean, var = conditional(*leaves[:4], leaves[4] if gaussian else None,
                                quadratic=quadratic)
        ((mean * w_mean).sum() + (var * w_var).sum()).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)
    # the custom backward against finite differences
    for D in (DOUT, 1):  # D = 1 has its own path
        C = torch.randn(D, M, M, generator=g, dtype=DT)
        C = (C + C.mT).requires_grad_()
        K = Kzx.clone().requires_grad_()
        alpha = torch.randn(M, D, generator=g, dtype=DT, requires_grad=True)
        assert torch.autograd.gradcheck(lambda K, C: _QuadraticConditional.apply(K, C, None)[1],
                                        (K, C))
        assert torch.autograd.gradcheck(_QuadraticConditional.apply, (K, C, alpha))
        assert torch.autograd.gradcheck(_QuadraticConditional.apply, (K[0], C, alpha))


def test_conditional_quadratic_form_is_refused_where_it_does_not_apply():
    g, Kzz, L, Kzx, kxx = _problem()
    loc = torch.randn(DOUT, M, generator=g, dtype=DT)
    with pytest.raises(ValueError, match="float64"):
        conditional(Kzx.float(), L.float(), kxx.float(), loc.float(), quadratic=True)
    with pytest.raises(ValueError, match="one Z"):
        conditional(Kzx, L.expand(2, M, M), kxx, loc, quadratic=True)


def test_conditional_at_inducing_points_recovers_u():
    # x = Z, S = 0: f(Z) = u exactly with zero variance (clamped to tiny, never negative)
    g = torch.Generator().manual_seed(7)
    k = RBF(DIN, variance=1.1, lengthscale=[1.0, 1.3]).to(DT)
    Z = 2.0 * torch.randn(M, DIN, generator=g, dtype=DT)
    with torch.no_grad():
        Kzz = k(Z)
        L = torch.linalg.cholesky(Kzz)
        u = torch.randn(DOUT, M, generator=g, dtype=DT)
        mean, var = conditional(Kzz, L, k(Z, diag=True), u, None, whiten=False)
    torch.testing.assert_close(mean, u.T, rtol=1e-9, atol=1e-9)
    assert (var >= 0).all() and var.max().item() < 1e-9


# ------------------------------------------------------------------ GPLayer.conditional
def _layer_reference(layer, x, loc, tril):
    """Dense conditional for a GPLayer (K_ZZ with its relative jitter), without mean."""
    k = layer.kernel
    with torch.no_grad():
        Z = layer.inducing_points
        Kzz = k(Z)
        Kzz = Kzz + layer.jitter * Kzz.diagonal().mean() * torch.eye(Kzz.shape[-1], dtype=DT)
        Kzx, kxx = k(Z, x), k(x, diag=True)
        Lref = torch.linalg.cholesky(Kzz)
    means, vars_ = [], []
    for d in range(loc.shape[0]):
        m = Lref @ loc[d] if layer.whiten else loc[d]
        S = None
        if tril is not None:
            S = tril[d] @ tril[d].T
            if layer.whiten:
                S = Lref @ S @ Lref.T
        rm, rv = _dense_reference(Kzz, Kzx, kxx, m, S)
        means.append(rm)
        vars_.append(rv)
    return torch.stack(means, -1), torch.stack(vars_, -1)


W_LIN = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=DT)


@pytest.mark.parametrize(
    "mean, dout, expected",
    [
        ("zero", 2, lambda x: torch.zeros_like(x)),
        ("identity", 2, lambda x: x),
        (W_LIN, 3, lambda x: x @ W_LIN),
        (
            lambda x: torch.cat([torch.sin(x), x.sum(-1, keepdim=True)], -1),
            3,
            lambda x: torch.cat([torch.sin(x), x.sum(-1, keepdim=True)], -1),
        ),
    ],
    ids=["zero", "identity", "linear", "callable"],
)
@pytest.mark.parametrize("whiten", [True, False])
def test_gplayer_conditional_adds_mean_function(mean, dout, expected, whiten):
    g = torch.Generator().manual_seed(8)
    Z = 1.5 * torch.randn(M, DIN, generator=g, dtype=DT)
    kernel = RBF(DIN, variance=1.2, lengthscale=[0.8, 1.4])
    layer = GPLayer(
        DIN, dout, inducing_points=Z, kernel=kernel, mean=mean, whiten=whiten, jitter=1e-7
    ).to(DT)
    x = torch.randn(N, DIN, generator=g, dtype=DT)
    loc = torch.randn(dout, M, generator=g, dtype=DT)
    tril = _random_tril(g, dout)
    for t in (None, tril):
        with torch.no_grad():
            out_m, out_v = layer.conditional(x, loc, t)
        ref_m, ref_v = _layer_reference(layer, x, loc, t)
        assert out_m.shape == out_v.shape == (N, dout)
        torch.testing.assert_close(out_m, ref_m + expected(x), rtol=1e-8, atol=1e-9)
        torch.testing.assert_close(out_v, ref_v, rtol=1e-8, atol=1e-9)
    # u = 0 (and no q covariance) gives exactly the mean function
    with torch.no_grad():
        m0, _ = layer.conditional(x, torch.zeros(dout, M, dtype=DT))
    torch.testing.assert_close(m0, expected(x), rtol=0, atol=1e-14)
    # batched x (particles): the mean function is applied per particle
    xb = torch.randn(3, N, DIN, generator=g, dtype=DT)
    with torch.no_grad():
        mb, _ = layer.conditional(xb, loc)
        for s in range(3):
            ms, _ = layer.conditional(xb[s], loc)
            torch.testing.assert_close(mb[s], ms, rtol=1e-12, atol=1e-12)


def test_nan_where_failed_marks_only_the_failed_factors():
    """Inside a CUDA graph a failed factorisation cannot be read back: its factor becomes NaN
    (the CUDA tests replay it); the others are kept as they are."""
    from pyro_dgp.linalg import nan_where_failed

    K = torch.stack([torch.tensor([[2.0, 0.5], [0.5, 1.0]]),
                     torch.tensor([[1.0, 2.0], [2.0, 1.0]])]).double()
    L, info = torch.linalg.cholesky_ex(K)
    out = nan_where_failed(L, info)
    assert torch.equal(out[0], torch.linalg.cholesky(K[0]))
    assert torch.isnan(out[1]).all()


def test_recording_a_graph_leaves_cpu_factorisations_their_retry():
    """Only GPU tensors take the no-read-back path while a graph is recorded: on the CPU a
    matrix that needs jitter still gets the retry, its warning and a finite factor."""
    from pyro_dgp.linalg import NumericalWarning, capturing, cholesky, recording_graph

    # eigenvalues 2 and -5e-4: the default jitter (1e-6) is not enough
    K = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64) - 5e-4 * torch.eye(
        2, dtype=torch.float64)
    with recording_graph():
        assert not capturing(K)
        with pytest.warns(NumericalWarning, match="needed jitter"):
            L = cholesky(K)
    assert torch.isfinite(L).all()
