"""Data-parallel training on ``torch.distributed``: one process per rank, launched by
``torchrun`` (one node or several), ``gloo`` on CPU and ``nccl`` on CUDA.

The variational objective is a sum over data points plus global terms (the KL of ``q(u)``,
the priors of hyperparameters)::

    L = G + (N / B) sum_{i in batch} l_i.

Each step draws one global batch of ``B`` rows (the same on every process: the batch
stream is seeded alike), and process ``r`` takes its contiguous part of ``B_r`` rows. Its
model scales its rows by ``N / B_r`` (the data plate's full size is ``N``), so the process
evaluates ``L_r = G + (N / B_r) sum_{i in part r} l_i`` and back-propagates
``(B_r / B) L_r``. Summed over the processes::

    sum_r (B_r / B) L_r = G sum_r B_r / B + (N / B) sum_i l_i = L,

the global terms counted once (``sum_r B_r = B``) and the data term as one process would
weigh it. The gradients are then summed over the processes (an all-reduce), so every
process holds the gradient of ``L`` and takes the same optimiser step from the same
parameters (broadcast from process 0 at the start): the parameters stay identical.

The gradients are all-reduced explicitly rather than through ``DistributedDataParallel``:
DDP wraps one ``nn.Module`` whose ``forward`` produces the loss, hooks that call, and expects
every parameter to exist before it is wrapped; here the loss is an ELBO that runs two modules
(the guide runs the model itself), a guide builds its parameters lazily on its first call,
and Pyro's objectives and parameter store sit outside any one module. An all-reduce of the
parameters' ``.grad`` after ``backward`` needs none of that, is exact, and costs one
collective per step (the gradients of all parameters and the loss in one flat buffer per
dtype).

Monte Carlo draws differ between processes: process ``r`` draws at step ``t`` from a seed
of ``(seed, t, r)`` (:meth:`DataParallel.seed_step`), so a run is reproducible, a resumed run
draws what the uninterrupted one drew without any process's random state in the checkpoint,
and the processes' draws are independent. The estimate of ``L`` is unbiased as one
process's is; it equals one process's exactly where the objective has no draws (a one-layer
model with collapsed ``q(u)``, the deterministic amortized rules).

A process whose part of a step raises still takes part in the step's all-reduce, with its
failure flag set (one number per process in the float64 buffer summed anyway), so every
process learns of it in that step; the processes then exchange the errors and all stop, the
others with :class:`PeerFailedError` naming the failed process and its error
(:meth:`DataParallel.all_reduce`). Resuming, process 0's failure to read the checkpoint is
agreed on the same way (:meth:`DataParallel.share_checkpoint`). A process that dies outright
is noticed by the backend: at once where its connection closes, else at the timeout.

Objectives must be sums over data points plus global terms with a ``differentiable_loss``
(the ELBOs, the local alpha objective, :class:`~pyro_dgp.AmortizedELBO`); the Renyi bound,
a log-mean-exp over draws of a sum over points, is not, and is refused.
"""

from __future__ import annotations

import datetime
import io
import os
from collections.abc import Callable, Iterable

import pyro
import torch
import torch.distributed as torch_dist
from pyro.infer import RenyiELBO

from ..rng import MAX_SEED, step_seed
from .agreement import RESUME, Agreement, PeerFailedError

__all__ = ["DataParallel", "PeerFailedError", "backend_for", "check_objective", "for_fit", "init",
           "shutdown"]

