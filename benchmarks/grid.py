"""Grids of single UCI runs over ``uci.py``'s harness, shared by ``defaults.py`` and
``guides.py``: one run at a time (``uci.main`` with one set, one split), all in one resumable
runs file, so a run two studies need is done once (the harness skips a run whose settings are
already there).

A grid stops starting runs at ``--stop-at`` (UTC), and skips the rest of a set, for this
invocation, once one of its runs took more than ``--max-seconds`` (a set too slow for the
session; re-issue the command with a larger limit to run it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

import uci

HERE = Path(__file__).resolve().parent
RUNS = HERE / "results" / "runs" / "uci_study.jsonl"
POINTWISE = HERE / "results" / "runs" / "pointwise"

__all__ = ["POINTWISE", "RUNS", "Run", "add_common", "find", "objective_argv",
           "objective_label", "run_grid", "split_means", "summary_figures"]


@dataclass(frozen=True)
class Run:
    """One (set, guide, objective, split) run of DGP ``layers`` (objective: ``auto``,
    ``elbo``, ... or ``alpha=<a>`` for the local alpha objective); ``seed``: the harness's base
    seed (split k runs with seed + k)."""

    dataset: str
    guide: str
    objective: str
    split: int
    layers: int = 2
    seed: int = 0


def _split_token(objective: str) -> tuple[str, int]:
    """``(objective, particles)`` of a token ``<objective>[,P=<n>]`` (``n`` training draws per
    step and point; 1 when not given)."""
    name, _, draws = objective.partition(",P=")
    return name, int(draws) if draws else 1


def objective_argv(objective: str) -> list[str]:
    """``uci.py`` options of an objective token (``alpha=1`` -> ``--objective alpha --alpha
    1``; ``auto,P=10`` -> ``--objective auto --particles 10``; not for the alpha objective,
    whose draws are its own setting)."""
    name, particles = _split_token(objective)
    if name.startswith("alpha="):
        if particles != 1:
            raise ValueError(f"objective {objective!r}: the alpha objective's draws are its "
                             "S = 10 (uci.py --alpha-samples); leave out ',P='")
        return ["--objective", "alpha", "--alpha", name.split("=", 1)[1]]
    return ["--objective", name, *(["--particles", str(particles)] if particles != 1 else [])]


def objective_label(objective: str) -> str:
    """The harness's record label of an objective token (its draws are a setting)."""
    parser = uci.build_parser()
    return uci.objective_label(parser.parse_args(objective_argv(objective)))


def add_common(p: argparse.ArgumentParser, datasets: list[str], splits: list[int]) -> None:
    """Options every grid has."""
    p.add_argument("--datasets", nargs="+", default=datasets, help="UCI sets, in run order")
    p.add_argument("--splits", nargs="+", type=int, default=splits,
                   help="split indices; every set's split k runs before any split k + 1")
    p.add_argument("--steps", type=int, default=3000, help="Adam iterations")
    p.add_argument("--batch-size", type=int, default=1000, help="minibatch size")
    p.add_argument("--num-inducing", type=int, default=100, help="M per layer")
    p.add_argument("--out", default=str(RUNS), help="shared JSON-lines file of finished runs")
    p.add_argument("--pointwise-dir", default=str(POINTWISE),
                   help="per-run side files (benchmarks/pointwise.py)")
    p.add_argument("--max-seconds", type=float, default=240.0,
                   help="skip the rest of a set (this invocation) after a run slower than this")
    p.add_argument("--stop-at", default=None, metavar="HH:MM", type=deadline,
                   help="start no run after this UTC time (its next occurrence: 01:00 given "
                   "at 22:50 is tomorrow's)")
    p.add_argument("--summary-only", action="store_true", help="run nothing; record summaries")
    p.add_argument("--validation", type=float, default=None, metavar="F",
                   help="uci.py --validation: hold out F of each training split (stacking "
                   "weights from the held-out points); separate runs from those without")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                   help="uci.py --lr-schedule: the protocol's constant rate, or fit's cosine "
                   "schedule (separate runs)")


def lr_schedule(args) -> str:
    """``--lr-schedule`` of a grid's options (``constant``, the protocol's, where not given)."""
    return getattr(args, "lr_schedule", "constant")


def settings(args) -> dict:
    """The grid options a record names only where they differ from the protocol's."""
    return {**({"validation": args.validation} if args.validation else {}),
            **({"lr_schedule": lr_schedule(args)} if lr_schedule(args) != "constant" else {})}


