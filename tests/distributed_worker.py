"""One process of the data-parallel tests (``tests/train/test_distributed.py``), started with
torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)::

    python tests/distributed_worker.py SCENARIO OUT

``main``: 20 steps of a one-layer model (no Monte Carlo draws in its objective) with
``MeanField`` and with ``Coupled``, of a two-layer amortized model with the AR2P rule (no
draws either), and of a two-layer model with ``MeanField`` (checkpointed); ``kill``: the
two-layer run, whose process 1 kills itself at step 12;
``hang``: the same with process 1 alive but silent from step 12 (a timeout of 3 s);
``resume``: the two-layer run resumed with ``seed=None`` from the checkpoint ``kill`` left
(the checkpoint's seed is taken); ``raise``: the two-layer run whose process 1 raises an
error in step 12's objective; ``corrupt``: the two-layer run resumed from a file that is no
checkpoint (``OUT/corrupt.pt``), which process 0 fails to read; ``othermodel``: the two-layer
run with ``Coupled`` resumed from ``main``'s checkpoint of ``MeanField``. Each process writes
what it saw to ``OUT/<scenario>_<rank>.pt``. The problems and the recording optimiser are
shared with the test, which computes the one-process references.

In ``raise`` and ``corrupt`` the process that fails stays alive after its error until the
other has reported its own (at most ``LINGER`` seconds), as a process whose script handles
the error, or whose launcher has not yet ended it, would: the other must learn of the
failure from the failing process itself, not from its closed connection.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)

import pyro  # noqa: E402

import pyro_dgp as dgp  # noqa: E402
from pyro_dgp.train.distributed import PeerFailedError  # noqa: E402

N, BATCH, STEPS, KILL_AT = 64, 32, 20, 12
HANG_TIMEOUT = 3.0  # seconds
LINGER = 10.0  # seconds a failed process stays alive for the other's report
#: the timeout of the runs in which a process fails: longer than LINGER, so that a process
#: that learns of the failure only from the timeout or the closed connection comes too late
FAULT_TIMEOUT = 30.0
RAISED = "the rows of this process could not be read"


class FailingELBO(pyro.infer.Trace_ELBO):
    """Trace_ELBO whose ``differentiable_loss`` raises ``OSError(RAISED)`` at its call
    ``fail_at`` (from 0), in the process that sets it: one process's part of a step fails."""

    fail_at: int | None = None

    def __init__(self):
        super().__init__()
        self.calls = 0

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at + 1:
            raise OSError(RAISED)
        return super().differentiable_loss(model, guide, *args, **kwargs)


