"""The two-mode toy of Havasi et al. 2018 as a deep GP, how to tell its modes apart, and a
smooth symmetric toy (:func:`symmetric_model`).

The seven noise-free points of :func:`~pyro_dgp.datasets.two_mode_toy` (``y = sign(x)`` at
``x = -1, -2/3, ..., 1``) are fitted by a 2-layer DGP with one-dimensional layers: the first
layer's 7 inducing inputs sit at the data, the second's 2 at ``-1`` and ``+1`` (Havasi et al.
2018; Molchanova et al. 2019, §4.1), all fixed. Both layers have zero mean functions and
stationary (RBF) kernels, and the likelihood's variance is small and fixed (the data are
noise-free; a variance of exactly 0 has no density).

Why two modes. With zero means, the prior of ``u^1`` is symmetric under ``u^1 -> -u^1``, and
that of ``u^2`` under the swap of its two values (its inducing inputs ``-1, +1`` are mirror
images and the kernel is stationary); ``f^2(-h)`` given the swapped ``u^2`` equals ``f^2(h)``
given ``u^2``. So ``(u^1, u^2) -> (-u^1, swap u^2)`` maps ``q*(U)`` onto itself (in whitened
coordinates too: ``L^-1 P L`` is orthogonal for the swap ``P``). The data need a first layer
that separates the negative from the positive inputs: mode A has ``f^1(x) ~ sign(x)`` and an
increasing ``f^2`` (``f^2(-1) = -1``, ``f^2(+1) = +1``), mode B is its mirror image,
``f^1(x) ~ -sign(x)`` with a decreasing ``f^2``. Between them ``f^1`` would pass through 0,
where no second layer fits ``y = +-1``: the two modes have equal mass and are separated.

Deciding the mode of a draw: the sign of ``f^1(x*)`` at ``x* = 1`` (the last training input,
where ``|f^1| ~ 1`` in both modes), with a dead zone ``|f^1(x*)| < threshold`` counted in
neither (:func:`mode_masses`). Under the posterior target of :mod:`.posterior` the level of
``f^1`` is free (the last layer is a stationary GP on its values), and a draw's mode is whether
``f^1`` rises or falls over the data (:func:`~pyro_dgp.gold.modes.rising`).

The symmetry does not need the data: any two-layer deep GP of a zero-mean first layer, a
zero-mean second layer of a stationary kernel and inducing inputs symmetric about 0 has a
posterior invariant under ``f^1 -> -f^1`` with the second layer reflected (:mod:`.symmetry`).
:func:`symmetric_model` is another such model, on smooth data, whose modes a first layer can
leave at a smaller cost than the step's.
"""

from __future__ import annotations

import torch

from .. import datasets, kernels
from ..gp import DeepGP, GPLayer
from ..likelihoods import Gaussian
from ..linalg import cholesky
from ..validation import check_positive_finite, check_positive_int

__all__ = ["TWO_MODE_INPUT", "mode_masses", "symmetric_model", "two_mode_model",
           "two_mode_posterior_predictive"]

#: the input ``x*`` at which a draw's mode is read: the sign of ``f^1(x*)``
TWO_MODE_INPUT = 1.0


def two_mode_model(noise: float = 1e-2, lengthscales: tuple[float, float] = (0.5, 1.0),
                   dtype: torch.dtype = torch.float64, device=None):
    """The module docstring's deep GP and its data.

    :param noise: the likelihood's fixed variance (default ``1e-2``, against targets of
        ``+-1``).
    :param lengthscales: the RBF lengthscales of the two layers (variance 1 each): ``0.5``
        lets ``f^1`` turn between inputs ``1/3`` apart; ``1`` makes ``f^2`` smooth between
        its inducing inputs ``+-1``.
    :returns: ``(model, X (7, 1), y (7,))``.
    """
    noise = check_positive_finite(noise, "two_mode_model: noise")
    data = datasets.two_mode_toy(dtype=dtype, device=device)
    X, y = data.X_train, data.y_train
    first = GPLayer(1, 1, inducing_points=X.clone(), kernel=_rbf(X, lengthscales[0]),
                    train_inducing=False)
    second = GPLayer(1, 1, inducing_points=X.new_tensor([[-1.0], [1.0]]),
                     kernel=_rbf(X, lengthscales[1]), train_inducing=False)
    model = DeepGP([first, second], Gaussian(X.new_tensor(noise)), num_data=X.shape[0])
    return model.to(dtype=dtype, device=X.device), X, y


