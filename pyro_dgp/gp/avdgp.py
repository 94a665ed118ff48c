"""The deep GP architecture of Meng and Zhang 2024 (AVDGP): a stack of
:class:`~pyro_dgp.gp.amortized.AmortizedGPLayer` with per-point inducing inputs, for the
amortized guides (:class:`~pyro_dgp.guides.Amortized`).

Their regression setup: three layers of widths ``D -> 16 -> 4 -> 1``, ``M = 8, 4, 4``
inducing points, isotropic Matern-5/2 kernels and zero mean functions in every layer (Meng
and Zhang 2024, App. C.1). The affine maps of the inducing inputs start at ``W = I`` and
offsets ``b`` drawn from a standard normal, so the initial inducing inputs are noisy copies
of each input. Kernel variances, lengthscales and the noise variance start at
``ln 2 = softplus(0)``, as :meth:`~pyro_dgp.DeepGP.regression` does.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from ..likelihoods import Likelihood
from ..validation import check_positive_finite, check_positive_int
from .amortized import AmortizedGPLayer
from .architectures import (
    KERNELS,
    LN2,
    check_regression_arguments,
    default_dtype,
    make_likelihood,
    pca_mean,
)
from .deep_gp import DeepGP

__all__ = ["PAPER_HIDDEN_DIMS", "PAPER_NUM_INDUCING", "avdgp_regression"]

#: the hidden widths and inducing points per layer of Meng and Zhang 2024 (regression)
PAPER_HIDDEN_DIMS = (16, 4)
PAPER_NUM_INDUCING = (8, 4, 4)


def _per_layer(num_inducing, num_layers: int) -> list[int]:
    """``M`` per layer from one int or one per layer, each checked."""
    if isinstance(num_inducing, numbers.Integral):
        num_inducing = [num_inducing] * num_layers
    Ms = [check_positive_int(m, "avdgp_regression: num_inducing") for m in num_inducing]
    if len(Ms) != num_layers:
        raise ValueError(f"avdgp_regression: num_inducing must be one int or one per layer "
                         f"({num_layers}), got {len(Ms)}")
    return Ms


_INNER_MEANS = ("zero", "pca")


def _layer_means(X: torch.Tensor, dims: list[int], inner_mean: str) -> list:
    """The mean of each layer: ``"zero"`` for all (the paper's), or with ``"pca"`` DSVI's
    fixed linear map ``x W`` for the inner layers (identity, PCA projection of the layer's
    inputs ``X W_1 ... W_{l-1}`` or identity padded: :func:`pca_mean`) and zero for the last.

    :param X: ``(N, D)``; :param dims: ``[D, *hidden, 1]``."""
    if inner_mean not in _INNER_MEANS:
        raise ValueError(f"avdgp_regression: inner_mean must be one of {_INNER_MEANS}, got "
                         f"{inner_mean!r}")
    means, h = [], X
    for d_out in dims[1:-1]:
        W = pca_mean(h, d_out) if inner_mean == "pca" else None
        means.append("zero" if W is None else W)
        h = h if W is None else h @ W
    return [*means, "zero"]


def _offsets(M: int, d_in: int, offset_scale: float | None, lengthscale: float,
             gen: torch.Generator, dtype) -> torch.Tensor:
    """``(M, d_in)`` offsets ``b_m``: standard normal (``offset_scale=None``), else normal
    with standard deviation ``offset_scale * lengthscale / sqrt(d_in)`` per coordinate, so
    that ``|b_m|`` is about ``offset_scale`` lengthscales whatever ``d_in``."""
    b = torch.randn(M, d_in, generator=gen, dtype=dtype)
    return b if offset_scale is None else b * (offset_scale * lengthscale / d_in ** 0.5)


def avdgp_regression(
    X: torch.Tensor, y: torch.Tensor, *,
    hidden_dims: Sequence[int] = PAPER_HIDDEN_DIMS,
    num_inducing: int | Sequence[int] = PAPER_NUM_INDUCING,
    kernel: str = "matern52",
    ard: bool = False,
    likelihood: str | Likelihood = "gaussian",
    noise_variance: float = LN2, kernel_variance: float = LN2, lengthscale: float = LN2,
    kl_weight: str = "1/N",
    inner_mean: str = "zero",
    offset_scale: float | None = None,
    jitter: float | None = None, seed: int = 0, name: str | None = None,
) -> DeepGP:
    """A :class:`~pyro_dgp.DeepGP` of amortized layers (module docstring), on ``X``'s device
    and dtype.

    :param X: ``(N, D)`` training inputs (standardised); :param y: ``(N,)`` targets.
    :param hidden_dims: the inner layers' widths (``()``: one layer).
    :param num_inducing: ``M`` of every layer, or one per layer.
    :param kernel: a name of :data:`~pyro_dgp.gp.architectures.KERNELS`; ``ard``: a lengthscale
        per input dimension.
    :param likelihood: ``"gaussian"``, ``"studentt"``, ``"probit"`` or an instance.
    :param kl_weight: ``"1/N"`` (default; Meng and Zhang 2024, App. A) or ``"one"`` (the
        model's ELBO, whose optimum fits the targets as noise); see :class:`AmortizedGPLayer`.
    :param inner_mean: ``"zero"`` (default, the paper's, App. C.1) or ``"pca"`` (DSVI's fixed
        linear means, Salimbeni and Deisenroth 2017).
    :param offset_scale: ``None`` (default: the paper's standard normal offsets ``b``, about
        ``sqrt(D_in)`` from each input) or offsets of standard deviation ``offset_scale *
        lengthscale / sqrt(D_in)``. Not the default, nor ``"pca"``: each fits a split where
        the paper's offsets fit nothing, but ``offset_scale=1`` overfits small sets
        (``benchmarks/results/history.md``, "Why AR2PP fails on some splits").
    :param seed: seed of the offsets ``b`` (the global random state is left alone).
    """
    if isinstance(hidden_dims, numbers.Integral):
        raise TypeError(f"avdgp_regression: hidden_dims must be a sequence of widths, such as "
                        f"(16, 4) or () for one layer, got {hidden_dims!r}")
    hidden = [check_positive_int(h, "avdgp_regression: hidden_dims") for h in hidden_dims]
    dims = [X.shape[-1], *hidden, 1]
    Ms = _per_layer(num_inducing, len(dims) - 1)
    # M is per point (inducing inputs A(x_n)): the global builders' M <= N bound does not apply
    checked = check_regression_arguments(X, y, len(dims) - 1, hidden[0] if hidden else None,
                                         None, kernel, likelihood, noise_variance, seed,
                                         flags={"ard": ard})
    if offset_scale is not None:
        offset_scale = check_positive_finite(offset_scale, "avdgp_regression: offset_scale")
    gen = torch.Generator().manual_seed(checked["seed"])
    means = _layer_means(X, dims, inner_mean)
    with default_dtype(X.dtype):
        lik = make_likelihood(likelihood, checked["noise_variance"])
        layers = [
            AmortizedGPLayer(
                d_in, d_out,
                inducing_offsets=_offsets(M, d_in, offset_scale, lengthscale, gen, X.dtype),
                kernel=KERNELS[kernel](d_in, variance=kernel_variance, lengthscale=lengthscale,
                                       ard=checked["ard"]),
                mean=means[i], jitter=jitter, name=f"layer{i + 1}", kl_weight=kl_weight)
            for i, (d_in, d_out, M) in enumerate(zip(dims[:-1], dims[1:], Ms, strict=True))
        ]
    return DeepGP(layers, lik, num_data=X.shape[-2], name=name).to(device=X.device,
                                                                   dtype=X.dtype)
