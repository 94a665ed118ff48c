"""Why does a GPyTorch DeepGP step cost what it costs? The step of ``speed.py``'s ``gpytorch``
implementation (GPyTorch's ``DeepGP`` of ``DeepGPLayer``\\ s, whitened ``VariationalStrategy``,
``DeepApproximateMLL(VariationalELBO)``) timed under the settings a user meets, beside ours on
the same data, parameters and minibatches:

``samples``  ``gpytorch.settings.num_likelihood_samples``: 1 in ``speed.py``; 10 is GPyTorch's
             default and its Deep GP tutorial's (every inner layer's output is then drawn 10
             times, so every later layer's ``K_ZX``, conditional and backward run on 10x the
             rows);
``debug``    ``gpytorch.settings.debug``: on by default (argument checks on every call).

Each variant's step is split into forward, backward and optimiser milliseconds (medians over
``--repeats`` interleaved rounds: every variant once per round, so a busy machine slows all
alike), and one profiled step of each variant names the operators with the most self time.
One JSON line per (configuration, variant) goes to ``benchmarks/results/gpytorch_step.jsonl``
(the machine record names the torch, gpytorch and linear_operator versions).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import results
import speed
import torch

__all__ = ["VARIANTS", "build_parser", "main", "time_split"]

#: (name, likelihood samples, debug) of each GPyTorch variant timed
VARIANTS = (("samples 1, debug off", 1, False), ("samples 10, debug off", 10, False),
            ("samples 10, debug on", 10, True))


class GPyTorchAs(speed.GPyTorch):
    """``speed.GPyTorch`` with the likelihood samples and the debug setting given."""

    def __init__(self, cfg, X, y, init, samples: int, debug: bool):
        super().__init__(cfg, X, y, init)
        self.samples, self.debug = samples, debug

    def loss(self, X, y) -> torch.Tensor:
        gp = self.gpytorch
        with gp.settings.num_likelihood_samples(self.samples), gp.settings.debug(self.debug):
            return -self.mll(self.model(X), y)


def time_split(impl, X, y) -> tuple[float, float, float]:
    """Milliseconds of one step's forward pass, backward pass and optimiser update."""
    impl.opt.zero_grad()
    t0 = time.perf_counter()
    loss = impl.loss(X, y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    impl.opt.step()
    t3 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2)


def top_operators(impl, X, y, count: int) -> list[str]:
    """``"name: ms"`` of the ``count`` operators with the most self CPU time in one step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        impl.step(X, y)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [f"{e.key}: {e.self_cpu_time_total / 1e3:.1f} ms x{e.count}" for e in rows[:count]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/gpytorch_step.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--num-inducing", type=int, default=128)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--num-data", type=int, default=12_000)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--top", type=int, default=6, help="operators named per variant")
    p.add_argument("--no-record", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = speed.Config(args.layers, args.num_inducing, args.batch, args.hidden,
                       num_data=args.num_data, dtype=args.dtype)
    X, y = speed.make_data(cfg)
    batches = speed.make_batches(cfg)
    ours = speed.Ours(cfg, X, y)
    impls = {"ours": ours, **{name: GPyTorchAs(cfg, X, y, ours, s, d)
                              for name, s, d in VARIANTS}}
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in impls}
    for r in range(args.warmup + args.repeats):
        idx = batches[r % len(batches)]
        for name, impl in impls.items():
            split = time_split(impl, X[idx], y[idx])
            if r >= args.warmup:
                times[name].append(split)
    idx = batches[0]
    settings = {"layers": args.layers, "num_inducing": args.num_inducing, "batch": args.batch,
                "hidden_dim": args.hidden, "num_data": args.num_data, "dtype": args.dtype,
                "threads": args.threads, "device": "cpu"}
    for name, impl in impls.items():
        fwd, bwd, opt = (statistics.median(t[i] for t in times[name]) for i in range(3))
        figures = {"forward_ms": fwd, "backward_ms": bwd, "optimiser_ms": opt,
                   "step_ms": statistics.median(sum(t) for t in times[name]),
                   "top_operators": top_operators(impl, X[idx], y[idx], args.top)}
        print(f"{name:24s} step {figures['step_ms']:8.1f} ms (forward {fwd:.1f}, backward "
              f"{bwd:.1f}, optimiser {opt:.1f})\n    " + "\n    ".join(
                  figures["top_operators"]))
        if not args.no_record:
            results.record("gpytorch_step", {**settings, "variant": name}, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
