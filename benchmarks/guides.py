"""The guide atlas: every variational family of the package on the eight UCI sets of
Lindinger et al. 2020's Table 1, beside their SGHMC DGP (Havasi et al. 2018) and mean-field
DGP, and the stacked ensemble of those fits (Yao, Vehtari and Gelman 2022) at no extra
training.

Guides (DGP 2, the harness's package initialisation, ``--steps`` Adam steps, batch
``--batch-size``, M = ``--num-inducing``):

- ``meanfield``, ``coupled``, ``chain``: each trained with the ELBO (``auto``) and with the
  local alpha objective at alpha = 1 on split 0; the one with the higher mean PSIS-LOO log
  predictive density on the training points is used on the other splits (a choice that never
  looks at the test points; but an alpha = 1 fit's noise variance can collapse towards zero,
  which makes its PSIS-LOO unreliable or undefined, so the choice leans towards the ELBO:
  ``benchmarks/results/history.md``, "Defaults study and guide atlas"). With ``--validation
  F`` (separate runs, each trained on the rest of its training split) every choice and every
  stack below takes the held-out points' densities instead of PSIS-LOO;
- one semi-implicit variant: ``ssivi``, ``ssivi-iwhvi`` and ``ssivi-discrete`` are run on
  boston split 0 and the one with the highest PSIS-LOO density there is used everywhere;
- ``amortized-ar2pp`` on its own model (``pyro_dgp.gp.avdgp_regression``, three layers,
  Meng and Zhang 2024's widths and inducing points) and ``mixture`` (K = 4), each with its own
  objective;
- ``stacked``: the stacking mixture of the fits above on the same split, weights from their
  training points' PSIS-LOO densities (``benchmarks/pointwise.py``); ``stacked, both
  objectives``: the same over every fit of the split the runs file holds, the objective
  not chosen included (the ELBO's and alpha = 1's fits of each family, and, where
  ``defaults.py`` ran them, the ELBO's with ``fit``'s ten draws per step, ``auto,P=10``, at
  the constant rate and with ``fit``'s cosine schedule, ``--lr-schedule cosine``);
- ``meanfield x5``: the stacked mean-field fits of base seeds 0-4 (the atlas's own mean-field
  fit is seed 0), on the five smallest sets.

Every run goes to ``grid.py``'s shared runs file as it finishes (a run ``defaults.py`` did is
not done again); per (set, guide, split) and per (set, guide) lines go to
``benchmarks/results/guides.jsonl``. Resumable: re-issue the command to continue.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import grid
import pointwise
import results
import uci

DATASETS = ["boston", "energy", "concrete", "wine_red", "kin8nm", "power", "naval", "protein"]
ENSEMBLE_SETS = ["boston", "energy", "concrete", "wine_red", "kin8nm"]
CHOSEN_OBJECTIVE = ("meanfield", "coupled", "chain")
OBJECTIVE_CHOICES = ("auto", "alpha=1")
#: fits the stack of both objectives also takes where the runs file holds them, as
#: ``(objective, learning-rate schedule)``: the ELBO with ``fit``'s default ten draws per
#: step, at the protocol's constant rate and with ``fit``'s cosine schedule
EXTRA_FITS = (("auto,P=10", "constant"), ("auto,P=10", "cosine"))
SEMI_IMPLICIT = ("ssivi", "ssivi-iwhvi", "ssivi-discrete")
CHECK_SET = "boston"
OWN_OBJECTIVE = {"amortized-ar2pp": 3, "mixture": 2}
SEEDS = (1, 2, 3, 4)
STACKED, STACKED_ALL, ENSEMBLE = "stacked", "stacked, both objectives", "meanfield x5"
#: the parts of the atlas ``--guides`` selects
PARTS = (*CHOSEN_OBJECTIVE, "semi-implicit", *OWN_OBJECTIVE, "ensemble")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/guides.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    grid.add_common(p, DATASETS, [0])
    p.add_argument("--guides", nargs="+", default=list(PARTS), choices=list(PARTS),
                   help="the parts of the atlas to run (the records cover whatever the runs "
                   "file holds)")
    return p


# ---------------------------------------------------------------------------- choices
def _best(candidates: dict[str, float]) -> str | None:
    """The key of the highest finite value; ``None`` until every candidate has one."""
    if not candidates or any(math.isnan(v) for v in candidates.values()):
        return None
    return max(candidates, key=candidates.get)


def chosen_objective(records: list[dict], dataset: str, guide: str, args) -> str | None:
    """The objective of ``OBJECTIVE_CHOICES`` with the higher split-0 PSIS-LOO density."""
    runs = {o: grid.find(records, grid.Run(dataset, guide, o, 0), args) for o in OBJECTIVE_CHOICES}
    return _best({o: pointwise.held_out_elpd(rec, args.pointwise_dir) for o, rec in runs.items()})


def chosen_semi_implicit(records: list[dict], args) -> str | None:
    """The semi-implicit variant with the highest PSIS-LOO density on boston split 0."""
    runs = {g: grid.find(records, grid.Run(CHECK_SET, g, "auto", 0), args) for g in SEMI_IMPLICIT}
    return _best({g: pointwise.held_out_elpd(rec, args.pointwise_dir) for g, rec in runs.items()})


def members(records: list[dict], dataset: str, split: int, args) -> dict[str, grid.Run]:
    """The atlas's fits of one set and split by label, as far as their choices are made."""
    out = {}
    for g in CHOSEN_OBJECTIVE:
        objective = chosen_objective(records, dataset, g, args)
        if objective is not None:
            out[g] = grid.Run(dataset, g, objective, split)
    si = chosen_semi_implicit(records, args)
    if si is not None:
        out[si] = grid.Run(dataset, si, "auto", split)
    for g, layers in OWN_OBJECTIVE.items():
        out[g] = grid.Run(dataset, g, "auto", split, layers=layers)
    return out


