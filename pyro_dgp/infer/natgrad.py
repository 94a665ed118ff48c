"""Natural-gradient steps for the Gaussian ``q(u)`` of a guide (Salimbeni, Eleftheriadis and
Hensman 2018).

For a Gaussian block ``q = N(m, S)`` with natural parameters ``theta = (S^-1 m, -S^-1 / 2)``
and expectation parameters ``eta = (m, S + m m^T)``, the natural gradient of a loss in
``theta`` is its ordinary gradient in ``eta``, so a step of size ``gamma`` is

    theta <- theta - gamma dloss/deta.

Where the expected log-likelihood is linear in ``eta`` (one GP layer, Gaussian likelihood,
the whole data) and the KL to a Gaussian prior has ``dKL/deta = theta - theta_prior``,
``gamma = 1`` lands on the optimal ``q`` in one step. In a deep model or on minibatches the
steps are noisy: a small ``gamma`` (about 0.1), reached by a warm-up from ``1e-4`` over the
first steps, is the schedule of Salimbeni, Eleftheriadis and Hensman 2018
(:func:`warmup_gamma`). The other parameters (hyperparameters, inducing inputs) keep their
own optimiser, stepped on the same gradient evaluation.

With plain Pyro (``pyro.infer.SVI`` steps every parameter with one optimiser, so the loop is
written out)::

    ngd = NaturalGradient(guide, gamma=warmup_gamma(0.1))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)   # the hyperparameters
    elbo = pyro.infer.TraceMeanField_ELBO()
    for step in range(num_steps):
        optim.zero_grad()
        loss = ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
        ngd.step()
        optim.step()

``pyro_dgp.fit(..., natural_gradient=warmup_gamma(0.1))`` runs this loop (a constant
``gamma`` is taken as it is: ``1`` lands on the optimum of a conjugate model at once); a step
that fails (:class:`NaturalStepError`) stops it as a divergence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..guides.blocks import GaussianBlocks

__all__ = ["NaturalGradient", "NaturalStepError", "expectation_parameters", "moment_parameters",
           "natural_step", "warmup_gamma"]


class NaturalStepError(ValueError):
    """A natural-gradient step left a precision that is not positive definite."""


def expectation_parameters(loc: torch.Tensor, scale_tril: torch.Tensor):
    """``(eta1, eta2) = (m, S + m m^T)`` of ``N(loc (..., n), L L^T)``."""
    return loc, scale_tril @ scale_tril.mT + loc.unsqueeze(-1) * loc.unsqueeze(-2)


def moment_parameters(eta1: torch.Tensor, eta2: torch.Tensor):
    """``(m (..., n), chol(S) (..., n, n))`` from the expectation parameters; differentiable."""
    S = eta2 - eta1.unsqueeze(-1) * eta1.unsqueeze(-2)
    return eta1, torch.linalg.cholesky(0.5 * (S + S.mT))


def natural_step(loc, scale_tril, grad_eta1, grad_eta2, gamma: float, name: str = "q(u)"):
    """``(loc, scale_tril)`` after ``theta <- theta - gamma grad_eta`` (module docstring).

    :raises NaturalStepError: the new precision ``S^-1 + 2 gamma grad_eta2`` is not positive
        definite (the step was too long for this block): a smaller ``gamma`` is needed.
    """
    eye = torch.eye(loc.shape[-1], dtype=loc.dtype, device=loc.device)
    S_inv = torch.cholesky_inverse(scale_tril)
    g2 = 0.5 * (grad_eta2 + grad_eta2.mT)
    theta1 = (S_inv @ loc.unsqueeze(-1)).squeeze(-1) - gamma * grad_eta1
    precision = S_inv + 2 * gamma * g2  # -2 theta2
    L_p, info = torch.linalg.cholesky_ex(0.5 * (precision + precision.mT))
    if bool(info.any()):
        raise NaturalStepError(f"natural gradient: the step of size {gamma:g} leaves the "
                               f"precision of {name} not positive definite; use a smaller "
                               "gamma, or warm up to it (natgrad.warmup_gamma)")
    new_loc = torch.cholesky_solve(theta1.unsqueeze(-1), L_p).squeeze(-1)
    # S = P^-1 = L_p^-T L_p^-1; its lower Cholesky factor
    L_inv = torch.linalg.solve_triangular(L_p, eye.expand_as(L_p), upper=False)
    return new_loc, torch.linalg.cholesky(L_inv.mT @ L_inv)


def warmup_gamma(gamma: float = 0.1, warmup: int = 5, start: float = 1e-4) -> Callable:
    """A step-size schedule ``step -> gamma``: log-linear from ``start`` at step 0 to ``gamma``
    at step ``warmup``, then ``gamma``."""
    if not 0 < start <= gamma <= 1:
        raise ValueError(f"warmup_gamma needs 0 < start <= gamma <= 1, got {start}, {gamma}")

    def schedule(step: int) -> float:
        if step >= warmup:
            return gamma
        return math.exp(math.log(start) + (math.log(gamma) - math.log(start)) * step / warmup)

    return schedule


class NaturalGradient:
    """Natural-gradient steps for every Gaussian block of ``guide``'s ``q(u)``
    (:class:`~pyro_dgp.guides.MeanField`, full-rank :class:`~pyro_dgp.guides.Coupled`).

    :param gamma: the step size, or a schedule ``step -> gamma`` (:func:`warmup_gamma`);
        ``0 < gamma <= 1``.

    :param blocks: the names of the blocks to step (the others stay with the optimiser of
        the rest), ``"all"``, or ``"last"`` (default): the block of the last layer's
        ``q(u)``, all of ``q`` in a one-layer model. In a deep model the inner layers'
        objective is sampled through their draws and not conjugate; on the step data their
        natural-gradient steps at ``gamma = 0.1`` left a precision that was not positive
        definite (``tests/test_natgrad.py``), where the last layer's are stable.
    """

    def __init__(self, guide, gamma: float | Callable[[int], float] = 0.1,
                 blocks: str | list[str] = "last"):
        if not isinstance(guide, GaussianBlocks):
            raise TypeError(f"natural gradients need a guide whose q(u) is made of Gaussian "
                            f"blocks (MeanField, Coupled with rank=None), got "
                            f"{type(guide).__name__}")
        if not callable(gamma) and not 0 < float(gamma) <= 1:
            raise ValueError(f"natural gradient: gamma must lie in (0, 1], got {gamma}")
        self.guide, self.gamma, self.num_steps = guide, gamma, 0
        self.blocks = blocks
        self._pending: dict | None = None

    def block_names(self) -> list[str]:
        """The blocks stepped (``blocks`` resolved against the guide)."""
        if self.blocks == "all":
            return list(self.guide.gaussian_blocks())
        if self.blocks == "last":
            return [self.guide.last_block()]
        names = [self.blocks] if isinstance(self.blocks, str) else list(self.blocks)
        unknown = set(names) - set(self.guide.gaussian_blocks())
        if unknown:
            raise ValueError(f"natural gradient: no blocks {sorted(unknown)} in "
                             f"{type(self.guide).__name__}; it has "
                             f"{sorted(self.guide.gaussian_blocks())}")
        return names

    def gamma_at(self, step: int) -> float:
        gamma = float(self.gamma(step) if callable(self.gamma) else self.gamma)
        if not 0 < gamma <= 1:
            raise ValueError(f"natural gradient: gamma at step {step} is {gamma}, not in (0, 1]")
        return gamma

    def loss_and_grads(self, loss_fn: Callable[[], torch.Tensor]) -> float:
        """Evaluate ``loss_fn()`` (a differentiable loss, e.g. an ELBO's
        ``differentiable_loss``) with ``q(u)`` read from its expectation parameters, and
        back-propagate: the gradients of the other parameters are left in their ``.grad``
        for their optimiser, those of ``q(u)`` kept for :meth:`step`."""
        every = self.guide.gaussian_blocks()
        blocks = {name: every[name] for name in self.block_names()}
        etas = {name: tuple(t.detach().requires_grad_() for t in expectation_parameters(*b))
                for name, b in blocks.items()}
        with self.guide.substituted({n: moment_parameters(*e) for n, e in etas.items()}):
            loss = loss_fn()
        loss.backward()
        self._pending = {name: (blocks[name], etas[name][0].grad, etas[name][1].grad)
                         for name in blocks}
        return float(loss.detach())

    def step(self) -> None:
        """Apply the natural-gradient step of the last :meth:`loss_and_grads`."""
        if self._pending is None:
            raise RuntimeError("NaturalGradient.step() needs loss_and_grads() first")
        gamma = self.gamma_at(self.num_steps)
        with torch.no_grad():
            new = {name: natural_step(*block, g1, g2, gamma, name=f"q({name})")
                   for name, (block, g1, g2) in self._pending.items()}
            self.guide.set_gaussian_blocks(new)
        self._pending = None
        self.num_steps += 1
