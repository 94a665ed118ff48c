"""Built-in synthetic sets: deterministic given ``seed``, needing no files.

:func:`step`, :func:`compositional_toy`, :func:`two_mode_toy`, :func:`classification_2d`
and :func:`heteroscedastic` are not standardised (their statistics are mean 0 and standard
deviation 1); :data:`SYNTHETIC` maps their names to the functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .splits import Split

__all__ = [
    "SYNTHETIC",
    "TWO_MODE_X",
    "TWO_MODE_Y",
    "classification_2d",
    "compositional_inner",
    "compositional_outer",
    "compositional_toy",
    "heteroscedastic",
    "heteroscedastic_noise_std",
    "step",
    "two_mode_toy",
]


def _synthetic_split(
    X_tr: torch.Tensor,
    y_tr: torch.Tensor,
    X_te: torch.Tensor,
    y_te: torch.Tensor,
    name: str,
    seed: int,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> Split:
    """A :class:`Split` of float64 tensors, not standardised (mean 0, deviation 1)."""
    D = X_tr.shape[-1]

    def t(a: torch.Tensor) -> torch.Tensor:
        return a.to(device=device, dtype=dtype).contiguous()

    return Split(
        X_train=t(X_tr),
        y_train=t(y_tr),
        X_test=t(X_te),
        y_test=t(y_te),
        X_mean=t(torch.zeros(D, dtype=torch.float64)),
        X_std=t(torch.ones(D, dtype=torch.float64)),
        y_mean=0.0,
        y_std=1.0,
        name=name,
        split=int(seed),
    )


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def _uniform(g: torch.Generator, n: int, d: int, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, d, generator=g, dtype=torch.float64)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _step_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0, -1.0, 1.0).to(torch.float64)


def step(
    n_train: int = 100, n_test: int = 200,
    noise: float = 0.05, seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Split:
    """1-D step: ``y = -1`` for ``x < 0``, ``+1`` for ``x >= 0``, plus N(0, noise^2) noise.

    Training inputs are uniform on ``[-1, 1]``; test inputs are an evenly spaced grid on
    ``[-1, 1]`` with independently noisy targets.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = _uniform(g, n_train, 1, -1.0, 1.0)
    y_tr = _step_fn(X_tr[:, 0]) + noise * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = _step_fn(X_te[:, 0]) + noise * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "step", seed, dtype, device)


def compositional_inner(x: torch.Tensor) -> torch.Tensor:
    """Inner (warping) layer of :func:`compositional_toy`: ``f1(x) = x + x^3 / 2``, any shape."""
    return x + 0.5 * x**3


def compositional_outer(h: torch.Tensor) -> torch.Tensor:
    """Outer (periodic) layer of :func:`compositional_toy`: ``f2(h) = sin(2 pi h)``, any shape."""
    return torch.sin(2.0 * math.pi * h)


