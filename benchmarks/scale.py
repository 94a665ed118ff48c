"""Scale benchmark: time per epoch and peak resident memory against the number of rows N, in
one process and data-parallel in several (``torch.distributed``, gloo, launched by torchrun).

Data: synthetic regression, ``X (N, 8)`` uniform on ``[-1, 1]``, ``y = sin(3 x_1) + x_2 x_3 +
0.1 noise``, written as float32 ``.npy`` files to a temporary folder in chunks (never held in
memory) and read by :class:`pyro_dgp.datasets.stream.ArrayStream` (rows by positional reads,
the file never mapped: ``reader`` "pread"; standardised by one pass of running moments).
Records with ``reader`` "mmap, pages released every 128 rows" were measured with an earlier
reader that mapped the file and released its pages every 128 rows. Model: DGP 2
(``DeepGP.regression`` built from 2,000 sampled rows, M inducing points, float64),
``guides.MeanField``, Adam, global batch B rows per step (with replacement); an epoch is
``ceil(N / B)`` steps.

Each configuration runs in fresh processes (one, or ``torchrun --nproc-per-node P``), so that
``ru_maxrss`` (peak resident set, KiB on Linux) is that configuration's peak: the largest over
its processes is reported. Figures:

- ``ms_per_step``: median wall time of a step after 5 warm-up steps (process 0's clock;
  step boundaries are the optimiser's ``step`` calls);
- ``seconds_per_epoch``: ``mean step time x ceil(N / B)``; ``epoch_extrapolated`` is true where
  fewer steps than an epoch were run (``--max-steps``), so the epoch is that product, not a
  measured epoch;
- ``peak_rss_mib``: the largest ``ru_maxrss`` of the configuration's processes;
- ``standardize_s``: the one pass of running moments over the file (split between processes);
- ``speedup``: one process's ``seconds_per_epoch`` over this one's, same N, same invocation;
- ``load1``: the machine's one-minute load average when the configuration started (a shared
  machine's other work shows there).

Run: ``python benchmarks/scale.py --rows 100000 1000000 --processes 1 2``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import results

WARMUP = 5


# ------------------------------------------------------------------------------- the data
def write_data(folder: Path, n: int, d: int = 8, seed: int = 0, chunk: int = 1 << 18) -> None:
    """``X.npy (n, d)`` and ``y.npy (n,)``, float32, written chunk by chunk."""
    rng = np.random.default_rng(seed)
    X = np.lib.format.open_memmap(folder / "X.npy", "w+", np.float32, (n, d))
    y = np.lib.format.open_memmap(folder / "y.npy", "w+", np.float32, (n,))
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        x = rng.uniform(-1.0, 1.0, size=(hi - lo, d))
        X[lo:hi] = x
        y[lo:hi] = np.sin(3 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.normal(size=hi - lo)
        X.flush()
        y.flush()
    del X, y


# ------------------------------------------------------------------------------- a worker
def worker(args) -> None:
    """One process of a configuration: train, then write its figures to ``args.report``."""
    import torch

    torch.set_num_threads(args.threads)
    import pyro

    import pyro_dgp as dgp
    from pyro_dgp.datasets.stream import ArrayStream

    class TimedAdam(torch.optim.Adam):
        """Adam that notes the time of each step."""

        times: list[float] = []

        def step(self, closure=None):
            TimedAdam.times.append(time.perf_counter())
            return super().step(closure)

    distributed = args.processes[0] > 1
    if distributed:
        dgp.train.distributed.init("cpu", timeout=600)
    rank = int(os.environ.get("RANK", 0))
    t0 = time.perf_counter()
    stream = ArrayStream(Path(args.data) / "X.npy", Path(args.data) / "y.npy")
    standardize_s = time.perf_counter() - t0
    pyro.set_rng_seed(0)
    X0, y0 = stream.sample(2000, seed=0)
    model = dgp.DeepGP.regression(X0, y0, num_layers=2, num_inducing=args.inducing, seed=0)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, stream, num_steps=args.steps, batch_size=args.batch_size,
                     lr=0.01, optimizer=TimedAdam, progress=False, final_elbo_particles=0,
                     threads=args.threads, distributed=distributed, seed=0)
    gaps = np.diff(TimedAdam.times)[WARMUP:]
    report = {"rank": rank, "ms_per_step": 1000 * float(statistics.median(gaps)),
              "mean_ms_per_step": 1000 * float(np.mean(gaps)),
              "fit_seconds": result.seconds, "standardize_s": standardize_s,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "last_loss_per_row": result.losses[-1] / stream.num_data}
    Path(f"{args.report}.{rank}").write_text(json.dumps(report))
    if distributed:
        dgp.train.distributed.shutdown()


# ------------------------------------------------------------------------------- the driver
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_configuration(data: Path, rows: int, processes: int, args) -> dict:
    """Run one configuration in fresh processes; process 0's timings, the largest peak."""
    steps_per_epoch = math.ceil(rows / args.batch_size)
    steps = min(steps_per_epoch, args.max_steps) + WARMUP + 1
    report = data / f"report_{processes}"
    worker_args = [str(Path(__file__).resolve()), "--worker", "--data", str(data),
                   "--report", str(report), "--steps", str(steps),
                   "--batch-size", str(args.batch_size), "--num-inducing", str(args.inducing),
                   "--threads", str(args.threads), "--processes", str(processes)]
    if processes == 1:
        command = [sys.executable, *worker_args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(processes), "--master-port", str(_free_port()), *worker_args]
    load1 = os.getloadavg()[0]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS":
                                             str(args.threads)})
    parts = [json.loads(Path(f"{report}.{r}").read_text()) for r in range(processes)]
    first = parts[0]
    extrapolated = steps - WARMUP - 1 < steps_per_epoch
    return {
        "ms_per_step": round(first["ms_per_step"], 3),
        "seconds_per_epoch": round(first["mean_ms_per_step"] * steps_per_epoch / 1000, 3),
        "epoch_extrapolated": extrapolated,
        "steps_run": steps,
        "peak_rss_mib": round(max(p["peak_rss_mib"] for p in parts), 1),
        "standardize_s": round(max(p["standardize_s"] for p in parts), 3),
        "load1": round(load1, 2),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", nargs="+", type=lambda s: int(float(s)),
                   default=[100_000, 1_000_000], help="N, the rows of each data set")
    p.add_argument("--processes", nargs="+", type=int, default=[1, 2],
                   help="processes per configuration (more than 1: torchrun, gloo)")
    p.add_argument("--batch-size", type=int, default=1000, help="global batch B per step")
    p.add_argument("--max-steps", type=int, default=1000,
                   help="steps timed at most; an epoch of more steps is extrapolated (and "
                        "flagged epoch_extrapolated)")
    p.add_argument("--num-inducing", "--inducing", dest="inducing",
                   type=int, default=100, help="inducing points M per layer")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--workdir", default=None, help="folder for the data (default: a temporary "
                                                   "folder, removed after)")
    p.add_argument("--no-record", action="store_true",
                   help="do not append to benchmarks/results/scale.jsonl")
    # a worker process's own options
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--report", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="pyro_dgp_scale_") as tmp:
        for rows in args.rows:
            data = Path(tmp) / f"n{rows}"
            data.mkdir()
            write_data(data, rows)
            one = None
            for processes in args.processes:
                figures = run_configuration(data, rows, processes, args)
                if processes == 1:
                    one = figures["seconds_per_epoch"]
                elif one is not None:
                    figures["speedup"] = round(one / figures["seconds_per_epoch"], 3)
                settings = {"rows": rows, "processes": processes, "dims": 8, "layers": 2,
                            "inducing": args.inducing, "batch_size": args.batch_size,
                            "guide": "meanfield", "dtype": "float64", "data": "float32 .npy",
                            "threads": args.threads, "backend": "gloo" if processes > 1
                            else "none", "reader": "pread"}
                print(json.dumps({**settings, **figures}), flush=True)
                if not args.no_record:
                    results.record("scale", settings, figures)
            for f in data.iterdir():
                f.unlink()
            data.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
