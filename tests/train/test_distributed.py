"""Data-parallel training (pyro_dgp.train.distributed): two processes on gloo against one.

The processes are forked from the test process (its imports shared, so a launch costs no
start-up) and join their group through torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), the code path of ``torchrun``; ``tests/distributed_worker.py`` is
what each runs. The references are computed here, in one process.

Every comparison is a known answer, not a statistical one: the one-layer model's objective
has no Monte Carlo draw (collapsed q(u), closed-form expected log-likelihood), nor has the
amortized model's under the AR2P rule (its encoders' weights are global parameters, its
per-point q(u_n) local to each process's rows), so two processes must reproduce one
process's loss, gradient and steps to rounding; the
two-layer model's draws come from the seeds of (seed, step, rank), so its one-process
reference is the sum of the two parts evaluated here with those seeds.
"""

import math
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import distributed_worker as worker  # noqa: E402

from pyro_dgp.infer.objectives import make_objective  # noqa: E402
from pyro_dgp.rng import step_seed  # noqa: E402
from pyro_dgp.train.batches import Batches  # noqa: E402
from pyro_dgp.train.optim import parameters_of  # noqa: E402

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not torch.distributed.is_available()
    or not torch.distributed.is_gloo_available(),
    reason="forks gloo processes (Linux, torch.distributed with gloo)")

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process(rank: int, port: int, scenario: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "KILL_TIME_FILE": os.path.join(out, "killed_at")})
    worker.main(scenario, out)


def _start(scenario: str, out: Path) -> list:
    """Start ``scenario`` in two forked processes."""
    port, ctx = _free_port(), multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process, args=(r, port, scenario, str(out)))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    return procs


def _join(procs: list, limit: float = 120.0, straggler: bool = False) -> list[int]:
    """The processes' exit codes. ``straggler``: process 1 is expected to hang once process
    0 has stopped; it is then killed."""
    for rank, p in enumerate(procs):
        p.join(limit)
        if p.is_alive():  # never leave a process behind
            p.kill()
            p.join()
            if not (straggler and rank == 1):
                pytest.fail(f"process {rank} still ran after {limit} s")
        limit = 0 if straggler else limit
    return [p.exitcode for p in procs]


