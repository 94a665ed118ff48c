"""Natural-gradient steps for the Gaussian ``q(u)`` of a guide (Salimbeni, Eleftheriadis and
Hensman 2018).

For a Gaussian block ``q = N(m, S)`` with natural parameters ``theta = (S^-1 m, -S^-1 / 2)``
and expectation parameters ``eta = (m, S + m m^T)``, the natural gradient of a loss in
``theta`` is its ordinary gradient in ``eta``, so a step of size ``gamma`` is

    theta <- theta - gamma dloss/deta.

Where the expected log-likelihood is linear in ``eta`` (one GP layer, Gaussian likelihood,
the whole data) and the KL to a Gaussian prior has ``dKL/deta = theta - theta_prior``,
``gamma = 1`` lands on the optimal ``q`` in one step. In a deep model or on minibatches the
steps are noisy: a small ``gamma``, reached by a warm-up from ``1e-4`` over the first steps,
is the schedule of Salimbeni, Eleftheriadis and Hensman 2018 (:func:`warmup_gamma`; they
used about 0.1). In a deep model the step size also decides where the fit ends: with
``MeanField``'s default start, ``gamma = 0.1`` on the last layer ended well below Adam alone
on a smooth 2-D set, and ``0.02`` level with it, where full ``Coupled`` gained over Adam at
either; on two UCI sets MeanField with natural steps of either size ended a little below
Adam alone (``benchmarks/results/history.md``, "The natural-gradient recipe's step size").
So ``warmup_gamma(0.02)`` is the package's recipe, and natural steps are an option to
compare, not a default. The other parameters (hyperparameters,
inducing inputs) keep their own optimiser, stepped on the same gradient evaluation.

With plain Pyro (``pyro.infer.SVI`` steps every parameter with one optimiser, so the loop is
written out)::

    ngd = NaturalGradient(guide, gamma=warmup_gamma(0.02))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)   # the hyperparameters
    elbo = pyro.infer.TraceMeanField_ELBO()
    for step in range(num_steps):
        optim.zero_grad()
        loss = ngd.loss_and_grads(lambda: elbo.differentiable_loss(model, guide, X, y))
        ngd.step()
        optim.step()

``pyro_dgp.fit(..., natural_gradient=warmup_gamma(0.02))`` runs this loop (a constant
``gamma`` is taken as it is: ``1`` lands on the optimum of a conjugate model at once).

Damped steps. A step is taken only where its new precision ``P' = S^-1 + 2 gamma dloss/deta2``
keeps ``P' - keep (1 - gamma) S^-1`` positive definite (``keep = 1/2``). Where the block is
conjugate, ``P' = (1 - gamma) S^-1 + gamma P*`` with the optimum's precision ``P* > 0``, so
every exact step passes, ``gamma = 1`` included (``keep`` weighs ``1 - gamma = 0``). An inner
layer's block (full ``Coupled``'s one block holds every layer) has its objective sampled
through the layer's draws: a single-draw estimate of ``dloss/deta2`` whose noise grows as
``S^-1/2``, against a precision ``S^-1``. From the near-deterministic start of an inner
``q(u)`` (``S = 1e-5 I``) the step at ``gamma = 0.1`` made the precision indefinite within 5
steps on the step data, and a step that only just stays positive definite raises a variance
many-fold and fails a few steps later. A step that fails
the test is taken again at half its ``gamma``, up to ``max_backtracks`` times; the block keeps
the reduced ``gamma`` and regrows it by ``regrowth`` per step taken, back to the schedule's
(a backtracking line search on the step size, as for the positive-definite constraint of
natural-gradient Gaussian updates in Khan and Lin 2017 and Lin, Schmidt and Khan 2020).
Only a step that still fails then (:class:`NaturalStepError`) stops ``fit`` as a divergence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..guides.protocol import protocol_of

__all__ = ["NaturalGradient", "NaturalStepError", "covariance_tril", "expectation_parameters",
           "moment_parameters", "natural_step", "warmup_gamma"]


class NaturalStepError(ValueError):
    """A natural-gradient step failed: it left a precision that is not positive definite (or
    shrank it too far, :func:`natural_step`), or its gradient was not finite."""


def expectation_parameters(loc: torch.Tensor, scale_tril: torch.Tensor):
    """``(eta1, eta2) = (m, S + m m^T)`` of ``N(loc (..., n), L L^T)``."""
    return loc, scale_tril @ scale_tril.mT + loc.unsqueeze(-1) * loc.unsqueeze(-2)


def moment_parameters(eta1: torch.Tensor, eta2: torch.Tensor):
    """``(m (..., n), chol(S) (..., n, n))`` from the expectation parameters; differentiable."""
    S = eta2 - eta1.unsqueeze(-1) * eta1.unsqueeze(-2)
    return eta1, torch.linalg.cholesky(0.5 * (S + S.mT))


def natural_step(loc, scale_tril, grad_eta1, grad_eta2, gamma: float, name: str = "q(u)",
                 keep: float = 0.5):
    """``(loc, scale_tril)`` after ``theta <- theta - gamma grad_eta`` (module docstring).

    :param loc: ``(..., n)``; :param scale_tril: ``(..., n, n)``, the block's ``chol(S)``;
        :param grad_eta1: ``(..., n)`` and :param grad_eta2: ``(..., n, n)``, the loss's
        gradients in the expectation parameters.
    :param keep: the step must leave ``P' - keep (1 - gamma) S^-1`` positive definite, ``P'``
        the new precision: ``0`` asks only for a positive definite ``P'``; ``1/2`` (default)
        lets no variance grow more than ``2 / (1 - gamma)``-fold, which a step towards a
        positive definite target never does (module docstring).
    :raises NaturalStepError: the step fails that test (it was too long for this block: a
        smaller ``gamma`` is needed), or the gradients or the result are not finite.
    """
    if not 0 <= keep < 1:
        raise ValueError(f"natural_step: keep must lie in [0, 1), got {keep}")
    check_finite_gradients(grad_eta1, grad_eta2, name)
    S_inv = torch.cholesky_inverse(scale_tril)
    g2 = 0.5 * (grad_eta2 + grad_eta2.mT)
    theta1 = (S_inv @ loc.unsqueeze(-1)).squeeze(-1) - gamma * grad_eta1
    precision = S_inv + 2 * gamma * g2  # -2 theta2
    precision = 0.5 * (precision + precision.mT)
    kept = keep * (1 - gamma) * S_inv
    if keep > 0 and bool(torch.linalg.cholesky_ex(precision - kept)[1].any()):
        raise NaturalStepError(
            f"natural gradient: the step of size {gamma:g} shrinks the precision of {name} "
            f"below {keep:g} (1 - gamma) times its value (a variance grows more than "
            f"{1 / (keep * (1 - gamma)):.3g}-fold): use a smaller gamma, or warm up to it "
            "(natgrad.warmup_gamma)")
    new_tril = covariance_tril(precision)
    if new_tril is None:
        raise NaturalStepError(f"natural gradient: the step of size {gamma:g} leaves the "
                               f"precision of {name} not positive definite; use a smaller "
                               "gamma, or warm up to it (natgrad.warmup_gamma)")
    new_loc = (new_tril @ (new_tril.mT @ theta1.unsqueeze(-1))).squeeze(-1)  # S' theta1'
    if not (torch.isfinite(new_loc).all() and torch.isfinite(new_tril).all()):
        raise NaturalStepError(f"natural gradient: the step of size {gamma:g} leaves "
                               f"{name} not finite")
    return new_loc, new_tril


def check_finite_gradients(grad_eta1: torch.Tensor, grad_eta2: torch.Tensor, name: str) -> None:
    """:raises NaturalStepError: the gradients of ``name`` are not finite."""
    if not (torch.isfinite(grad_eta1).all() and torch.isfinite(grad_eta2).all()):
        raise NaturalStepError(f"natural gradient: the gradient of the loss in the "
                               f"expectation parameters of {name} is not finite")


def covariance_tril(precision: torch.Tensor) -> torch.Tensor | None:
    """The lower Cholesky factor ``(..., n, n)`` of ``S = P^-1`` from ``P (..., n, n)``
    itself, without forming ``S``; ``None`` where ``P`` is not positive definite.

    With ``J`` the reversal permutation and ``J P J = R R^T`` (``R`` lower),
    ``S = (J R^-T J)(J R^-T J)^T`` and ``J R^-T J`` is lower triangular with a positive
    diagonal: one factorisation, as well conditioned as ``P``'s.
    """
    flip = (-2, -1)
    R, info = torch.linalg.cholesky_ex(precision.flip(flip))
    if bool(info.any()):
        return None
    eye = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device).expand_as(R)
    R_inv_T = torch.linalg.solve_triangular(R.mT, eye, upper=True)
    return R_inv_T.flip(flip)


def warmup_gamma(gamma: float = 0.02, warmup: int = 5, start: float = 1e-4) -> Callable:
    """A step-size schedule ``step -> gamma``: log-linear from ``start`` at step 0 to ``gamma``
    at step ``warmup``, then ``gamma`` (default: the package's recipe, module docstring)."""
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
        ``q(u)``, all of ``q`` in a one-layer model (full ``Coupled`` has one block, over
        every layer). In a deep model the inner layers' objective is sampled through their
        draws and not conjugate: their steps are noisy and are the ones backtracked.
    :param max_backtracks: how many times a failing step of a block is retried at half its
        ``gamma`` before :meth:`step` raises :class:`NaturalStepError` (module docstring).
    :param regrowth: the factor ``>= 1`` by which a block's backtracked ``gamma`` grows back
        per step taken, up to the schedule's (``1``: it keeps the reduced ``gamma``).
    :param keep: the test of a step (:func:`natural_step`).

    ``backtracks`` counts the halvings so far, ``gamma_scale`` holds each backtracked block's
    ``gamma`` as a fraction of the schedule's; :meth:`state_dict` saves both with the step
    count, for a resumed run.
    """

    def __init__(self, guide, gamma: float | Callable[[int], float] = 0.1,
                 blocks: str | list[str] = "last", max_backtracks: int = 10,
                 regrowth: float = 1.1, keep: float = 0.5):
        q_blocks = protocol_of(guide).natural_gradient_blocks()
        if q_blocks is None:
            raise TypeError(f"natural gradients need a guide whose q(u) is made of Gaussian "
                            f"blocks (MeanField, Coupled with rank=None), got "
                            f"{type(guide).__name__}")
        if not callable(gamma) and not 0 < float(gamma) <= 1:
            raise ValueError(f"natural gradient: gamma must lie in (0, 1], got {gamma}")
        if isinstance(max_backtracks, bool) or not isinstance(max_backtracks, int) \
                or max_backtracks < 0:
            raise ValueError(f"natural gradient: max_backtracks must be an int >= 0, got "
                             f"{max_backtracks!r}")
        if not 1 <= float(regrowth) < math.inf:
            raise ValueError(f"natural gradient: regrowth must be a finite number >= 1, got "
                             f"{regrowth}")
        if not 0 <= float(keep) < 1:
            raise ValueError(f"natural gradient: keep must lie in [0, 1), got {keep}")
        self.guide, self.gamma, self.num_steps = q_blocks, gamma, 0
        self.blocks = blocks
        self.max_backtracks, self.regrowth, self.keep = max_backtracks, float(regrowth), keep
        self.gamma_scale: dict[str, float] = {}
        self.backtracks = 0
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
        """Apply the natural-gradient step of the last :meth:`loss_and_grads`; a block whose
        step fails is stepped at half its ``gamma``, up to ``max_backtracks`` times.

        :raises NaturalStepError: a block's step still fails; no block has moved.
        """
        if self._pending is None:
            raise RuntimeError("NaturalGradient.step() needs loss_and_grads() first")
        gamma = self.gamma_at(self.num_steps)
        with torch.no_grad():
            stepped = {name: self._damped_step(name, block, g1, g2, gamma)
                       for name, (block, g1, g2) in self._pending.items()}
        # written only once every block has stepped, with the scales they stepped at
        self.guide.set_gaussian_blocks({name: q for name, (q, _, _) in stepped.items()})
        for name, (_, scale, halvings) in stepped.items():
            self.backtracks += halvings
            self.gamma_scale[name] = min(1.0, scale * self.regrowth)
            if self.gamma_scale[name] == 1.0:
                del self.gamma_scale[name]
        self._pending = None
        self.num_steps += 1

    def _damped_step(self, name: str, block, grad_eta1, grad_eta2, gamma: float):
        """``(stepped block, scale, halvings)``: :func:`natural_step` of ``block`` at
        ``gamma * scale``, ``scale`` the block's (1 unless backtracked before) halved while
        the step fails."""
        check_finite_gradients(grad_eta1, grad_eta2, f"q({name})")  # no step size helps
        scale = self.gamma_scale.get(name, 1.0)
        for halvings in range(self.max_backtracks + 1):
            try:
                stepped = natural_step(*block, grad_eta1, grad_eta2, gamma * scale,
                                       name=f"q({name})", keep=self.keep)
            except NaturalStepError as err:
                failure = err
                scale *= 0.5
                continue
            return stepped, scale, halvings
        raise NaturalStepError(f"{failure}; it still failed after {self.max_backtracks} "
                               f"halvings of gamma (down to {gamma * scale * 2:g})")

    def state_dict(self) -> dict:
        """The step count and backtracking state (plain numbers), for a checkpoint."""
        return {"num_steps": self.num_steps, "gamma_scale": dict(self.gamma_scale),
                "backtracks": self.backtracks}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s ``state``."""
        self.num_steps = int(state["num_steps"])
        self.gamma_scale = {str(k): float(v) for k, v in state["gamma_scale"].items()}
        self.backtracks = int(state["backtracks"])