#: seconds a collective waits for the other processes before it fails
DEFAULT_TIMEOUT = 300.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def backend_for(device) -> str:
    """``"nccl"`` for a CUDA device, ``"gloo"`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


#: the timeout (seconds) of the process group that :func:`init` created
_group_timeout = DEFAULT_TIMEOUT


def init(device="cpu", timeout: float | None = None, init_method: str | None = None,
         rank: int | None = None, world_size: int | None = None) -> DataParallel:
    """Join the default process group (create it, if none exists) and return this process's
    :class:`DataParallel`.

    Without ``init_method`` the group is read from the environment that ``torchrun`` sets
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``); with it
    (``"tcp://host:port"``, ``"file:///shared/path"``) ``rank`` and ``world_size`` are
    given. The backend is ``nccl`` for a CUDA ``device`` (each process then uses the GPU
    ``LOCAL_RANK``) and ``gloo`` otherwise; ``timeout`` (seconds, default 300) bounds every
    collective of the group it creates, so a process whose peer died or hangs stops with
    :class:`PeerFailedError` (``fit(..., distributed=True)`` calls ``init()``: call it first
    for another timeout).
    """
    global _group_timeout
    if not torch_dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    device = torch.device(device)
    if not torch_dist.is_initialized():
        if init_method is None:
            missing = [name for name in _ENV if name not in os.environ]
            if missing:
                raise RuntimeError(
                    f"distributed training needs the process group's environment, but "
                    f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
                    "launch with torchrun (torchrun --nproc-per-node 2 script.py), or pass "
                    "init_method with rank and world_size")
        elif rank is None or world_size is None:
            raise ValueError("init_method needs rank and world_size")
        if device.type == "cuda":  # NCCL works on the current device
            torch.cuda.set_device(device if device.index is not None
                                  else int(os.environ.get("LOCAL_RANK", 0)))
        kwargs = {} if init_method is None else {"init_method": init_method, "rank": rank,
                                                  "world_size": world_size}
        _group_timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        torch_dist.init_process_group(backend_for(device),
                                      timeout=datetime.timedelta(seconds=_group_timeout),
                                      **kwargs)
    elif torch_dist.get_backend() == "nccl" and device.type != "cuda":
        raise ValueError(f"the process group uses nccl, which reduces CUDA tensors only, but "
                         f"the data are on {device}")
    return DataParallel(_group_timeout)


_NOT_A_SUM = ("distributed=True needs an objective that is a sum over data points plus global "
              "terms (the ELBOs, objective='alpha', AmortizedELBO); {name} is a log-mean-exp "
              "over draws of such a sum, which the processes' parts do not add up to")


def for_fit(objective, natural_gradient, device) -> DataParallel:
    """:func:`init` for :func:`~pyro_dgp.fit`, after the checks that its run can be split:
    an objective that is a sum over points (named, or an instance with
    ``differentiable_loss``), and no natural-gradient steps (their gradients are not summed
    over the processes)."""
    if natural_gradient is not None:
        raise ValueError("distributed=True does not take natural_gradient yet: the natural "
                         "step's gradients are not summed over the processes; train with "
                         "the optimiser alone")
    if objective == "renyi":
        raise ValueError(_NOT_A_SUM.format(name="the Renyi bound"))
    if not isinstance(objective, str):
        check_objective(objective)
    return init(device)


def check_objective(elbo) -> None:
    """Refuse an objective whose processes' parts do not add up (:data:`_NOT_A_SUM`)."""
    if isinstance(elbo, RenyiELBO):
        raise ValueError(_NOT_A_SUM.format(name=type(elbo).__name__))
    if not hasattr(elbo, "differentiable_loss"):
        raise ValueError(f"distributed=True needs an objective with differentiable_loss, "
                         f"got {type(elbo).__name__}")


