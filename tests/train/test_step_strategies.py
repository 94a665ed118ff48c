"""The step strategies of ``fit`` (``pyro_dgp.train.steps``), each on its own: the eager
step's loss and gradient, the natural-gradient step's closure, the replayed step's pass-through
and the data-parallel step's all-reduce of a loss, an error or a failure."""

import math

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.infer import AnalyticKL_ELBO
from pyro_dgp.linalg import CholeskyError
from pyro_dgp.train.steps import (
    DataParallelStep,
    EagerStep,
    GraphedStep,
    NaturalGradientStep,
    gradient_step,
)

DT = torch.float64


def _problem():
    X = torch.linspace(-2, 2, 16, dtype=DT).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0])
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    guide(X, y)  # its parameters
    params = [p for p in list(model.parameters()) + list(guide.parameters()) if p.requires_grad]
    return model, guide, (X, y), params


def test_the_eager_step_is_the_objectives_loss_and_gradient_weighted_by_its_share():
    model, guide, args, params = _problem()
    elbo = AnalyticKL_ELBO(max_plate_nesting=1)  # collapsed: no draws, a deterministic loss
    want = elbo.differentiable_loss(model, guide, *args)
    want_grads = torch.autograd.grad(want, params, allow_unused=True)
    loss = EagerStep(elbo, model, guide, weighted=True, share=lambda: 0.25).step(args)
    assert loss == pytest.approx(0.25 * float(want.detach()), rel=1e-12)
    for p, g in zip(params, want_grads, strict=True):
        if g is not None:
            torch.testing.assert_close(p.grad, 0.25 * g, rtol=1e-10, atol=1e-12)


def test_the_eager_step_of_an_elbo_without_differentiable_loss_uses_its_loss_and_grads():
    calls = []

    class PlainLoss:
        def loss_and_grads(self, model, guide, *args):
            calls.append(args)
            return 1.5

    assert EagerStep(PlainLoss(), None, None, weighted=False, share=lambda: 1.0).step(
        ("X", "y")) == 1.5
    assert calls == [("X", "y")]


def test_the_natural_gradient_step_hands_the_objective_on_the_batch_to_natgrad():
    model, guide, args, _ = _problem()
    elbo = AnalyticKL_ELBO(max_plate_nesting=1)

    class Natural:  # records the closure's loss, as NaturalGradient.loss_and_grads sees it
        def loss_and_grads(self, closure):
            self.loss = closure()
            return float(self.loss.detach())

    natural = Natural()
    loss = NaturalGradientStep(natural, elbo, model, guide).step(args)
    assert loss == pytest.approx(float(elbo.differentiable_loss(model, guide, *args).detach()),
                                 rel=1e-12)
    assert gradient_step(elbo, model, guide, natural, None, lambda: 1.0).natural is natural


def test_gradient_step_weighs_a_data_parallel_run_and_a_differentiable_objective():
    elbo = AnalyticKL_ELBO()
    assert gradient_step(elbo, None, None, None, None, lambda: 1.0).weighted
    assert not gradient_step(object(), None, None, None, None, lambda: 1.0).weighted
    assert gradient_step(object(), None, None, None, "parallel", lambda: 1.0).weighted


def test_the_graphed_step_passes_the_replay_through():
    class Graph:  # GraphedSteps' interface: the loss, or None where it cannot be recorded
        replays, last_replayed = 3, True

        def __call__(self, args):
            return None if args == "unrecordable" else 2.0

    graphed = GraphedStep(Graph())
    assert graphed.step("batch") == 2.0 and graphed.step("unrecordable") is None
    assert graphed.replays == 3 and graphed.last_replayed


class Parallel:
    """DataParallel's interface: the all-reduce sums the loss over two processes, an error
    in any process stops all of them (here: re-raised)."""

    def __init__(self):
        self.seeded = []

    def seed_step(self, seed, step):
        self.seeded.append((seed, step))

    def all_reduce(self, params, loss, error):
        if error is not None:
            raise RuntimeError(f"process 0 failed: {error}")
        return 2 * loss


def test_the_data_parallel_step_all_reduces_the_local_loss_and_seeds_each_step():
    parallel = Parallel()
    data_parallel = DataParallelStep(parallel, [], seed=7)
    data_parallel.seed_draws(4)
    assert parallel.seeded == [(7, 4)] and parallel.step == 4
    assert data_parallel.step(lambda: (1.25, None), first=True) == (2.5, None)


def test_the_data_parallel_step_carries_an_error_to_the_all_reduce():
    def local():
        raise ValueError("bad batch")

    with pytest.raises(RuntimeError, match="process 0 failed: bad batch"):
        DataParallelStep(Parallel(), [], seed=0).step(local, first=False)


def test_a_data_parallel_failure_is_raised_at_the_first_step_and_returned_later():
    failure = CholeskyError("not positive definite")
    step = DataParallelStep(Parallel(), [], seed=0)
    loss, got = step.step(lambda: (math.nan, failure), first=False)
    assert math.isnan(loss) and got is failure
    with pytest.raises(CholeskyError):
        step.step(lambda: (math.nan, failure), first=True)
