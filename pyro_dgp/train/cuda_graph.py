"""A training step's forward and backward pass recorded once as a CUDA graph, then replayed.

On a GPU a deep GP's step is a few hundred small kernels (kernel matrices of ``M = 128``
points, triangular solves, a Cholesky factor per layer), each finished in microseconds: the
step's time is the time Python, Pyro's tracing and PyTorch's dispatcher take to launch them,
not the GPU's. A CUDA graph (:class:`torch.cuda.CUDAGraph`) records the kernels of one
evaluation of the objective and its gradient and replays all of them with one launch, so that
the step costs what the GPU needs.

What is recorded: ``loss = loss_fn(*inputs)`` and ``loss.backward()`` (model, guide,
objective and their gradients). What is not: the copy of each step's minibatch into the
graph's input buffers, the optimiser's step (so that learning-rate schedules and the repair
after a divergence stay as they are) and the finiteness check of the loss.

A replay repeats the recorded kernels on the same memory, so the step must be the same
computation every time:

- the inputs keep their shapes (a step whose minibatch has another shape runs eagerly);
- nothing in ``loss_fn`` reads a value back to the host (Pyro's validation off, no ``.item()``;
  :func:`pyro_dgp.linalg.cholesky` returns a NaN factor for a failed factorisation while a
  graph is being recorded, instead of retrying with more jitter: the loss is then NaN and the
  caller runs that step again eagerly, where the retry happens);
- random draws come from torch's default CUDA generator, which each replay advances by what
  the recorded kernels drew, as the eager step would;
- Python state that ``loss_fn`` reads (a schedule, a counter) is frozen at its value while
  recording.

Recording can fail (an operation that reads back to the host, say); :class:`GraphedLoss`
then raises :class:`GraphCaptureError` with the reason, and :func:`~pyro_dgp.fit` warns and
trains eagerly.

Outside :func:`~pyro_dgp.fit` (``pyro.infer.SVI`` reads each loss back, so a plain Pyro loop
cannot be recorded as it is), a loop of one's own::

    elbo = pyro_dgp.infer.AnalyticKL_ELBO()            # or make_objective("auto", guide)
    params = [*model.parameters(), *guide.parameters()]
    opt = torch.optim.Adam(params, lr=0.01)
    with side_stream(X.device):                        # the eager first step and the replays
        elbo.differentiable_loss(model, guide, Xb, yb).backward()   # sets lazy state up
        opt.step()
        with pyro.validation_enabled(False):
            step = GraphedLoss(lambda X, y: elbo.differentiable_loss(model, guide, X, y),
                               params, (Xb, yb))
        for Xb, yb in batches:                         # all of the recorded shape
            loss = step(Xb, yb)                        # gradients in p.grad; no zero_grad
            opt.step()
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Sequence

import pyro
import torch

from ..linalg import recording_graph

__all__ = ["GraphCaptureError", "GraphedLoss", "GraphedSteps", "check_graph_options", "side_stream"]


class GraphCaptureError(RuntimeError):
    """Recording the step as a CUDA graph failed."""


class GraphedLoss:
    """``loss_fn(*inputs)`` and its gradients with respect to ``params``, recorded as one CUDA
    graph on construction and replayed on each call.

    :param loss_fn: ``(*inputs) -> loss``, a scalar tensor on a CUDA device.
    :param params: the tensors whose ``.grad`` the backward pass fills; their ``.grad`` become
        the graph's own buffers, overwritten (not accumulated into) by each replay, so the
        caller must not set them to ``None`` (``optimizer.zero_grad()``) between replays.
    :param example_inputs: tensors of the shapes, dtypes and device of every later call's
        inputs (the buffers the graph reads are copies of them).

    The recording stream is the current one where that is not the device's default stream
    (:func:`side_stream`: steps before it ran there too), else a new stream.
    """

    def __init__(self, loss_fn: Callable[..., torch.Tensor], params: Sequence[torch.Tensor],
                 example_inputs: Sequence[torch.Tensor]):
        self.loss_fn, self.params = loss_fn, list(params)
        self.inputs = [x.detach().clone() for x in example_inputs]
        device = self.inputs[0].device
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs inputs on a CUDA device, not {device}")
        self.graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(device)
        if stream == torch.cuda.default_stream(device):  # a graph is not recorded there
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
        try:
            # One evaluation on the recording stream first: libraries' handles and workspaces
            # for that stream are made outside the recording, and an operation that reads a
            # value back to the host (which a graph cannot hold) is named here, by torch's
            # synchronisation check, before any recording starts. The random stream is
            # restored after it: the draws of training do not move on.
            with (torch.random.fork_rng(devices=[device]), torch.cuda.stream(stream),
                  recording_graph(), _sync_is_error()):
                loss_fn(*self.inputs).backward()
        except RuntimeError as err:
            self._clear_grads()
            raise GraphCaptureError(
                f"the step cannot be recorded as a CUDA graph: {_first_line(err)}") from err
        self._clear_grads()  # the recorded backward pass allocates them in the graph's pool
        try:
            with recording_graph(), torch.cuda.graph(self.graph, stream=stream):
                loss = loss_fn(*self.inputs)
                loss.backward()
        except RuntimeError as err:
            self._clear_grads()
            _end_generator_capture(device, stream)
            raise GraphCaptureError(
                f"recording the step as a CUDA graph failed: {_first_line(err)}") from err
        torch.cuda.current_stream(device).wait_stream(stream)  # a no-op on the same stream
        self.loss = loss.detach()

    def _clear_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def fits(self, *inputs: torch.Tensor) -> bool:
        """Whether ``inputs`` have the recorded shapes, dtypes and device."""
        return len(inputs) == len(self.inputs) and all(
            x.shape == s.shape and x.dtype == s.dtype and x.device == s.device
            for x, s in zip(inputs, self.inputs, strict=True))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Replay on ``inputs``: the loss, a 0-dim tensor (read it after the replay's kernels,
        e.g. ``float(loss)``), and the gradients in ``p.grad``."""
        for buffer, x in zip(self.inputs, inputs, strict=True):
            buffer.copy_(x)
        self.graph.replay()
        return self.loss

    def eager(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The same evaluation without the graph (into the same ``.grad`` buffers)."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
        loss = self.loss_fn(*inputs)
        loss.backward()
        return loss.detach()


class GraphedSteps:
    """:func:`~pyro_dgp.fit`'s evaluations of the objective and its gradient after its first
    step: recorded at the first call (:class:`GraphedLoss`), replayed at the others.

    A step whose replay gives a loss that is not finite (a Cholesky factor that failed inside
    the graph, where it cannot be retried with more jitter, is NaN) is run again eagerly,
    where the retry happens; its :class:`~pyro_dgp.linalg.CholeskyError`, if it fails there
    too, reaches the caller.

    :param loss_fn: ``(*minibatch) -> loss``; :param params: the tensors trained.
    """

    def __init__(self, loss_fn: Callable[..., torch.Tensor], params: Sequence[torch.Tensor]):
        self.loss_fn, self.params = loss_fn, list(params)
        self.graphed: GraphedLoss | None = None
        self.replays = 0  # the steps whose loss and gradient came from a replay
        self.last_replayed = False  # whether the latest call's did

    def __call__(self, args: Sequence[torch.Tensor]) -> float | None:
        """The step's loss, its gradient in ``p.grad``; ``None`` where the step cannot be
        recorded (warned: the caller trains eagerly from then on)."""
        self.last_replayed = False
        with pyro.validation_enabled(False):
            if self.graphed is None:
                try:
                    self.graphed = GraphedLoss(self.loss_fn, self.params, args)
                except GraphCaptureError as err:
                    # stacklevel: the user's call of fit (through GraphedStep.step)
                    warnings.warn(f"{err}; training goes on without it", UserWarning,
                                  stacklevel=8)
                    return None
            device = self.params[0].device
            if self.graphed.fits(*args):
                state = _rng_state(device)
                loss = float(self.graphed(*args))
                if math.isfinite(loss):
                    self.replays += 1
                    self.last_replayed = True
                    return loss
                # the eager rerun takes the draws the replay took, as the eager step would
                _set_rng_state(state, device)
            return float(self.graphed.eager(*args))


def _rng_state(device: torch.device) -> torch.Tensor:
    """The state of ``device``'s default generator (read on the host: no device sync)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    """Set ``device``'s default generator to ``state`` (from :func:`_rng_state`)."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def check_graph_options(device: torch.device, natural_gradient, distributed: bool) -> None:
    """``fit(cuda_graph=True)``'s other arguments: a CUDA device, no step outside the
    objective's forward and backward pass."""
    if natural_gradient is not None or distributed:
        what = "natural_gradient" if natural_gradient is not None else "distributed=True"
        raise ValueError(f"cuda_graph=True does not combine with {what}: its step runs "
                         "outside the objective's forward and backward pass")
    if device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the data on a CUDA device; it is on {device}")


@contextlib.contextmanager
def side_stream(device: torch.device):
    """Run the block on a new stream of ``device``, after the work queued before it and before
    the work queued after it. Training that will be recorded runs all its steps there: a
    parameter's gradient accumulator belongs to the stream of the step that made it, and one
    kept alive from a step on another stream (by a cached tensor of a transform, say) would
    make the recorded backward pass wait across streams, which a recording cannot hold."""
    current = torch.cuda.current_stream(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            yield stream
    finally:
        current.wait_stream(stream)


@contextlib.contextmanager
def _sync_is_error():
    """Within: an operation that makes the host wait for the GPU raises (torch's check)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # torch's note that the check is a prototype, each time
        warnings.filterwarnings("ignore", message="Synchronization debug mode")
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _end_generator_capture(device: torch.device, stream: torch.cuda.Stream) -> None:
    """After a recording that failed part way, the default CUDA generator still counts its
    draws as the graph's (torch closes that only at a successful end): a recording of one
    draw that ends normally closes it, and the generator's state is as before the failure."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
            torch.empty(1, device=device).normal_()
    except RuntimeError:
        pass
    torch.cuda.synchronize(device)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