def shutdown() -> None:
    """Leave the default process group (nothing if none)."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()



class DataParallel(Agreement):
    """This process's part in a data-parallel run over the default process group.

    ``rank``, ``world_size``; ``writer``: whether this process writes checkpoints, progress
    and results (rank 0 only)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        if not torch_dist.is_initialized():
            raise RuntimeError("no process group: call pyro_dgp.train.distributed.init() first")
        # the device of the collectives' buffers: NCCL reduces CUDA tensors only
        device = (torch.device("cuda", torch.cuda.current_device())
                  if torch_dist.get_backend() == "nccl" else torch.device("cpu"))
        super().__init__(torch_dist.get_rank(), torch_dist.get_world_size(), device, timeout)

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, world_size={self.world_size})"

    # ---------------------------------------------------------------- the batch
    def shard(self, batch_size: int) -> tuple[int, int]:
        """``[lo, hi)``: this process's contiguous part of a global batch of ``batch_size``
        rows (sizes differ by at most one)."""
        if batch_size < self.world_size:
            raise ValueError(f"batch_size {batch_size} is smaller than the number of processes "
                             f"{self.world_size}: each process needs at least one row per step")
        return (self.rank * batch_size // self.world_size,
                (self.rank + 1) * batch_size // self.world_size)

    def seed_step(self, seed: int, step: int) -> None:
        """Seed the random streams of this process's draws at ``step`` (torch's, with
        Python's and NumPy's, through Pyro) with :func:`step_seed`."""
        pyro.set_rng_seed(step_seed(seed, step, self.rank))

    def common_seed(self, seed: int | None) -> int:
        """``seed``, or where it is ``None`` process 0's draw from its global stream: the
        same on every process."""
        if seed is None:
            seed = int(torch.randint(MAX_SEED + 1, ()).item())
        value = torch.tensor([seed], dtype=torch.int64, device=self.device)
        with self._collective("agreeing on the seed"):
            torch_dist.broadcast(value, 0)
        return int(value.item())

    # ---------------------------------------------------------------- parameters
    def check_same_structure(self, params: list[torch.Tensor]) -> None:
        """Every process has the same number of parameters with the same sizes (built alike),
        else a ``ValueError`` saying which process differs."""
        sizes = torch.tensor([float(p.numel()) for p in params], dtype=torch.float64)
        mine = torch.tensor([float(len(params)), float(sizes.sum()),
                             float((sizes * torch.arange(1, len(params) + 1)).sum())],
                            dtype=torch.float64, device=self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        with self._collective("comparing the parameters' sizes"):
            torch_dist.all_gather(gathered, mine)
        for rank, other in enumerate(gathered):
            if not torch.equal(other, gathered[0]):
                raise ValueError(
                    f"process {rank} has {int(other[0])} parameters with {int(other[1])} "
                    f"values, process 0 has {int(gathered[0][0])} with {int(gathered[0][1])}: "
                    "build the model and guide alike in every process (same arguments, same "
                    "initialisation data)")

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrite ``tensors`` (parameters, buffers) with process 0's values, in place."""
        tensors = [t for t in tensors if t.is_floating_point()]
        with torch.no_grad(), self._collective("broadcasting process 0's parameters"):
            for group in _by_dtype(tensors).values():
                flat = torch.cat([t.detach().reshape(-1) for t in group]).to(self.device)
                torch_dist.broadcast(flat, 0)
                for t, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
                    t.copy_(part.view_as(t))

    def all_reduce(self, params: list[torch.Tensor], loss: float,
                   error: Exception | None = None) -> float:
        """Sum the parameters' ``.grad`` and ``loss`` over the processes (in place); returns
        the summed loss. A parameter without a gradient in every process keeps ``None``, as in
        one process (the optimiser then skips it).

        ``error``: this process's failure in the step (its gradients are then not used). One
        flag per process rides in the float64 buffer (``world_size`` numbers more in the
        collective the step makes anyway), so every process learns in this all-reduce which
        failed; then they exchange the errors (:meth:`errors`) and all stop
        (:meth:`stop_if_failed`)."""
        groups = _by_dtype(params)
        if torch.float64 not in groups:
            groups[torch.float64] = []
        # the float64 buffer's tail: a failure flag per process, and the loss
        tail = [0.0] * self.world_size + [loss]
        tail[self.rank] = float(error is not None)
        failed = []
        with torch.no_grad(), self._collective("the all-reduce of the gradients"):
            for dtype, group in groups.items():
                parts = [p.grad.reshape(-1) if p.grad is not None
                         else torch.zeros(p.numel(), dtype=dtype, device=p.device)
                         for p in group]
                # one flag per parameter (it had a gradient); with float64 the processes'
                # failure flags and the loss
                flags = torch.tensor([float(p.grad is not None) for p in group], dtype=dtype)
                extra = [flags, torch.tensor(tail, dtype=dtype)] if dtype == torch.float64 \
                    else [flags]
                flat = torch.cat([t.to(self.device) for t in parts + extra])
                torch_dist.all_reduce(flat)
                values = flat[: flat.numel() - sum(t.numel() for t in extra)]
                summed_flags = flat[values.numel(): values.numel() + len(group)]
                for p, part, flag in zip(group, values.split([p.numel() for p in group]),
                                         summed_flags.tolist(), strict=True):
                    if flag > 0:
                        p.grad = part.view_as(p).to(p.device).clone()
                if dtype == torch.float64:
                    *failed, loss = flat[-1 - self.world_size:].tolist()
        if any(flag > 0 for flag in failed):
            self.stop_if_failed("training", error, self.errors(error), f"Fix it, then {RESUME}")
        return loss

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the processes (a new tensor, on ``values``' device)."""
        flat = values.detach().clone().to(self.device)
        with self._collective("summing over the processes"):
            torch_dist.all_reduce(flat)
        return flat.to(values.device)

    # ---------------------------------------------------------------- checkpoints
    def share_checkpoint(self, read: Callable[[], dict | None],
                         map_location=None) -> dict | None:
        """``read()`` (the checkpoint, or ``None`` where there is none) in process 0, on every
        process. Where process 0 cannot read it (corrupt, not a checkpoint, unreadable),
        every process stops with its error (:meth:`agree`) before anything is sent."""
        state, error = None, None
        if self.writer:
            try:
                state = read()
            except Exception as err:  # noqa: BLE001 (reported to every process)
                error = err
        self.agree("reading the checkpoint to resume from", error)
        return self.broadcast_state(state, map_location)

    def broadcast_state(self, state: dict | None, map_location=None) -> dict | None:
        """Process 0's ``state`` (a checkpoint: tensors and plain data, or ``None``) on every
        process: serialised by ``torch.save`` and read back with ``weights_only=True``."""
        payload = b""
        if self.writer and state is not None:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            payload = buffer.getvalue()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        with self._collective("sending process 0's checkpoint"):
            torch_dist.broadcast(size, 0)
            n = int(size.item())
            if n == 0:
                return None
            data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if self.writer
                    else torch.empty(n, dtype=torch.uint8))
            data = data.to(self.device)
            torch_dist.broadcast(data, 0)
        if self.writer:
            return state
        return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), map_location=map_location,
                          weights_only=True)


def _by_dtype(tensors) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups
