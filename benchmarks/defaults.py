"""Which objective should be the package's default? DGP 2 with the mean-field and the coupled
guide, each trained with the ELBO (``auto``: the guide's default objective), the local alpha
objective at alpha = 0.5 and at alpha = 1 (Hernández-Lobato's lecture: alpha = 1 for NLL, an
intermediate alpha for RMSE), on UCI sets of different sizes; test NLL, RMSE, CRPS and 95%
coverage in original units, mean (standard error) over the splits run.

Each run also records what explains its scores (``uci.py``'s ``diagnostics``): the learned
noise variance, the mean predictive variance and its part from the spread of the draws' means,
and the bias of the mixture mean. Runs go to the shared runs file of ``grid.py`` (one run
serves every study that needs it); one line per (set, guide, objective) and number of splits
goes to ``benchmarks/results/defaults.jsonl``.

``stack``: the stacking (Yao, Vehtari and Gelman 2022) of each split's ELBO fit and alpha = 1
fit, no extra training. With ``--validation F`` every run trains on the rest of its training
split and the stacking weights come from the held-out fraction ``F`` (separate runs from those
without, which take the weights from the fits' PSIS-LOO densities instead: biased towards the
ELBO's fit, whose noise does not collapse).

Resumable: re-issue the same command to continue.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grid
import pointwise
import results
import uci

DATASETS = ["boston", "energy", "concrete", "wine_red", "kin8nm", "power"]
GUIDES = ["meanfield", "coupled"]
OBJECTIVES = ["auto", "alpha=1", "alpha=0.5"]
#: the fits stacked into the ``stack`` column: the ELBO's and alpha = 1's of one split
STACKED = ("auto", "alpha=1")
STACK = "stack"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/defaults.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    grid.add_common(p, DATASETS, [0, 1, 2])
    p.add_argument("--guides", nargs="+", default=GUIDES, help="guide names")
    p.add_argument("--objectives", nargs="+", default=OBJECTIVES,
                   help="auto, elbo, ... or alpha=<a> (the local alpha objective)")
    return p


def plan(args) -> list[grid.Run]:
    """Every run, cheapest first: split k of every set before split k + 1; within a split,
    the objectives in the order given (a step of the local alpha objective costs S = 10 draws
    per point), then the guides in the order given (the coupled guide's step factors one
    covariance over every layer's inducing outputs), then the sets."""
    return [grid.Run(ds, g, o, k) for k in args.splits for o in args.objectives
            for g in args.guides for ds in args.datasets]


def _settings(args, dataset: str, guide: str, objective: str, splits: int) -> dict:
    return {"dataset": dataset, "model": "DGP 2", "guide": guide, "objective": objective,
            "steps": args.steps, "batch": args.batch_size, "inducing": args.num_inducing,
            "dtype": "float64", "splits": splits,
            **grid.settings(args)}


def record(args, dataset: str, guide: str, objective: str) -> None:
    """One line of ``defaults.jsonl``: this configuration over the splits it has so far."""
    records = uci.read_records(Path(args.out))
    found = [grid.find(records, grid.Run(dataset, guide, objective, k), args)
             for k in args.splits]
    found = [r for r in found if r is not None]
    if found:
        results.record("defaults", _settings(args, dataset, guide, objective, len(found)),
                       grid.summary_figures(found))


def stack_figures(records: list[dict], dataset: str, guide: str, split: int, args) -> dict | None:
    """The stacking of the :data:`STACKED` fits of one split (weights from their held-out
    densities in runs of ``--validation``, else from their PSIS-LOO densities), or ``None``
    until both have side files with finite densities."""
    found = {o: grid.find(records, grid.Run(dataset, guide, o, split), args) for o in STACKED}
    if any(rec is None for rec in found.values()):
        return None
    return pointwise.stack_records(found, args.pointwise_dir)


def record_stack(args, dataset: str, guide: str) -> None:
    """One line of ``defaults.jsonl`` for the :data:`STACK` column over the splits it has."""
    records = uci.read_records(Path(args.out))
    stacked = {k: f for k in args.splits
               if (f := stack_figures(records, dataset, guide, k, args)) is not None}
    if not stacked:
        return
    per_split = list(stacked.values())
    figures = {"splits_run": sorted(stacked), "weights": [f["weights"] for f in per_split],
               "weights_from": per_split[0]["weights_from"], **grid.split_means(per_split)}
    results.record("defaults", _settings(args, dataset, guide, STACK, len(per_split)), figures)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    def on_finished(run: grid.Run) -> None:
        record(args, run.dataset, run.guide, run.objective)
        if run.objective in STACKED:
            record_stack(args, run.dataset, run.guide)

    left = grid.run_grid(plan(args), args, on_finished=on_finished)
    if args.summary_only:
        for ds in args.datasets:
            for g in args.guides:
                for o in args.objectives:
                    record(args, ds, g, o)
                record_stack(args, ds, g)
    print(f"{len(left)} runs left undone" + (": " + ", ".join(
        f"{r.dataset}/{r.guide}/{r.objective}/split {r.split}" for r in left) if left else ""),
        file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
