"""Cholesky factors with jitter escalation, and small linear-algebra helpers."""

from __future__ import annotations

import contextlib
import warnings

import torch

__all__ = [
    "MAX_JITTER", "CholeskyError", "NumericalWarning", "capturing", "cholesky", "default_jitter",
    "nan_where_failed", "recording_graph",
]


class CholeskyError(RuntimeError):
    """A covariance matrix stayed non-positive-definite after every jitter retry."""


class NumericalWarning(UserWarning):
    """A numerical fix-up (more jitter) was needed."""


_RECORDING = [False]


@contextlib.contextmanager
def recording_graph():
    """Within: the computation is recorded as a CUDA graph, or run to check that it can be
    (:mod:`pyro_dgp.train.cuda_graph`): code that would read a value back to the host
    (to retry a failed factorisation, say) takes a path that does not."""
    previous, _RECORDING[0] = _RECORDING[0], True
    try:
        yield
    finally:
        _RECORDING[0] = previous


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t`` is on a GPU inside :func:`recording_graph` or while a CUDA graph is being
    recorded on its device's current stream: then no value of it can be read back."""
    return t.is_cuda and (_RECORDING[0] or torch.cuda.is_current_stream_capturing())


def nan_where_failed(L: torch.Tensor, info: torch.Tensor) -> torch.Tensor:
    """``L (..., M, M)`` with the factors whose ``info (...)`` of ``cholesky_ex`` is nonzero
    (failed) set to NaN: the failure reaches the loss without a read-back to the host."""
    return torch.where((info == 0)[..., None, None], L, torch.nan)


def default_jitter(dtype: torch.dtype) -> float:
    """Diagonal jitter relative to the mean diagonal: tighter in float64 than in float32."""
    return 1e-6 if dtype == torch.float64 else 1e-5


#: the largest relative jitter an escalation tries: beyond it the "fix" changes the model
#: (at 1e-1 a kernel matrix gets a tenth of its mean variance as extra nugget) rather than
#: rounding, and a fit would go on silently degraded
MAX_JITTER = 1e-2


def cholesky(
    K: torch.Tensor,
    jitter: float | None = None,
    max_tries: int = 5,
    name: str = "covariance",
    max_jitter: float = MAX_JITTER,
) -> torch.Tensor:
    """Lower Cholesky factor of ``K + jitter * mean(diag K) * I``.

    :param K: ``(..., M, M)`` symmetric positive semi-definite matrices.
    :param jitter: relative diagonal jitter; ``None`` picks :func:`default_jitter`.
    :param max_tries: each failure multiplies the jitter by 10; after ``max_tries`` retries, or
        once the jitter would exceed ``max_jitter`` (relative, default :data:`MAX_JITTER`), a
        :class:`CholeskyError` naming ``name`` (the layer) is raised.
    :returns: ``(..., M, M)`` lower-triangular ``L`` with ``L L^T = K + jitter mean(diag K) I``
        (the jitter of the last try).
    """
    if jitter is None:
        jitter = default_jitter(K.dtype)
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    scale = K.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(torch.finfo(K.dtype).tiny)
    scale = scale[..., None, None]
    current, tried = jitter, jitter
    if capturing(K):
        # recorded into a CUDA graph: the host cannot see a failure to retry it; a failed
        # factor becomes NaN, the loss too, and the step is run again eagerly (infer/cuda_graph)
        return nan_where_failed(*torch.linalg.cholesky_ex(K + (jitter * scale) * eye))
    for attempt in range(max_tries + 1):
        L, info = torch.linalg.cholesky_ex(K + (current * scale) * eye)
        if not bool(info.any()):
            if attempt > 0:
                warnings.warn(
                    f"{name}: Cholesky needed jitter {current:.1e} (relative to the mean "
                    f"diagonal) instead of {jitter:.1e}",
                    NumericalWarning,
                    stacklevel=2,
                )
            return L
        if attempt == 0 and not bool(torch.isfinite(K).all()):
            # checked only on failure (NaN/inf make the factorisation fail): no extra pass and
            # host sync over K on the hot path
            raise CholeskyError(f"{name}: the covariance matrix contains NaN or inf")
        tried = current
        current = max(current, 1e-12) * 10
        if current > max_jitter * (1 + 1e-9):
            break
    raise CholeskyError(
        f"{name}: Cholesky failed even with relative jitter {tried:.1e}; the kernel matrix "
        "is not positive definite (check for duplicate inducing points, tiny lengthscales, "
        "inputs far from the origin or on a large scale (standardise them), or a float32 "
        "model that needs float64)"
    )