def symmetric_model(num_points: int = 9, noise: float = 1e-2,
                    lengthscales: tuple[float, float] = (1.0, 1.0),
                    dtype: torch.dtype = torch.float64, device=None):
    """A two-layer deep GP whose posterior is invariant under ``f^1 -> -f^1`` with the second
    layer reflected (the module docstring; :mod:`.symmetry`), so that its rising and falling
    first layers each have mass exactly one half.

    Data: ``y = sin(2 x)`` at ``num_points`` inputs evenly spaced on ``[-1, 1]``, noise-free.
    Model: one-dimensional layers with zero means and RBF kernels (variance 1, ``lengthscales``),
    the first layer's inducing inputs at the data, the second's 5 at ``-2, -1, 0, 1, 2``
    (symmetric about 0; ``f^1`` ranges over about ``[-2, 2]``), all fixed; the likelihood's
    variance ``noise``. ``f^2(f^1(x))`` must tell the inputs apart, so ``f^1`` is one-to-one
    on the data, rising or falling; between the two a pair of inputs with equal ``f^1`` costs
    about ``(y_i - y_j)^2 / (4 noise)`` nats, less than for the step's ``+-1``.

    :returns: ``(model, X (num_points, 1), y (num_points,))``.
    """
    noise = check_positive_finite(noise, "symmetric_model: noise")
    n = check_positive_int(num_points, "symmetric_model: num_points")
    X = torch.linspace(-1, 1, n, dtype=dtype, device=device).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0])
    first = GPLayer(1, 1, inducing_points=X.clone(), kernel=_rbf(X, lengthscales[0]),
                    train_inducing=False)
    second = GPLayer(1, 1, inducing_points=torch.linspace(-2, 2, 5, dtype=dtype,
                                                          device=X.device).unsqueeze(-1),
                     kernel=_rbf(X, lengthscales[1]), train_inducing=False)
    model = DeepGP([first, second], Gaussian(X.new_tensor(noise)), num_data=n)
    return model.to(dtype=dtype, device=X.device), X, y


def _rbf(like: torch.Tensor, lengthscale: float):
    return kernels.RBF(1, lengthscale=like.new_tensor(lengthscale), variance=like.new_tensor(1.0))


def mode_masses(values: torch.Tensor, threshold: float = 0.5) -> tuple[float, float]:
    """``(mass of mode B, mass of mode A)``: the fractions of the draws ``values`` of
    ``f^1(x*)`` (any shape) below ``-threshold`` and above ``+threshold``."""
    threshold = check_positive_finite(threshold, "mode_masses: threshold")
    values = values.reshape(-1)
    return (float((values < -threshold).double().mean()),
            float((values > threshold).double().mean()))


def two_mode_posterior_predictive(model, X: torch.Tensor, y: torch.Tensor, x_star: torch.Tensor,
                                  num_draws: int = 200_000, seed: int = 0
                                  ) -> tuple[float, float, float]:
    """The posterior predictive of ``f^2(x*)`` of the two-mode toy's deep GP (or any 2-layer
    one of zero means and one-dimensional layers), by self-normalised importance sampling,
    independent of NUTS: ``(mean, variance, standard error of the variance)``.

    The posterior is that of :mod:`pyro_dgp.gold.posterior` (the inducing outputs are an
    augmentation of the deep GP, so they drop out): proposal, the prior of ``f^1`` at the
    ``N`` inputs (jitter ``1e-6``); weight, the last layer's exact GP marginal likelihood
    ``N(y; 0, K_2(f^1, f^1) + s^2 I)``; per draw, ``f^1(x*)`` from its GP conditional given
    ``f^1(X)`` and the last layer's exact GP predictive at it. The standard error is the
    delta method's, ``sqrt(sum_i w_i^2 (v_i - v)^2)`` with normalised weights ``w``.

    :param x_star: ``(1, 1)``, one test input.
    :param num_draws: proposal draws, in batches of 50,000 (at least one batch).
    :param seed: of the draws (the global random state is not used).
    """
    first, second = model.layers
    s2 = model.likelihood.variance.detach()
    N, batch = X.shape[0], 50_000
    eye = torch.eye(N, dtype=X.dtype, device=X.device)
    g = torch.Generator(device=X.device).manual_seed(seed)
    with torch.no_grad():
        L1 = cholesky(first.kernel(X) + 1e-6 * eye, jitter=0.0, name=first.name)
        k1s = first.kernel(X, x_star)[:, 0]
        a1 = torch.cholesky_solve(k1s[:, None], L1)[:, 0]
        v1s = first.kernel(x_star, diag=True)[0] - k1s @ a1
        log_w, loc, var = [], [], []
        for _ in range(max(1, num_draws // batch)):
            f1 = torch.randn(batch, N, generator=g, dtype=X.dtype, device=X.device) @ L1.mT
            L2 = cholesky(second.kernel(f1[..., None]) + s2 * eye, jitter=0.0,
                          name=second.name)
            alpha = torch.cholesky_solve(y.expand(batch, N)[..., None], L2)[..., 0]
            log_w.append(-0.5 * (y * alpha).sum(-1) - L2.diagonal(dim1=-2, dim2=-1).log().sum(-1))
            h = f1 @ a1 + v1s.sqrt() * torch.randn(batch, generator=g, dtype=X.dtype,
                                                   device=X.device)
            k2 = second.kernel(f1[..., None], h[:, None, None])[..., 0]  # (batch, N)
            loc.append((k2 * alpha).sum(-1))
            var.append(second.kernel(h[:, None, None], diag=True)[..., 0]
                       - (k2 * torch.cholesky_solve(k2[..., None], L2)[..., 0]).sum(-1))
    w = torch.softmax(torch.cat(log_w), 0)
    loc, var = torch.cat(loc), torch.cat(var)
    mean = (w * loc).sum()
    spread = var + (loc - mean).square()
    total = (w * spread).sum()
    return float(mean), float(total), float((w * (spread - total)).square().sum().sqrt())
