"""``pyro_dgp.processes``: how many processes for independent jobs, and jobs run here and in
spawned workers (what ``fit``'s restarts and the gold standard's chains use)."""

import os

import pytest
import torch

from pyro_dgp.processes import (
    process_count,
    run_here_and_in_workers,
    tensors_from_bytes,
    tensors_to_bytes,
)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_process_count_is_jobs_at_most_the_tasks_and_auto_one_per_core():
    assert process_count(3, 5) == 3
    assert process_count(8, 2) == 2
    assert process_count("auto", 64) == min(64, _cores())
    assert process_count("auto", 1) == 1
    assert process_count("auto", 4, torch.device("cuda", 0)) == 1  # no device touched


@pytest.mark.parametrize(("jobs", "match"), [
    (0, "jobs must be a positive integer, got 0"),
    ("many", "jobs must be a positive integer or 'auto', got 'many'"),
    (1.5, "jobs must be a positive integer"),
])
def test_process_count_refuses_what_is_not_a_count(jobs, match):
    with pytest.raises(ValueError, match=match):
        process_count(jobs, 4)


def test_tensors_round_trip_through_bytes():
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1, 2])}
    back = tensors_from_bytes(tensors_to_bytes(tensors))
    assert set(back) == {"a", "b"} and all(torch.equal(back[k], tensors[k]) for k in tensors)


def _threads_and_square(payload: bytes) -> tuple[int, bytes]:
    """A worker's job: its torch thread count and the square of the tensor sent."""
    x = tensors_from_bytes(payload)["x"]
    return torch.get_num_threads(), tensors_to_bytes({"x": x * x})


def _fails(payload: bytes):
    raise RuntimeError(f"job {payload.decode()} failed")


@pytest.mark.slow
def test_jobs_run_here_and_in_one_thread_workers():
    payloads = [tensors_to_bytes({"x": torch.tensor([float(k)])}) for k in (2, 3)]
    here, sent = run_here_and_in_workers(lambda: "here", _threads_and_square, payloads, 3)
    assert here == "here"
    assert [threads for threads, _ in sent] == [1, 1]
    assert [tensors_from_bytes(b)["x"].item() for _, b in sent] == [4.0, 9.0]


@pytest.mark.slow
def test_a_failed_worker_job_is_raised_here():
    with pytest.raises(RuntimeError, match="job 1 failed"):
        run_here_and_in_workers(lambda: None, _fails, [b"1"], 2)
