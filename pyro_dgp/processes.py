"""Independent jobs of one call spread over spawned processes: ``fit``'s restarts
(:mod:`pyro_dgp.train.restarts`) and the gold standard's NUTS chains
(:func:`pyro_dgp.gold.run_nuts`).

Job 0 runs in this process while the others run in ``n - 1`` worker processes. The workers are
spawned (a fresh interpreter each, which imports the package before it works, so a script that
uses them must start under ``if __name__ == "__main__":``), take one torch thread each, and
receive their job pickled by the caller. Tensors come back as bytes of ``torch.save`` and are
read with ``torch.load(weights_only=True)``: nothing sent back runs code when it is read.
Python's ``concurrent.futures`` pool does the scheduling; this module only fixes the spawn
context, the job run here meanwhile, and the cancelling of queued jobs when one fails.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import torch
import torch.multiprocessing

from .validation import check_positive_int

__all__ = ["process_count", "run_here_and_in_workers", "tensors_from_bytes", "tensors_to_bytes"]

T = TypeVar("T")


def process_count(jobs, tasks: int, device: torch.device | str = "cpu") -> int:
    """The number of processes for ``tasks`` independent jobs: ``jobs`` (a positive integer),
    or for ``"auto"`` one per CPU core this process may use (1 where the work is on a GPU);
    never more than ``tasks``."""
    if jobs == "auto":
        if torch.device(device).type != "cpu":
            return 1
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        return max(1, min(tasks, cores))
    if isinstance(jobs, str):
        raise ValueError(f"jobs must be a positive integer or 'auto', got {jobs!r}")
    return min(check_positive_int(jobs, "jobs"), tasks)


def run_here_and_in_workers(here: Callable[[], T], in_worker: Callable[[bytes], Any],
                            payloads: list[bytes], workers: int) -> tuple[T, list]:
    """``(here(), [in_worker(p) for p in payloads])``, the calls of ``in_worker`` (a function
    at a module's top level) made in ``workers - 1`` spawned processes while ``here()`` runs in
    this one. If either raises, the jobs not yet started are cancelled and the error raised."""
    context = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max(1, workers - 1), mp_context=context) as pool:
        futures = [pool.submit(_one_thread, in_worker, payload) for payload in payloads]
        try:
            return here(), [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _one_thread(in_worker: Callable[[bytes], Any], payload: bytes):
    """In a worker: ``in_worker(payload)`` with one torch thread (the job may set others)."""
    torch.set_num_threads(1)
    return in_worker(payload)


def tensors_to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """``tensors`` (a state dict, a dict of draws) as the bytes of ``torch.save``."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def tensors_from_bytes(data: bytes, map_location=None) -> dict[str, torch.Tensor]:
    """The inverse of :func:`tensors_to_bytes`, read with ``weights_only=True``."""
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