def _launch(scenario: str, out: Path, straggler: bool = False) -> list[int]:
    return _join(_start(scenario, out), straggler=straggler)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``main`` in two processes, and meanwhile the references in this one."""
    out = tmp_path_factory.mktemp("distributed")
    # torch imports its compiler on the first optimiser built: once, here, before the fork
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    procs = _start("main", out)
    refs = {family: worker.run(1, family) for family in ("MeanField", "Coupled", "Amortized")}
    refs["deep"] = _deep_first_step()
    assert _join(procs) == [0, 0]
    seen = [torch.load(out / f"main_{r}.pt", weights_only=True) for r in range(WORLD)]
    return refs, seen, out


def _deep_first_step() -> dict:
    """The two-layer run's first step as its two processes evaluate it, summed here: each
    part's loss weighted B_r / B, with the seed of (0, step 0, rank)."""
    import pyro

    pyro.clear_param_store()
    model, guide, X, y = worker.problem(2, "MeanField")
    pyro.set_rng_seed(0)  # as fit: the seed, then the guide's set-up on the first B rows
    parts = [Batches((X, y), worker.BATCH, (r * worker.BATCH // WORLD,
                                             (r + 1) * worker.BATCH // WORLD))
             for r in range(WORLD)]
    with torch.no_grad():
        guide(*parts[0].first())
    elbo = make_objective("auto", guide)
    loss = 0.0
    for rank, part in enumerate(parts):
        pyro.set_rng_seed(step_seed(0, 0, rank))
        part_loss = part.share * elbo.differentiable_loss(
            model, guide, *part.draw(torch.Generator().manual_seed(0)))
        part_loss.backward()
        loss += float(part_loss.detach())
    return {"losses": [loss], "grads": [[p.grad for p in parameters_of(model, guide)]]}


def _close(a, b, tol=1e-10) -> bool:
    """Tensors equal to ``tol``; a parameter without a gradient (``None``) must have none in
    both (the optimiser skips it, so a zero in its place would change Adam's steps)."""
    return all((x is None and y is None) or (
        x is not None and y is not None and torch.allclose(x, y, rtol=0, atol=tol))
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("family", ["MeanField", "Coupled", "Amortized"])
def test_two_processes_give_one_process_gradient_loss_and_20_steps(runs, family):
    refs, seen, _ = runs
    ref, got = refs[family], seen[0][family]
    # one step's gradient on the global batch: the parts' gradients summed
    assert _close(got["grads"][0], ref["grads"][0])
    # the KL counted once: the loss of every step equals one process's (it would be off by
    # KL / 2 per extra process if each process counted it)
    assert torch.allclose(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=0,
                          atol=1e-9)
    for part in ("model", "guide"):  # 20 SGD steps (distributed_worker.RecordingSGD: why)
        assert _close(got[part].values(), ref[part].values())
    assert got["final_elbo"] == pytest.approx(ref["final_elbo"], rel=1e-10)


def test_two_layer_gradient_is_the_sum_of_the_parts_and_processes_stay_identical(runs):
    refs, seen, _ = runs
    assert _close(seen[0]["deep"]["grads"][0], refs["deep"]["grads"][0])
    assert seen[0]["deep"]["losses"][0] == pytest.approx(refs["deep"]["losses"][0], abs=1e-10)
    for name in ("MeanField", "Coupled", "Amortized", "deep"):  # the same in every process
        for part in ("model", "guide"):
            for a, b in zip(seen[0][name][part].values(), seen[1][name][part].values(),
                            strict=True):
                assert torch.equal(a, b)
        assert seen[0][name]["losses"] == seen[1][name]["losses"]


def test_a_dead_process_stops_the_other_and_resume_gives_the_uninterrupted_run(runs):
    _, seen, out = runs
    codes = _launch("kill", out)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0
    report = torch.load(out / "kill_0.pt", weights_only=True)
    assert "process 0 of 2" in report["error"] and "resume=True" in report["error"]
    # gloo does not say which process closed the connection; of two, it is the other one
    assert "process 1 died or did not answer within 30 s" in report["error"]
    # the survivor noticed within the timeout (30 s; gloo sees the closed connection at once)
    killed_at = float((out / "killed_at").read_text())
    assert report["time"] - killed_at < 30
    # process 1 died in step KILL_AT's update; process 0 finished that step and stopped in
    # the next one's all-reduce, checkpointing its start
    saved = torch.load(out / "killed.pt", weights_only=True)
    assert saved["step"] == worker.KILL_AT + 1
    # resumed with seed=None: the checkpoint's seed 0 seeds the steps' draws again
    assert _launch("resume", out) == [0, 0]
    resumed = torch.load(out / "resume_0.pt", weights_only=True)["deep"]
    assert resumed["resumed_from"] == worker.KILL_AT + 1
    assert resumed["losses"] == seen[0]["deep"]["losses"]
    for part in ("model", "guide"):
        assert _close(resumed[part].values(), seen[0]["deep"][part].values(), tol=0)


def test_a_silent_process_stops_the_other_within_the_timeout(runs):
    _, _, out = runs
    t0 = time.time()
    codes = _launch("hang", out, straggler=True)
    assert codes[0] != 0 and codes[1] == -signal.SIGKILL
    report = torch.load(out / "hang_0.pt", weights_only=True)
    assert f"did not answer within {worker.HANG_TIMEOUT:g} s" in report["error"]
    # process 1 fell silent in step KILL_AT's update; process 0 waited HANG_TIMEOUT seconds in
    # the next all-reduce (the whole run, start-up included, is far shorter than 10 s more)
    assert report["time"] - t0 < worker.HANG_TIMEOUT + 10
    assert torch.load(out / "hung.pt", weights_only=True)["step"] == worker.KILL_AT + 1


def _reports(scenario: str, out: Path) -> list[dict]:
    return [torch.load(out / f"{scenario}_{r}.pt", weights_only=True) for r in range(WORLD)]


def test_an_error_in_one_process_stops_the_other_in_the_same_step_naming_it(runs):
    """Process 1's objective raises at step KILL_AT; process 1 stays alive after its error.
    Process 0 learns of it in that step's all-reduce (the failure flags ride in it), not from
    the timeout (30 s) nor from process 1's closed connection (LINGER s later)."""
    _, _, out = runs
    codes = _launch("raise", out)
    assert codes[0] != 0 and codes[1] != 0
    survivor, failed = _reports("raise", out)
    assert failed["type"] == "OSError" and failed["error"] == worker.RAISED
    assert "process 1 of 2" in failed["notes"][0]
    assert survivor["type"] == "PeerFailedError" and survivor["ranks"] == [1]
    assert (f"training at step {worker.KILL_AT} stopped: process 1 failed: OSError: "
            f"{worker.RAISED}. Fix it, then start all processes again with resume=True"
            in survivor["error"])
    assert failed["other_reported_meanwhile"]  # told while process 1 was still alive
    # process 0 checkpointed the start of the failed step, where both processes were
    assert torch.load(out / "raised.pt", weights_only=True)["step"] == worker.KILL_AT


def test_a_checkpoint_process_0_cannot_read_stops_every_process_naming_why(runs):
    """Resuming from a corrupt file: process 0 fails to read it and stays alive after its
    error; process 1 is told why at once instead of waiting for the checkpoint's bytes."""
    _, _, out = runs
    (out / "corrupt.pt").write_bytes(b"not a checkpoint" * 64)
    codes = _launch("corrupt", out)
    assert codes[0] != 0 and codes[1] != 0
    failed, told = _reports("corrupt", out)
    assert failed["type"] == "ValueError" and "cannot read" in failed["error"]
    assert "process 0 of 2" in failed["notes"][0]
    assert told["type"] == "PeerFailedError" and told["ranks"] == [0]
    assert "reading the checkpoint to resume from stopped: process 0 failed: ValueError" \
        in told["error"] and str(out / "corrupt.pt") in told["error"]
    assert failed["other_reported_meanwhile"]


def test_a_checkpoint_of_another_guide_stops_every_process_with_the_reason(runs):
    _, _, out = runs
    assert all(code != 0 for code in _launch("othermodel", out))
    for rank, report in enumerate(_reports("othermodel", out)):
        assert report["type"] == "ValueError" and "holds another guide" in report["error"]
        assert f"process {rank} of 2, resuming from the checkpoint" in report["notes"][0]


def test_a_global_batch_splits_into_contiguous_parts_whose_shares_add_to_one():
    X = torch.arange(40.0, dtype=torch.float64).reshape(20, 2)
    y = torch.arange(20.0, dtype=torch.float64)
    whole = Batches((X, y), 10).draw(torch.Generator().manual_seed(3))
    parts = [Batches((X, y), 10, (r * 10 // 3, (r + 1) * 10 // 3)) for r in range(3)]
    drawn = [p.draw(torch.Generator().manual_seed(3)) for p in parts]
    assert torch.equal(torch.cat([d[0] for d in drawn]), whole[0])
    assert torch.equal(torch.cat([d[1] for d in drawn]), whole[1])
    assert [p.local_size for p in parts] == [3, 3, 4]
    assert sum(p.share for p in parts) == pytest.approx(1.0, abs=1e-15)


def test_step_seeds_differ_by_step_and_process():
    seeds = {step_seed(0, t, r) for t in range(50) for r in range(4)}
    assert len(seeds) == 200


def test_distributed_without_a_launcher_says_how_to_launch(monkeypatch):
    import pyro_dgp as dgp

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    model, guide, X, y = worker.problem(1, "MeanField")
    with pytest.raises(RuntimeError, match="torchrun"):
        dgp.fit(model, guide, X, y, num_steps=1, distributed=True, progress=False)
    with pytest.raises(ValueError, match="Renyi"):
        dgp.fit(model, guide, X, y, num_steps=1, distributed=True, objective="renyi",
                progress=False)
    with pytest.raises(ValueError, match="natural_gradient"):
        dgp.fit(model, guide, X, y, num_steps=1, distributed=True, natural_gradient=0.1,
                progress=False)


@pytest.mark.slow
def test_torchrun_runs_the_command_line_data_parallel(tmp_path):
    """``torchrun --nproc-per-node 2 -m pyro_dgp.cli fit``: process 0 writes the fit, its
    scores and the checkpoint; ``evaluate`` reads the fit back in one process."""
    import json
    import subprocess

    out = tmp_path / "fit"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port()), "-m", "pyro_dgp.cli", "fit", "--data",
               "step", "--inducing", "10", "--steps", "30", "--batch-size", "50",
               "--samples", "10", "--output", str(out), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "data-parallel on 2 processes" in done.stderr
    scores = json.loads((out / "metrics.json").read_text())
    assert math.isfinite(scores["nll"]) and math.isfinite(scores["final_elbo"])
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 30
    from pyro_dgp.cli import main

    assert main(["evaluate", str(out / "fit.pt")]) == 0