def compositional_toy(
    n_train: int = 50, n_test: int = 200,
    noise: float = 0.01, seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Split:
    """Two-layer compositional toy on ``[-1, 1]`` (Ustyuzhaninov et al. 2020).

    Section 5 of Ustyuzhaninov et al. (2020) ("Compositional uncertainty", Fig. 5 and
    Table 1) fits 2-layer DGPs with a squared-exponential first layer and a periodic
    second layer to near noise-free observations on ``[-1, 1]`` and reports the marginal
    variances ``Var[f1(0)]`` and ``Var[f2(0)]``. The paper gives the data only as a figure,
    not as numbers or a formula, so this set is a reconstruction with exactly that
    structure: a smooth monotone warp followed by a periodic function,

        ``y = f2(f1(x)) + eps``,  ``f1(x) = x + x^3 / 2``,  ``f2(h) = sin(2 pi h)``,
        ``eps ~ N(0, noise^2)`` (low noise, as the section assumes near noise-free data),

    a chirp that a stationary single-layer GP fits poorly, while the composition
    SE-warp -> periodic explains it, and which several (warp, phase) compositions explain
    about equally well near ``x = 0`` (the compositional uncertainty the section studies).
    Training inputs: ``n_train`` evenly spaced points on ``[-1, 1]`` (so ``x = 0`` is
    included when ``n_train`` is odd); test inputs: an evenly spaced grid of ``n_test``
    points on ``[-1, 1]`` with independent noise. The layers are available as
    :func:`compositional_inner` and :func:`compositional_outer`.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = torch.linspace(-1.0, 1.0, n_train, dtype=torch.float64).unsqueeze(-1)
    y_tr = compositional_outer(compositional_inner(X_tr[:, 0])) + noise * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = compositional_outer(compositional_inner(X_te[:, 0])) + noise * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "compositional_toy", seed, dtype, device)


TWO_MODE_X = (-1.0, -2.0 / 3.0, -1.0 / 3.0, 0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0)
"""Inputs of :func:`two_mode_toy`."""
TWO_MODE_Y = (-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0)
"""Noise-free targets of :func:`two_mode_toy` (``sign(x)``)."""


def two_mode_toy(
    n_test: int = 200,
    seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Split:
    """Seven noise-free points with a two-mode DGP posterior (Havasi et al. 2018).

    The toy of Havasi et al. (2018), also the test of structured semi-implicit guides for
    deep GPs in Molchanova et al. (§4.1): seven noise-free training points (likelihood
    variance set to zero, in practice a very small value), fitted with a 2-layer DGP whose 7
    first-layer inducing inputs sit at the data and whose 2 second-layer inducing inputs are
    fixed at ``+1`` and ``-1``; the posterior has two modes, A and B. The seven values are not
    published, so they are reconstructed here to produce exactly that structure: ``x``
    evenly spaced on ``[-1, 1]`` and ``y = sign(x)``,

        x = (-1, -2/3, -1/3, 0, 1/3, 2/3, 1),   y = (-1, -1, -1, 0, 1, 1, 1).

    Mode A has ``f1(x) ~ sign(x)`` (hidden values near the inducing inputs ``+-1``) and an
    increasing ``f2`` (``u2(-1) ~ -1``, ``u2(+1) ~ +1``); mode B is its mirror image,
    ``f1(x) ~ -sign(x)`` and a decreasing ``f2``. For zero-mean layers with stationary
    kernels the two have exactly equal posterior mass, and a factorised Gaussian guide can
    only sit in one of them.

    The test part is an evenly spaced grid of ``n_test`` points on ``[-1.5, 1.5]`` with
    ``y = sign(x)`` (for plotting; ``seed`` is unused and only recorded).

    Returns:
        :class:`Split` with ``X_train (7, 1)``, ``y_train (7,)``, ``X_test (n_test, 1)``,
        ``y_test (n_test,)``; not standardised.
    """
    X_tr = torch.tensor(TWO_MODE_X, dtype=torch.float64).unsqueeze(-1)
    y_tr = torch.tensor(TWO_MODE_Y, dtype=torch.float64)
    X_te = torch.linspace(-1.5, 1.5, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = torch.sign(X_te[:, 0])
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "two_mode_toy", seed, dtype, device)


def _moons(g: torch.Generator, n: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    n0 = n // 2
    n1 = n - n0
    t0 = math.pi * torch.rand(n0, generator=g, dtype=torch.float64)
    t1 = math.pi * torch.rand(n1, generator=g, dtype=torch.float64)
    upper = torch.stack([torch.cos(t0), torch.sin(t0)], dim=-1)
    lower = torch.stack([1.0 - torch.cos(t1), 0.5 - torch.sin(t1)], dim=-1)
    X = torch.cat([upper, lower]) + noise * _randn(g, n, 2)
    y = torch.cat([torch.zeros(n0, dtype=torch.float64), torch.ones(n1, dtype=torch.float64)])
    perm = torch.randperm(n, generator=g)
    return X[perm], y[perm]


def classification_2d(
    n_train: int = 200, n_test: int = 200,
    noise: float = 0.1, seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Split:
    """Two interleaving half-moons in 2-D, binary labels in ``{0., 1.}``.

    Class 0: ``(cos t, sin t)``; class 1: ``(1 - cos t, 0.5 - sin t)``; ``t ~ U(0, pi)``,
    plus isotropic N(0, noise^2) input noise. Classes are balanced (to within one point)
    and the rows are shuffled.

    Returns:
        :class:`Split` with ``X_train (n_train, 2)``, ``y_train (n_train,)``,
        ``X_test (n_test, 2)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr, y_tr = _moons(g, n_train, noise)
    X_te, y_te = _moons(g, n_test, noise)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "classification_2d", seed, dtype, device)


def heteroscedastic_noise_std(x: torch.Tensor) -> torch.Tensor:
    """Noise standard deviation of :func:`heteroscedastic`: ``0.05 + 0.225 (1 + x)``.

    Rises linearly from 0.05 at ``x = -1`` to 0.5 at ``x = 1``; same shape as ``x``.
    """
    return 0.05 + 0.225 * (1.0 + x)


def heteroscedastic(
    n_train: int = 200, n_test: int = 200,
    seed: int = 0,
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
) -> Split:
    """1-D regression whose noise grows with x: ``y = sin(3 x) + s(x) eps``, ``eps ~ N(0, 1)``.

    ``s(x)`` is :func:`heteroscedastic_noise_std` (0.05 at ``x = -1``, 0.5 at ``x = 1``).
    Training inputs are uniform on ``[-1, 1]``; test inputs an evenly spaced grid on
    ``[-1, 1]`` with independent noise.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = _uniform(g, n_train, 1, -1.0, 1.0)
    x = X_tr[:, 0]
    y_tr = torch.sin(3.0 * x) + heteroscedastic_noise_std(x) * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    x = X_te[:, 0]
    y_te = torch.sin(3.0 * x) + heteroscedastic_noise_std(x) * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "heteroscedastic", seed, dtype, device)


SYNTHETIC: dict[str, Callable[..., Split]] = {
    "step": step,
    "compositional_toy": compositional_toy,
    "two_mode_toy": two_mode_toy,
    "classification_2d": classification_2d,
    "heteroscedastic": heteroscedastic,
}
"""Built-in synthetic sets: name -> function(seed=..., dtype=..., device=...) -> Split."""
