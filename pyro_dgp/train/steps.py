"""The step strategies of :func:`~pyro_dgp.fit`: how one step computes its loss and the
gradients of the objective, each a small class with one ``step()``, composed by
:class:`~pyro_dgp.train.trainer.Trainer`.

- :class:`EagerStep`: the objective and its gradient by one backward pass, for this process's
  part of the batch, weighted ``B_r / B`` in a data-parallel run so that the processes' KL
  terms add up to once.
- :class:`NaturalGradientStep`: the same loss, with the gradients of the Gaussian blocks of
  ``q(u)`` taken in natural parameters (:mod:`pyro_dgp.infer.natgrad`); the natural update
  itself follows the finite-loss check, before the optimiser's.
- :class:`GraphedStep`: the step replayed from a recorded CUDA graph
  (:mod:`pyro_dgp.train.cuda_graph`); ``None`` where it cannot be recorded.
- :class:`DataParallelStep`: this process's part of a step (one of the above), then the
  all-reduce of the gradients and losses over the processes (:mod:`pyro_dgp.train.distributed`),
  which also carries any process's error to every other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..infer.natgrad import NaturalGradient
from .cuda_graph import GraphedSteps

__all__ = ["DataParallelStep", "EagerStep", "GraphedStep", "NaturalGradientStep",
           "gradient_step"]

#: one step's loss and, where it failed, why (a Cholesky failure after the first step)
Outcome = tuple[float, Exception | None]


class EagerStep:
    """Loss and gradients by one backward pass.

    :param weighted: backpropagate ``share() * differentiable_loss`` (the objective's own
        ``loss_and_grads`` otherwise, for a Pyro ELBO without ``differentiable_loss``).
    :param share: this process's weight ``B_r / B`` of the global batch (1 in one process).
    """

    def __init__(self, elbo, model, guide, weighted: bool, share: Callable[[], float]):
        self.elbo, self.model, self.guide = elbo, model, guide
        self.weighted, self.share = weighted, share

    def step(self, args: Sequence[torch.Tensor]) -> float:
        """The loss at the batch ``args``, gradients accumulated into the parameters."""
        if self.weighted:
            share = self.share()
            loss = self.elbo.differentiable_loss(self.model, self.guide, *args)
            if share != 1:  # one process: the weight 1 would add a product to the graph
                loss = share * loss
            loss.backward()
            return float(loss.detach())
        return float(self.elbo.loss_and_grads(self.model, self.guide, *args))


class NaturalGradientStep:
    """The loss, with natural gradients for the Gaussian blocks of ``q(u)`` and Euclidean
    ones for every other parameter (:meth:`NaturalGradient.loss_and_grads`)."""

    def __init__(self, natural: NaturalGradient, elbo, model, guide):
        self.natural, self.elbo, self.model, self.guide = natural, elbo, model, guide

    def step(self, args: Sequence[torch.Tensor]) -> float:
        return self.natural.loss_and_grads(
            lambda: self.elbo.differentiable_loss(self.model, self.guide, *args))


class GraphedStep:
    """The loss and gradient replayed from a CUDA graph recorded on the first replayable
    step (:class:`~pyro_dgp.train.cuda_graph.GraphedSteps`)."""

    def __init__(self, graph: GraphedSteps):
        self.graph = graph

    @classmethod
    def of(cls, elbo, model, guide, params: Sequence[torch.Tensor]) -> GraphedStep:
        return cls(GraphedSteps(lambda *a: elbo.differentiable_loss(model, guide, *a), params))

    def step(self, args: Sequence[torch.Tensor]) -> float | None:
        """The loss at ``args``; ``None`` where the step cannot be recorded (warned)."""
        return self.graph(args)

    @property
    def replays(self) -> int:
        """The steps whose loss and gradient came from a replay."""
        return self.graph.replays

    @property
    def last_replayed(self) -> bool:
        """Whether the latest step's did."""
        return self.graph.last_replayed


class DataParallelStep:
    """This process's part of a step, then the all-reduce over the processes: an error in
    this process's part goes to the all-reduce, which every process reaches, so all of them
    stop there, told which process failed and why."""

    def __init__(self, parallel, params: Sequence[torch.Tensor], seed: int):
        self.parallel, self.params, self.seed = parallel, params, seed

    def seed_draws(self, step: int) -> None:
        """Seed this process's draws at ``step`` (:meth:`DataParallel.seed_step`)."""
        self.parallel.step = step
        self.parallel.seed_step(self.seed, step)

    def step(self, local: Callable[[], Outcome], first: bool) -> Outcome:
        """The global loss of the step whose local part ``local`` runs; ``first``: the run's
        first step, where a failure is the starting parameters' own (raised, not a
        divergence)."""
        error = None
        try:
            loss, failure = local()
        except Exception as err:  # noqa: BLE001 (reported to every process)
            loss, failure, error = math.nan, None, err
        loss = self.parallel.all_reduce(self.params, loss, error)
        if failure is not None and first:
            raise failure
        return loss, failure


def gradient_step(elbo, model, guide, natural: NaturalGradient | None, parallel,
                  share: Callable[[], float]) -> EagerStep | NaturalGradientStep:
    """The strategy of a step's loss and gradients: natural where ``natural`` is given, else
    eager, weighted where the run is data-parallel or the objective has a
    ``differentiable_loss``."""
    if natural is not None:
        return NaturalGradientStep(natural, elbo, model, guide)
    weighted = parallel is not None or hasattr(elbo, "differentiable_loss")
    return EagerStep(elbo, model, guide, weighted, share)
