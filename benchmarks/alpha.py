"""The local alpha-divergence benchmark: DGP 2 with the mean-field and a cross-layer guide,
trained with the local alpha objective (``pyro_dgp.infer.alpha``) at several alphas, on UCI
sets; test log-likelihood, RMSE, CRPS and 95% coverage, mean and standard error over splits.

Each (guide, alpha) is a run of the UCI harness (``uci.py --objective alpha``), so runs are
resumable and every finished split is a line of ``--out``; the summary goes to
``benchmarks/results/uci.jsonl`` (objective ``alpha=<a>,S=<S>``) and is printed as a table.
The question it answers (Hernández-Lobato's lecture): does alpha = 1 give the best NLL and an
intermediate alpha the best RMSE?
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uci

DEFAULTS = {"datasets": ["boston", "energy", "kin8nm", "power"],
            "guides": ["meanfield", "coupled"], "alphas": [1e-3, 0.5, 1.0], "splits": "3",
            "steps": 5000}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/alpha.py", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=DEFAULTS["datasets"], help="UCI sets")
    p.add_argument("--guides", nargs="+", default=DEFAULTS["guides"], help="guide names")
    p.add_argument("--alphas", nargs="+", type=float, default=DEFAULTS["alphas"],
                   help="alphas in (0, 1]")
    p.add_argument("--splits", default=DEFAULTS["splits"], help="as uci.py --splits")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="Adam iterations")
    p.add_argument("--alpha-samples", type=int, default=10, help="draws per point S")
    p.add_argument("--batch-size", type=int, default=10000, help="minibatch size")
    p.add_argument("--out", default="alpha_runs.jsonl", help="JSON lines of finished runs")
    p.add_argument("--no-record", action="store_true", help="no line in results/uci.jsonl")
    p.add_argument("--quiet", action="store_true", help="no per-step progress bar")
    p.add_argument("--device", default="cpu", help="as uci.py --device")
    p.add_argument("--dtype", default="float64", help="as uci.py --dtype")
    p.add_argument("--init", default="package", help="as uci.py --init")
    p.add_argument("--checkpoint-dir", default=None, help="as uci.py --checkpoint-dir")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time over every guide, alpha, set and split (uci.py --jobs)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    common = ["--datasets", *args.datasets, "--layers", "2", "--splits", args.splits,
              "--steps", str(args.steps), "--batch-size", str(args.batch_size),
              "--objective", "alpha", "--alpha-samples", str(args.alpha_samples),
              "--out", args.out, "--device", args.device, "--dtype", args.dtype,
              "--init", args.init]
    common += ["--checkpoint-dir", args.checkpoint_dir] if args.checkpoint_dir else []
    common += (["--no-record"] if args.no_record else []) + (["--quiet"] if args.quiet else [])
    configurations = [["--guide", g, "--alpha", repr(a)] for g in args.guides for a in args.alphas]
    if args.jobs > 1:  # every run in a pool of processes; the loop below then records them
        base = [a for a in common if a not in ("--no-record", "--quiet")]
        splits = uci.split_indices(args.datasets, args.splits)
        failed = uci.run_in_processes(
            [base + c + ["--datasets", ds, "--splits", f"{k}:{k + 1}", "--no-record"]
             for c in configurations for ds in args.datasets for k in splits[ds]], args.jobs)
        if failed:
            print(f"{failed} runs failed", file=sys.stderr)
    for configuration in configurations:
        code = uci.main(common + configuration)
        if code:
            return code
    records = [r for r in uci.read_records(Path(args.out)) if r.get("status") == "ok"]
    print(uci.summarize(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