class Recording:
    """An optimiser that keeps each step's gradients, and stops its own process with SIGKILL
    before step ``kill_at`` (a process that dies)."""

    kill_at: int | None = None
    hang_at: int | None = None
    last: Recording | None = None

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads: list[list[torch.Tensor | None]] = []
        Recording.last = self

    def step(self, closure=None):
        if self.kill_at is not None and len(self.grads) == self.kill_at:
            with open(os.environ["KILL_TIME_FILE"], "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_at is not None and len(self.grads) == self.hang_at:
            time.sleep(600)  # alive, but answers no collective: the test ends it
        self.grads.append([None if p.grad is None else p.grad.detach().clone()
                           for group in self.param_groups for p in group["params"]])
        return super().step(closure)


class RecordingSGD(Recording, torch.optim.SGD):
    """SGD: an update linear in the gradient, so two gradients equal to rounding (1e-14) give
    parameters equal to rounding. (Adam divides by ``sqrt(v) + eps``: a component whose
    gradient is near zero has its rounding amplified up to ``lr / eps`` = 1e6 times, in one
    process as much as in two: a sum over the batch in another order moves it by 1e-8.)"""


class RecordingAdam(Recording, torch.optim.Adam):
    """Adam, unfused, as every process builds it."""


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(N, 2, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * torch.randn(N, generator=g,
                                                                   dtype=torch.float64)
    return X, y


def problem(layers: int, family: str):
    """``(model, guide, X, y)``: built alike in every process and in the test. ``Amortized``:
    two amortized layers (per-point inducing points, an encoder per layer) and the AR2P rule
    of Meng and Zhang 2024, whose objective has no draws."""
    X, y = data()
    if family == "Amortized":
        gen = torch.Generator().manual_seed(0)
        layers = [dgp.AmortizedGPLayer(a, b, inducing_offsets=torch.randn(
            3, a, generator=gen, dtype=X.dtype), kernel=dgp.kernels.RBF(
            a, variance=torch.tensor(1.3, dtype=X.dtype),
            lengthscale=torch.tensor(0.8, dtype=X.dtype))) for a, b in ((2, 2), (2, 1))]
        model = dgp.DeepGP(layers, dgp.likelihoods.Gaussian(torch.tensor(0.2, dtype=X.dtype)))
        return model, dgp.guides.Amortized(model, rule="AR2P", num_paths=4), X, y
    model = dgp.DeepGP.regression(X, y, num_layers=layers, num_inducing=8, seed=0)
    guide = getattr(dgp.guides, family)(model)
    return model, guide, X, y


def run(layers: int, family: str, **kwargs) -> dict:
    """``fit`` of the problem; what a process saw: losses, gradients, final parameters. The
    problems without draws step by SGD (``lr`` 1e-3), the two-layer one by Adam (``lr``
    1e-2)."""
    pyro.clear_param_store()
    model, guide, X, y = problem(layers, family)
    exact = layers == 1 or family == "Amortized"
    optimizer, lr = (RecordingSGD, 1e-3) if exact else (RecordingAdam, 1e-2)
    if family == "Amortized":
        kwargs["objective"] = dgp.AmortizedELBO()
    kwargs.setdefault("seed", 0)
    result = dgp.fit(model, guide, X, y, num_steps=STEPS, batch_size=BATCH, lr=lr,
                     optimizer=optimizer, progress=False, final_elbo_particles=2, **kwargs)
    return {"losses": result.losses, "grads": Recording.last.grads,
            "model": model.state_dict(), "guide": guide.state_dict(),
            "final_elbo": result.final_elbo, "resumed_from": result.resumed_from}


def main(scenario: str, out: str) -> None:
    rank = int(os.environ["RANK"])
    checkpoint = os.path.join(out, "deep.pt" if scenario == "main" else "killed.pt")
    seen = {}
    if scenario == "main":
        seen["MeanField"] = run(1, "MeanField", distributed=True)
        seen["Coupled"] = run(1, "Coupled", distributed=True)
        seen["Amortized"] = run(2, "Amortized", distributed=True)
        seen["deep"] = run(2, "MeanField", distributed=True, checkpoint=checkpoint,
                           checkpoint_every=5)
    elif scenario in ("kill", "hang"):
        if rank == 1:
            setattr(Recording, f"{scenario}_at", KILL_AT)
        if scenario == "hang":
            checkpoint = os.path.join(out, "hung.pt")
        dgp.train.distributed.init(timeout=30 if scenario == "kill" else HANG_TIMEOUT)
        try:
            run(2, "MeanField", distributed=True, checkpoint=checkpoint, checkpoint_every=5)
        except PeerFailedError as err:
            seen = {"error": str(err), "time": time.time()}
            torch.save(seen, os.path.join(out, f"{scenario}_{rank}.pt"))
            raise
    elif scenario == "resume":
        seen["deep"] = run(2, "MeanField", distributed=True, checkpoint=checkpoint,
                           checkpoint_every=5, resume=True, seed=None)
    elif scenario in ("raise", "corrupt"):
        fails = rank == (1 if scenario == "raise" else 0)
        dgp.train.distributed.init(timeout=FAULT_TIMEOUT)
        FailingELBO.fail_at = KILL_AT if scenario == "raise" and fails else None
        try:
            if scenario == "raise":
                run(2, "MeanField", distributed=True, checkpoint=os.path.join(out, "raised.pt"),
                    checkpoint_every=5, objective=FailingELBO())
            else:
                run(2, "MeanField", distributed=True, checkpoint=os.path.join(out, "corrupt.pt"),
                    resume=True)
        except Exception as err:
            _report(err, scenario, rank, out, linger=fails)
            raise
    elif scenario == "othermodel":
        try:
            run(2, "Coupled", distributed=True, checkpoint=os.path.join(out, "deep.pt"),
                resume=True)
        except Exception as err:
            _report(err, scenario, rank, out, linger=False)
            raise
    torch.save(seen, os.path.join(out, f"{scenario}_{rank}.pt"))


def _report(err: Exception, scenario: str, rank: int, out: str, linger: bool) -> None:
    """Write what process ``rank`` saw of a failure; ``linger``: stay alive until the other
    process has written its own (at most ``LINGER`` s), and record whether it had."""
    seen = {"type": type(err).__name__, "error": str(err),
            "notes": list(getattr(err, "__notes__", [])), "ranks": getattr(err, "ranks", None),
            "time": time.time()}
    other = os.path.join(out, f"{scenario}_{1 - rank}.pt")
    deadline = time.time() + LINGER
    while linger and not os.path.exists(other) and time.time() < deadline:
        time.sleep(0.05)
    seen["other_reported_meanwhile"] = os.path.exists(other)
    torch.save(seen, os.path.join(out, f"{scenario}_{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