def _argv(run: Run, args) -> list[str]:
    return ["--datasets", run.dataset, "--layers", str(run.layers), "--splits",
            f"{run.split}:{run.split + 1}", "--guide", run.guide, *objective_argv(run.objective),
            "--steps", str(args.steps), "--batch-size", str(args.batch_size),
            "--num-inducing", str(args.num_inducing), "--seed", str(run.seed),
            "--out", args.out, "--pointwise-dir", args.pointwise_dir, "--threads", "1",
            "--no-record", "--quiet",
            *(["--validation", str(args.validation)] if args.validation else []),
            "--lr-schedule", lr_schedule(args)]


def find(records: list[dict], run: Run, args) -> dict | None:
    """The last finished record of ``run`` at these settings (``None``: not run yet)."""
    want = (run.dataset, run.guide, objective_label(run.objective), run.split, run.layers,
            args.steps, args.batch_size, args.num_inducing, run.seed,
            _split_token(run.objective)[1], args.validation or None, lr_schedule(args))
    for rec in reversed(records):
        s = rec.get("settings", {})
        have = (rec.get("dataset"), rec.get("guide"), rec.get("objective"), rec.get("split"),
                rec.get("layers"), s.get("steps"), s.get("batch_size"), s.get("inducing"),
                s.get("seed"), s.get("particles", 1), s.get("validation"),
                s.get("lr_schedule", "constant"))
        if have == want and rec.get("status") != "failed":
            return rec
    return None


def deadline(hh_mm: str, now: dt.datetime | None = None) -> dt.datetime:
    """The next UTC time ``hh_mm`` after ``now`` (a time of day already past is tomorrow's)."""
    now = dt.datetime.now(dt.UTC) if now is None else now
    try:
        hh, mm = (int(t) for t in hh_mm.split(":"))
        at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--stop-at wants HH:MM (UTC), got {hh_mm!r}") from err
    return at if at > now else at + dt.timedelta(days=1)


def _past(stop_at: dt.datetime | None) -> bool:
    return stop_at is not None and dt.datetime.now(dt.UTC) >= stop_at


def run_grid(runs: list[Run], args, on_finished=None, slow: set[str] | None = None) -> list[Run]:
    """Run each of ``runs`` not yet in ``args.out``, in order, one at a time; calls
    ``on_finished(run)`` after each run that finished here. ``slow``: the sets found too slow
    so far (updated in place; pass one set to several calls of one invocation). Returns the
    runs left undone."""
    slow = set() if slow is None else slow
    left = []
    for run in runs:
        done = find(uci.read_records(Path(args.out)), run, args)
        if done is not None:
            if done.get("seconds", 0) > args.max_seconds:
                slow.add(run.dataset)
            continue
        if args.summary_only or run.dataset in slow or _past(args.stop_at):
            left.append(run)
            continue
        code = uci.main(_argv(run, args))
        rec = find(uci.read_records(Path(args.out)), run, args)
        if code or rec is None:
            print(f"run {run} did not finish (exit {code})", file=sys.stderr)
            left.append(run)
            continue
        if rec["seconds"] > args.max_seconds:
            print(f"{run.dataset}: a run took {rec['seconds']:.0f} s > --max-seconds "
                  f"{args.max_seconds:g}; skipping its other runs in this invocation",
                  file=sys.stderr)
            slow.add(run.dataset)
        if on_finished is not None:
            on_finished(run)
    return left


def summary_figures(records: list[dict]) -> dict:
    """Mean (standard error) over the splits of one configuration's finished records."""
    ok = [r for r in records if r.get("status", "ok") == "ok"]
    figures: dict = {"splits_run": sorted(r["split"] for r in ok), "diverged": len(records)
                     - len(ok)}
    if not ok:
        return figures
    for name in ("test_loglik", "rmse", "crps", "coverage95"):
        figures[name], figures[f"{name}_se"] = uci.mean_se([r["metrics"][name] for r in ok])
    figures["seconds"] = sum(r["seconds"] for r in ok) / len(ok)
    diag = [r["diagnostics"] for r in ok if "diagnostics" in r]
    for name in ("noise_variance", "predictive_variance_mean", "draw_spread_variance_mean",
                 "mean_bias"):
        if diag:
            figures[name] = sum(d[name] for d in diag) / len(diag)
    return figures


def split_means(per_split: list[dict]) -> dict:
    """Mean (standard error) over splits of the scores and seconds of per-split figures."""
    figures: dict = {}
    for name in ("test_loglik", "rmse", "crps", "coverage95", "seconds"):
        figures[name], figures[f"{name}_se"] = uci.mean_se([f[name] for f in per_split])
    return figures