def seed_members(records: list[dict], dataset: str, split: int, args) -> list[grid.Run]:
    """The mean-field fits of base seeds 0-4 (empty before the objective is chosen or off the
    ensemble's sets)."""
    objective = chosen_objective(records, dataset, "meanfield", args)
    if objective is None or dataset not in ENSEMBLE_SETS:
        return []
    return [grid.Run(dataset, "meanfield", objective, split, seed=s) for s in (0, *SEEDS)]


def choice_runs(dataset: str, split: int, parts=PARTS) -> list[grid.Run]:
    """The runs the choices of ``parts`` need (split 0 only)."""
    if split != 0:
        return []
    runs = [grid.Run(dataset, g, o, 0) for g in CHOSEN_OBJECTIVE for o in OBJECTIVE_CHOICES
            if g in parts or (g == "meanfield" and "ensemble" in parts)]
    if dataset == CHECK_SET and "semi-implicit" in parts:
        runs += [grid.Run(dataset, g, "auto", 0) for g in SEMI_IMPLICIT]
    return runs


def _part(run: grid.Run) -> str:
    return "semi-implicit" if run.guide in SEMI_IMPLICIT else run.guide


# ---------------------------------------------------------------------------- records
def _settings(args, dataset: str, guide: str, objective: str) -> dict:
    return {"dataset": dataset, "guide": guide, "objective": objective, "steps": args.steps,
            "batch": args.batch_size, "inducing": args.num_inducing,
            **grid.settings(args)}


def _run_figures(rec: dict, args) -> dict:
    figures = {k: rec["metrics"][k] for k in ("test_loglik", "rmse", "crps", "coverage95")}
    if rec.get("status") == "diverged":  # scored at the last parameters with a finite loss
        figures["diverged_at"] = rec["steps_done"]
    return {**figures, "seconds": rec["seconds"],
            "loo_elpd": pointwise.held_out_elpd(rec, args.pointwise_dir)}


def split_lines(records: list[dict], dataset: str, split: int, args) -> dict[tuple, dict]:
    """``{(guide, objective): figures}`` of one set and split: each finished member, the
    stack of the members, the stack of every fit of both objectives, the seed ensemble."""
    out = {}
    found = {label: grid.find(records, run, args)
             for label, run in members(records, dataset, split, args).items()}
    found = {label: rec for label, rec in found.items() if rec is not None}
    for label, rec in found.items():
        out[(label, rec["objective"])] = _run_figures(rec, args)
    stacked = pointwise.stack_records(found, args.pointwise_dir)
    if stacked is not None:
        out[(STACKED, "own")] = stacked
    every: dict[str, dict] = {}
    candidates = [(f"{g} {o}", grid.find(records, grid.Run(dataset, g, o, split), args))
                  for g in CHOSEN_OBJECTIVE for o in OBJECTIVE_CHOICES]
    candidates += [(f"{g} {o} {lrs}", grid.find(records, grid.Run(dataset, g, o, split),
                                                 argparse.Namespace(**{**vars(args),
                                                                       "lr_schedule": lrs})))
                   for g in CHOSEN_OBJECTIVE for o, lrs in EXTRA_FITS]
    for label, rec in [*found.items(), *candidates]:
        if rec is not None and all(rec is not r for r in every.values()):
            every[label] = rec
    both = pointwise.stack_records(every, args.pointwise_dir) if len(every) > len(found) else None
    if both is not None:
        out[(STACKED_ALL, "own")] = both
    seeds = [grid.find(records, run, args) for run in seed_members(records, dataset, split,
                                                                   args)]
    if seeds and all(r is not None for r in seeds):
        ensemble = pointwise.stack_records({f"seed {r['settings']['seed']}": r for r in seeds},
                                           args.pointwise_dir)
        if ensemble is not None:
            out[(ENSEMBLE, seeds[0]["objective"])] = ensemble
    return out


def record_set(args, dataset: str) -> None:
    """Per-split lines and per-guide summaries of one set into ``guides.jsonl``, over every
    split the runs file holds for it."""
    records = uci.read_records(Path(args.out))
    by_guide: dict[tuple, list[dict]] = {}
    for k in sorted({r["split"] for r in records if r.get("dataset") == dataset}):
        for (guide, objective), figures in split_lines(records, dataset, k, args).items():
            results.record("guides", {**_settings(args, dataset, guide, objective), "split": k},
                           figures)
            by_guide.setdefault((guide, objective), []).append(figures)
    for (guide, objective), per_split in by_guide.items():
        figures = {"splits": len(per_split), **grid.split_means(per_split)}
        diverged = sum("diverged_at" in f for f in per_split)
        if diverged:
            figures["diverged"] = diverged
        results.record("guides", _settings(args, dataset, guide, objective), figures)


# ------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    slow: set[str] = set()
    left: list[grid.Run] = []
    for k in args.splits:
        for ds in args.datasets:
            before = len(uci.read_records(Path(args.out)))
            left += grid.run_grid(choice_runs(ds, k, args.guides), args, slow=slow)
            records = uci.read_records(Path(args.out))
            todo = [r for r in members(records, ds, k, args).values() if _part(r) in args.guides]
            if "ensemble" in args.guides:
                todo += seed_members(records, ds, k, args)
            left += grid.run_grid(todo, args, slow=slow)
            if args.summary_only or len(uci.read_records(Path(args.out))) > before:
                record_set(args, ds)
    print(f"{len(left)} runs left undone" + (": " + ", ".join(
        f"{r.dataset}/{r.guide}/{r.objective}/split {r.split}/seed {r.seed}" for r in left)
        if left else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
