"""The posterior mass of each mode of a two-layer deep GP's first layer, by importance sampling.

NUTS's chains stay in the mode they start in, and stacking weighs what the modes predict, not
their masses (:mod:`.chains`): two modes that predict alike, as the mirror-image modes of the
two-mode toy, get arbitrary stacking weights. The masses come from here instead.

A draw's mode is whether its ``f^1`` rises or falls from the first to the last training input
(:func:`rising`, its first output), as for the toys (:mod:`.toys`), whose modes are the
rising and the falling first layer. The mass of the rising mode,

    P(rising | y) = E_{p(f^1 | y)} [rising(f^1)],

by self-normalised importance sampling with the prior of ``f^1`` at the ``N`` training inputs
as proposal (jitter ``1e-6``) and the last layer's exact GP marginal likelihood
``N(y; m^2(f^1), K_2(f^1, f^1) + s^2 I)`` as weight (the inducing outputs are an augmentation of
the deep GP, :mod:`.posterior`, so they drop out). Its standard error is the delta method's,
``sqrt(sum_i w_i^2 (r_i - P)^2)`` with normalised weights ``w`` and indicators ``r``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..likelihoods import Gaussian
from ..linalg import cholesky
from ..validation import check_inputs, check_positive_int, check_targets

__all__ = ["ModeMasses", "importance_mode_masses", "rising"]

#: proposal draws per batch (their ``(batch, N, N)`` factors bound the memory)
_BATCH = 50_000


def rising(f1: torch.Tensor) -> torch.Tensor:
    """``(S,)`` bool: whether each draw of ``f^1`` ``(S, N, D)`` (at inputs in order, e.g. the
    training inputs sorted) is larger at the last input than at the first, in its first
    output."""
    return f1[..., -1, 0] > f1[..., 0, 0]


@dataclass(frozen=True)
class ModeMasses:
    """The posterior masses of the rising and the falling first layer (module docstring).

    :ivar rising: ``P(rising | y)``; :ivar falling: ``1 - rising``.
    :ivar stderr: the standard error of both (delta method).
    :ivar ess: the importance sampler's effective sample size ``1 / sum w_i^2``.
    :ivar num_draws: proposal draws.
    """

    rising: float
    falling: float
    stderr: float
    ess: float
    num_draws: int

    def as_dict(self) -> dict:
        return asdict(self)


def importance_mode_masses(model, X: torch.Tensor, y: torch.Tensor, num_draws: int = 200_000,
                           seed: int = 0) -> ModeMasses:
    """The masses of the rising and the falling ``f^1`` of a two-layer deep GP with a
    Gaussian likelihood at its fixed hyperparameters (module docstring).

    :param X: ``(N, D)`` training inputs, in the order :func:`rising` reads;
        :param y: ``(N,)`` targets.
    :param num_draws: proposal draws, in batches of 50,000 (at least one batch).
    :param seed: of the draws (the global random state is not used).
    :raises ValueError: not two layers, or not a Gaussian likelihood.
    """
    if len(model.layers) != 2 or not isinstance(model.likelihood, Gaussian):
        raise ValueError("importance_mode_masses takes a two-layer deep GP with a Gaussian "
                         f"likelihood, got {len(model.layers)} layers and "
                         f"{type(model.likelihood).__name__}")
    check_inputs(X, model.input_dim)
    check_targets(y, X.shape[0])
    draws = check_positive_int(num_draws, "num_draws")
    first, second = model.layers
    N, D1 = X.shape[0], first.output_dim
    eye = torch.eye(N, dtype=X.dtype, device=X.device)
    g = torch.Generator(device=X.device).manual_seed(seed)
    log_w, up = [], []
    with torch.no_grad():
        s2 = model.likelihood.variance.detach()
        L1 = cholesky(first.kernel(X) + 1e-6 * eye, jitter=0.0, name=first.name)
        for _ in range(max(1, draws // _BATCH)):
            e = torch.randn(_BATCH, D1, N, generator=g, dtype=X.dtype, device=X.device)
            f1 = first.mean_function(X) + (e @ L1.mT).mT  # (batch, N, D1)
            L2 = cholesky(second.kernel(f1) + s2 * eye, jitter=0.0, name=second.name)
            r = (y - second.mean_function(f1)[..., 0]).unsqueeze(-1)  # (batch, N, 1)
            white = torch.linalg.solve_triangular(L2, r, upper=False)[..., 0]
            log_w.append(-0.5 * white.square().sum(-1)
                         - L2.diagonal(dim1=-2, dim2=-1).log().sum(-1))
            up.append(rising(f1).to(X.dtype))
    w = torch.softmax(torch.cat(log_w), 0)
    up = torch.cat(up)
    p = (w * up).sum()
    return ModeMasses(rising=float(p), falling=float(1 - p),
                      stderr=float((w * (up - p)).square().sum().sqrt()),
                      ess=float(1 / w.square().sum()), num_draws=len(w))
