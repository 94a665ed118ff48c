"""How the processes of a data-parallel run learn of one another's failures.

Every process runs the same collectives in the same order. A process whose part of a step
fails must still take part in them, or the others wait in their next collective until the
timeout; so each outcome is agreed on: every process says whether it failed and why
(:meth:`Agreement.errors`, two all-gathers of the messages), and where one did, all stop at
once, the failed one with its own error and the others with :class:`PeerFailedError` naming
it. A process that dies outright cannot say anything: the backend notices, at once where its
connection closes, else at the timeout, and does not say which process it was.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as torch_dist

__all__ = ["FIX", "MESSAGE_BYTES", "RESTART", "RESUME", "Agreement", "PeerFailedError",
           "one_line"]


class PeerFailedError(RuntimeError):
    """Another process of a data-parallel run failed (``ranks``: which, where known; the
    message gives each one's error), died, or did not answer within the timeout."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = ranks


#: bytes of a process's error message that the others receive (:meth:`Agreement.errors`)
MESSAGE_BYTES = 2000


class Agreement:
    """A process of a group (``rank`` of ``world_size``; collectives' buffers on ``device``,
    each waiting up to ``timeout`` seconds) that agrees with the others on each outcome."""

    def __init__(self, rank: int, world_size: int, device: torch.device, timeout: float):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.timeout = timeout
        self.step = None  # the step in progress, named by errors

    @contextlib.contextmanager
    def _collective(self, what: str):
        """Turn a collective's failure into :class:`PeerFailedError` with what to do. Gloo
        and NCCL do not say which process closed its connection or fell silent; with two
        processes it can only be the other one."""
        try:
            yield
        except RuntimeError as err:  # DistBackendError and gloo's errors are RuntimeErrors
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            others = [r for r in range(self.world_size) if r != self.rank]
            who = (f"process {others[0]}" if len(others) == 1 else
                   "another process of the run (the backend does not say which)")
            raise PeerFailedError(
                f"process {self.rank} of {self.world_size}: {what}{self._when()} failed: "
                f"{who} died or did not answer within {self.timeout:g} s ({first}). "
                f"{RESTART}", others if len(others) == 1 else None) from err

    def _when(self) -> str:
        return f" at step {self.step}" if self.step is not None else ""

    def errors(self, error: BaseException | None) -> dict[int, str]:
        """Every process's error, by rank, of the processes that had one (``error``: this
        process's, or ``None``): each one's message, up to :data:`MESSAGE_BYTES` bytes of
        UTF-8, in two all-gathers (the lengths, then the padded bytes); every process must
        call it."""
        text = "" if error is None else one_line(error)
        mine = text.encode()[:MESSAGE_BYTES]
        length = torch.tensor([len(mine)], dtype=torch.int64, device=self.device)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        with self._collective("exchanging the processes' errors"):
            torch_dist.all_gather(lengths, length)
            size = max(int(n.item()) for n in lengths)
            if size == 0:
                return {}
            padded = torch.zeros(size, dtype=torch.uint8)
            if mine:
                padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
            padded = padded.to(self.device)
            gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
            torch_dist.all_gather(gathered, padded)
        return {rank: bytes(data[: int(n.item())].cpu().tolist()).decode(errors="replace")
                for rank, (n, data) in enumerate(zip(lengths, gathered, strict=True))
                if int(n.item()) > 0}

    def agree(self, what: str, error: Exception | None, advice: str = "") -> None:
        """Every process's outcome of ``what`` on every process (:meth:`errors`): where one
        failed, every process stops: the failed ones with their own error (a note naming the
        process added), the others with :class:`PeerFailedError` naming the failed processes
        and their errors, and ``advice`` (default: fix it and start them all again). Every
        process must call it."""
        self.stop_if_failed(what, error, self.errors(error), advice)

    def stop_if_failed(self, what: str, error: Exception | None, failures: dict[int, str],
                       advice: str = "") -> None:
        """Raise as :meth:`agree` says where ``failures`` (by rank) is not empty."""
        if error is not None:
            error.add_note(f"(process {self.rank} of {self.world_size}, {what}{self._when()}: "
                           "the other processes were told and stopped too)")
            raise error
        if failures:
            named = "; ".join(f"process {rank} failed: {text}"
                              for rank, text in sorted(failures.items()))
            raise PeerFailedError(
                f"process {self.rank} of {self.world_size}: {what}{self._when()} stopped: "
                f"{named}. {advice or FIX}", sorted(failures))

    @contextlib.contextmanager
    def together(self, what: str):
        """Run the body on every process, then :meth:`agree` on its outcome: an error in one
        process stops all of them at once, rather than leaving the others waiting in their
        next collective until the timeout."""
        error = None
        try:
            yield
        except PeerFailedError:
            raise  # a collective of the body failed: the group can agree on nothing more
        except Exception as err:  # noqa: BLE001 (every error of the body is reported)
            error = err
        self.agree(what, error)


#: what to do after a failure, in the processes' errors
RESUME = ("start all processes again with resume=True (pyro-dgp fit --resume): they "
          "continue from process 0's last checkpoint.")
RESTART = RESUME[0].upper() + RESUME[1:]
FIX = "Fix it and start all processes again."


def one_line(error: BaseException) -> str:
    """``Type: message`` of ``error``, its lines joined."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
