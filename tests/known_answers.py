"""Closed forms shared by several test files."""

import torch


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
