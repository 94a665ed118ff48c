"""The UCI regression benchmark (Salimbeni and Deisenroth 2017) as a resumable command-line harness.

Protocol by default (Salimbeni & Deisenroth 2017, "Doubly Stochastic Variational Inference
for Deep Gaussian Processes", Salimbeni and Deisenroth 2017): every standard split
(20; protein 5), inputs and targets standardised on the training part, Adam with learning
rate 0.01 for 20,000 iterations, minibatches of 10,000 points or the full training set,
one training sample, M = 100 inducing points, S = 100 samples at test, and scores in the
original units of y: test log-likelihood (= -NLL of the Gaussian mixture), RMSE of the
mixture mean, CRPS and the coverage of the central 95% interval.

Every finished (dataset, layers, guide, objective, split) run is one JSON line of ``--out``
with all its settings; a run already in the file (same settings) is skipped, and a run that
was killed resumes from its checkpoint, so re-issuing an interrupted command continues it.
``--summary`` prints a markdown table of mean (standard error) over the splits beside the
published numbers (:data:`PUBLISHED_LOGLIK`, :data:`PUBLISHED_RMSE`); ``--append FILE``
appends that table to FILE together with the command, the machine and what was run.

Run ``python benchmarks/uci.py --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pointwise
import pyro
import results
import torch
from inits import INITS, MODEL_KEYS, resolve
from machine import cpu_model
from tqdm.auto import tqdm

from pyro_dgp import datasets
from pyro_dgp.gp.avdgp import avdgp_regression
from pyro_dgp.gp.deep_gp import DeepGP
from pyro_dgp.guides import MeanField
from pyro_dgp.guides.registry import GUIDES, make_guide
from pyro_dgp.prediction import predict
from pyro_dgp.prediction.metrics import coverage, crps, nll, rmse
from pyro_dgp.train.checkpoint import safe_load
from pyro_dgp.train.training import TrainingDivergedError, fit

__all__ = [
    "PUBLISHED_SOURCE",
    "PUBLISHED_LOGLIK",
    "PUBLISHED_RMSE",
    "SHORT_NAMES",
    "append_record",
    "build_parser",
    "main",
    "model_label",
    "read_records",
    "run_in_processes",
    "split_indices",
    "summarize",
]

# ------------------------------------------------------------------------ published numbers
PUBLISHED_SOURCE = (
    "Salimbeni & Deisenroth (2017), Doubly Stochastic Variational Inference for Deep Gaussian "
    "Processes, NeurIPS, UCI regression tables (20 splits; Adam 0.01, 20,000 "
    "iterations, minibatch 10,000, M = 100; 'SGP 500': M = 500); as digested in "
    "Salimbeni and Deisenroth 2017. Mean (standard error), original units."
)
"""Where :data:`PUBLISHED_LOGLIK` and :data:`PUBLISHED_RMSE` come from."""

_MODELS = ("SGP", "SGP 500", "DGP 2", "DGP 3", "DGP 4", "DGP 5")


def _table(rows: dict[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
    return {ds: dict(zip(_MODELS, vals, strict=True)) for ds, vals in rows.items()}


PUBLISHED_LOGLIK: dict[str, dict[str, str]] = _table({
    "boston": ("-2.47(0.05)", "-2.40(0.07)", "-2.47(0.05)", "-2.49(0.05)", "-2.48(0.05)",
               "-2.49(0.05)"),
    "concrete": ("-3.18(0.02)", "-3.09(0.02)", "-3.12(0.01)", "-3.13(0.01)", "-3.14(0.01)",
                 "-3.13(0.01)"),
    "energy": ("-1.29(0.02)", "-0.63(0.03)", "-0.73(0.02)", "-0.75(0.02)", "-0.76(0.02)",
               "-0.74(0.02)"),
    "kin8nm": ("0.97(0.00)", "1.15(0.00)", "1.34(0.01)", "1.37(0.01)", "1.38(0.01)",
               "1.38(0.01)"),
    "naval": ("6.57(0.15)", "7.01(0.05)", "6.76(0.19)", "6.62(0.18)", "6.61(0.17)",
              "6.41(0.28)"),
    "power": ("-2.79(0.01)", "-2.75(0.01)", "-2.75(0.01)", "-2.74(0.01)", "-2.74(0.01)",
              "-2.73(0.01)"),
    "protein": ("-2.91(0.00)", "-2.83(0.00)", "-2.81(0.00)", "-2.75(0.00)", "-2.73(0.00)",
                "-2.71(0.00)"),
    "wine_red": ("-0.95(0.01)", "-0.93(0.01)", "-0.95(0.01)", "-0.95(0.01)", "-0.95(0.01)",
                 "-0.95(0.01)"),
})
"""Published test log-likelihood (higher is better): dataset -> model -> "mean(se)"."""

PUBLISHED_RMSE: dict[str, dict[str, str]] = _table({
    "boston": ("2.87(0.15)", "2.73(0.12)", "2.90(0.17)", "2.93(0.16)", "2.90(0.15)",
               "2.92(0.17)"),
    "concrete": ("5.97(0.11)", "5.53(0.12)", "5.61(0.10)", "5.64(0.10)", "5.68(0.10)",
                 "5.65(0.10)"),
    "energy": ("0.78(0.02)", "0.47(0.02)", "0.47(0.01)", "0.48(0.01)", "0.48(0.01)",
               "0.47(0.01)"),
    "kin8nm": ("0.09(0.00)", "0.08(0.00)", "0.06(0.00)", "0.06(0.00)", "0.06(0.00)",
               "0.06(0.00)"),
    "power": ("3.91(0.03)", "3.79(0.03)", "3.79(0.03)", "3.73(0.04)", "3.71(0.04)",
              "3.68(0.03)"),
    "protein": ("4.43(0.03)", "4.10(0.03)", "4.00(0.03)", "3.81(0.04)", "3.74(0.04)",
                "3.72(0.04)"),
    "wine_red": ("0.63(0.01)", "0.62(0.01)", "0.63(0.01)", "0.63(0.01)", "0.63(0.01)",
                 "0.63(0.01)"),
})
"""Published test RMSE (lower is better); naval and yacht have no published RMSE row here."""

SHORT_NAMES: dict[str, str] = {
    "bostonHousing": "boston",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval-propulsion-plant": "naval",
    "power-plant": "power",
    "protein-tertiary-structure": "protein",
    "wine-quality-red": "wine_red",
    "yacht": "yacht",
}
"""UCI folder name -> the short name used in the records and the tables."""

PROTOCOL = {"steps": 20000, "batch_size": 10000, "lr": 0.01, "particles": 1, "samples": 100,
            "inducing": 100}
"""The defaults of Salimbeni and Deisenroth 2017 (all splits as well)."""

_KEY_FIELDS = ("dataset", "layers", "guide", "objective", "split")
_SETTING_FIELDS = ("steps", "batch_size", "lr", "inducing", "hidden_dim", "particles",
                   "samples", "seed", "init", "dtype", "validation", "lr_schedule")


def model_label(layers: int, inducing: int) -> str:
    """The published table's column for a model: ``SGP`` / ``SGP 500`` / ``DGP L``."""
    if layers == 1:
        return "SGP 500" if inducing == 500 else "SGP"
    return f"DGP {layers}"


# ----------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The harness's argument parser."""
    p = argparse.ArgumentParser(
        prog="python benchmarks/uci.py",
        description="UCI regression benchmark of deep GPs (the protocol of Salimbeni and "
        "Deisenroth 2017 by default). Resumable: finished runs in --out are skipped, killed "
        "runs resume from their checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--datasets", nargs="+", default=list(SHORT_NAMES.values()),
                   help="UCI set names or aliases (boston, concrete, energy, kin8nm, naval, "
                   "power, protein, wine_red, yacht)")
    p.add_argument("--layers", nargs="+", type=int, default=[1, 2, 3],
                   help="numbers of GP layers to run (1 = SGP)")
    p.add_argument("--guide", default="meanfield", choices=sorted(GUIDES),
                   help="variational family (pyro_dgp.guides.registry)")
    p.add_argument("--objective", default="auto",
                   choices=["auto", "elbo", "analytic-kl", "meanfield", "renyi", "alpha"],
                   help="SVI objective (pyro_dgp.infer.objectives.make_objective; meanfield: "
                   "the old name of analytic-kl, kept for the records); alpha: the "
                   "local alpha-divergence objective with --alpha and --alpha-samples")
    p.add_argument("--alpha", type=float, default=0.5, help="alpha of --objective alpha")
    p.add_argument("--alpha-samples", type=int, default=10,
                   help="draws per point S of --objective alpha")
    p.add_argument("--particles", type=int, default=PROTOCOL["particles"],
                   help="training samples per step")
    p.add_argument("--splits", nargs="+", default=["all"],
                   help="'all'; one integer n = the first n splits; several integers or "
                   "ranges 'a:b' = those split indices")
    p.add_argument("--steps", type=int, default=PROTOCOL["steps"], help="Adam iterations")
    p.add_argument("--batch-size", type=int, default=PROTOCOL["batch_size"],
                   help="minibatch size (capped at the training set size)")
    p.add_argument("--lr", type=float, default=PROTOCOL["lr"], help="Adam learning rate")
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                   help="constant: the protocol's rate at every step (the initialisation's "
                   "lr_decay where it has one); cosine: fit's default schedule, down to a "
                   "tenth of --lr at the last step")
    p.add_argument("--num-inducing", "--inducing", dest="inducing",
                   type=int, default=PROTOCOL["inducing"],
                   help="inducing points M per layer (capped at N)")
    p.add_argument("--hidden-dim", type=int, default=None,
                   help="inner-layer width (default min(30, D))")
    p.add_argument("--samples", type=int, default=PROTOCOL["samples"],
                   help="S, predictive samples at test")
    p.add_argument("--init", default="package", choices=["package", *sorted(INITS)],
                   help="initialisation: package: the package's defaults (DeepGP.regression and "
                   "the guide's own); the others are benchmarks/inits.py's (dsvi: Salimbeni "
                   "and Deisenroth 2017)")
    p.add_argument("--validation", type=_fraction, default=None, metavar="F",
                   help="hold out a fraction F of each training split (seeded by the run's "
                   "seed), train on the rest and write the held-out points' log densities to "
                   "the side file (stacking weights; benchmarks/pointwise.py)")
    p.add_argument("--device", default="cpu", help="torch device of data, model and guide")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="floating-point type of data, model and guide")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time, each in its own process with one torch thread "
                   "(several processes can share one GPU)")
    p.add_argument("--seed", type=int, default=0,
                   help="base seed; split k uses seed + k (initialisation, SVI, prediction)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's choice)")
    p.add_argument("--data-dir", default=None,
                   help=f"folder holding uci/ (default: ${datasets.ENV_VAR}, then the cache)")
    p.add_argument("--out", default="results.jsonl", help="JSON-lines file of finished runs")
    p.add_argument("--checkpoint-dir", default=None,
                   help="folder of per-run checkpoints (default: <out>.ckpt/); a finished "
                   "run's checkpoint is deleted")
    p.add_argument("--checkpoint-every", type=int, default=500,
                   help="steps between checkpoints")
    p.add_argument("--pointwise-dir", default=None, metavar="DIR",
                   help="write each run's per-point test and PSIS-LOO log densities and its "
                   "predictive components to DIR/<run>.npz (benchmarks/pointwise.py: stacking "
                   "runs without their models)")
    p.add_argument("--summary", action="store_true",
                   help="print a markdown table of this selection beside the published numbers")
    p.add_argument("--no-record", action="store_true",
                   help="do not append the summary to benchmarks/results/uci.jsonl")
    p.add_argument("--append", default=None, metavar="FILE",
                   help="append the summary, command, machine and settings to FILE "
                   "(e.g. BENCHMARKS.md)")
    p.add_argument("--note", default=None,
                   help="free text added under the appended summary")
    p.add_argument("--quiet", action="store_true",
                   help="no per-step progress bar (the bar over runs stays)")
    p.add_argument("--snapshot", default=None, metavar="FILE",
                   help="train nothing: score each unfinished run of this command at its "
                   "latest checkpoint (the state of a run of that many steps, since the "
                   "learning rate is constant) and append the records to FILE")
    p.add_argument("--summary-only", action="store_true",
                   help="run nothing; summarise what --out already holds for this selection")
    return p


# ---------------------------------------------------------------------------------- helpers
def _parse_splits(tokens: list[str], n_available: int) -> list[int]:
    if tokens == ["all"]:
        return list(range(n_available))
    if len(tokens) == 1 and ":" not in tokens[0]:
        count = int(tokens[0])
        if count < 1:
            raise ValueError(f"--splits count must be positive, got {count}")
        return list(range(min(count, n_available)))
    out: list[int] = []
    for tok in tokens:
        if ":" in tok:
            a, b = tok.split(":", 1)
            out.extend(range(int(a or 0), int(b) if b else n_available))
        else:
            out.append(int(tok))
    bad = [k for k in out if not 0 <= k < n_available]
    if bad:
        raise ValueError(f"split indices {bad} out of range (this set has {n_available})")
    return sorted(dict.fromkeys(out))


def split_indices(names: list[str], tokens: str | list[str],
                  data_dir: str | None = None) -> dict[str, list[int]]:
    """``{short name: split indices}`` that ``--splits tokens`` selects for each set."""
    tokens = [tokens] if isinstance(tokens, str) else tokens
    return {_short(n): _parse_splits(tokens, datasets.num_splits(_short(n), data_dir=data_dir))
            for n in names}


def _short(name: str) -> str:
    folder = datasets.resolve_name(name)
    if folder not in SHORT_NAMES:
        raise ValueError(f"{name!r} is not a UCI regression set; choose from "
                         f"{', '.join(SHORT_NAMES.values())}")
    return SHORT_NAMES[folder]


def _settings(args) -> dict:
    return {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
            "inducing": args.inducing, "hidden_dim": args.hidden_dim,
            "particles": args.particles, "samples": args.samples, "seed": args.seed,
            "init": args.init, "device": args.device, "dtype": args.dtype,
            **({"validation": args.validation} if args.validation else {}),
            **({"lr_schedule": args.lr_schedule} if args.lr_schedule != "constant" else {})}


def _run_key(rec: dict) -> tuple:
    settings = rec.get("settings", {})
    return (tuple(rec.get(k) for k in _KEY_FIELDS)
            + tuple(settings.get(k) for k in _SETTING_FIELDS))


def read_records(path: Path) -> list[dict]:
    records = []
    if path.exists():
        with path.open() as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill: that run reruns
                    continue
    return records


def append_record(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as fh:
        # a line cut short by a kill is ended first, so that it does not swallow this one
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write((json.dumps(rec) + "\n").encode())
        fh.flush()
        os.fsync(fh.fileno())


def objective_label(args) -> str:
    """The objective as the records name it: ``alpha=<a>,S=<S>`` for the local alpha
    objective (each alpha its own configuration), else its name."""
    if args.objective == "alpha":
        return f"alpha={args.alpha:g},S={args.alpha_samples}"
    return args.objective


def _objective(args) -> str:
    """``--objective`` as ``fit`` names it (``meanfield``: the records' name of
    ``analytic-kl``)."""
    return "analytic-kl" if args.objective == "meanfield" else args.objective


def _tag(args, short: str, layers: int, split: int) -> str:
    """A run's checkpoint name: every setting that changes what it computes."""
    return (f"{short}_L{layers}_{args.guide}_{objective_label(args)}_s{split}_T{args.steps}"
            f"_B{args.batch_size}_M{args.inducing}_H{args.hidden_dim}_P{args.particles}"
            f"_lr{args.lr:g}_seed{args.seed}_{args.init}"
            + (f"_V{args.validation:g}" if args.validation else "")
            + ("" if args.lr_schedule == "constant" else f"_{args.lr_schedule}"))


def _schedule(args, init: dict) -> dict:
    """``fit``'s learning-rate options of a run: the initialisation's ``lr_decay`` at the
    protocol's constant rate, else ``fit``'s cosine schedule with its default decay."""
    if args.lr_schedule == "constant":
        return {"lr_decay": init["lr_decay"]}
    return {"lr_schedule": args.lr_schedule}


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--validation must lie in (0, 1), got {text}")
    return value


def hold_out(data, fraction: float | None, seed: int):
    """``(data, (X_val, y_val))``: ``data`` without a ``fraction`` of its training points,
    chosen by a permutation seeded by ``seed``, and those points (standardised as ``data``);
    ``(data, None)`` when ``fraction`` is ``None``."""
    if not fraction:
        return data, None
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(data.num_train, generator=g).to(data.X_train.device)
    k = max(1, math.ceil(fraction * data.num_train))
    val, train = order[:k], order[k:]
    return (dataclasses.replace(data, X_train=data.X_train[train], y_train=data.y_train[train]),
            (data.X_train[val], data.y_train[val]))


def _run_one(args, short: str, split: int, layers: int, ckpt_dir: Path) -> tuple[dict, Path]:
    """Fit and score one run; returns its record and its checkpoint path."""
    seed = args.seed + split
    data = datasets.load(short, split=split, data_dir=args.data_dir).to(
        device=args.device, dtype=getattr(torch, args.dtype))
    data, held_out = hold_out(data, args.validation, seed)
    N = data.num_train
    M = min(args.inducing, N)
    B = min(args.batch_size, N)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    package = args.init == "package"
    init = {"lr_decay": 1.0} if package else resolve(args.init)
    if args.guide.startswith("amortized"):  # its own model (Meng and Zhang 2024's defaults)
        if not package:
            raise ValueError(f"--init {args.init} is for the meanfield guide")
        model = avdgp_regression(data.X_train, data.y_train, seed=seed)
    else:
        model = DeepGP.regression(data.X_train, data.y_train, num_layers=layers,
                                  hidden_dim=args.hidden_dim, num_inducing=M, seed=seed,
                                  **{k: init[k] for k in MODEL_KEYS if k in init})
    if package:
        guide = make_guide(args.guide, model)
    elif args.guide == "meanfield":
        guide = MeanField(model, inner_variance=init["inner_variance"])
    elif args.init == "dsvi":
        guide = make_guide(args.guide, model)
    else:
        raise ValueError(f"--init {args.init} is for the meanfield guide")
    ckpt = ckpt_dir / f"{_tag(args, short, layers, split)}.pt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    status, error = "ok", None
    t0 = time.perf_counter()
    try:
        result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps,
                     batch_size=B, lr=args.lr, objective=_objective(args), alpha=args.alpha,
                     num_particles=(args.alpha_samples if args.objective == "alpha"
                                    else args.particles), seed=seed, progress=not args.quiet,
                     checkpoint=ckpt, checkpoint_every=args.checkpoint_every, resume=ckpt.exists(),
                     **_schedule(args, init))
        losses, fit_seconds, resumed_from = result.losses, result.seconds, result.resumed_from
        final_elbo = result.final_elbo
    except TrainingDivergedError as err:  # parameters restored to the last finite step
        status, error = "diverged", str(err)
        state = safe_load(ckpt)
        losses, resumed_from = list(state["losses"]), None
        fit_seconds = float(state.get("seconds", time.perf_counter() - t0))
        tail = losses[-max(1, len(losses) // 10):] or [math.nan]
        final_elbo = -sum(tail) / len(tail)
    t1 = time.perf_counter()
    pred = predict(model, guide, data.X_test, num_samples=args.samples, seed=seed)
    pred = pred.rescale(data.y_mean, data.y_std)
    y = data.y_mean + data.y_std * data.y_test
    test_nll = nll(pred, y)
    metrics = {"test_loglik": -test_nll, "nll": test_nll, "rmse": rmse(pred, y),
               "crps": crps(pred, y), "coverage95": coverage(pred, y, 0.95)}
    predict_seconds = time.perf_counter() - t1
    figures = pointwise.diagnostics(pred, y)
    if args.pointwise_dir:
        side = Path(args.pointwise_dir) / f"{_tag(args, short, layers, split)}.npz"
        try:
            loo_logp = pointwise.loo_log_density(model, guide, data.X_train, data.y_train,
                                                 float(data.y_std), seed)
        except (RuntimeError, ValueError) as err:  # the fit's scores stand without its LOO
            loo_logp = torch.full((N,), math.nan).numpy()
            figures["loo_error"] = f"{type(err).__name__}: {err}"
        val_logp = None if held_out is None else pointwise.held_out_log_density(
            predict(model, guide, held_out[0], num_samples=args.samples, seed=seed).rescale(
                data.y_mean, data.y_std), data.y_mean + data.y_std * held_out[1])
        pointwise.save_run(side, pred, y, loo_logp, val_logp)
        figures["pointwise"] = side.name
    rec = {
        "dataset": short,
        "layers": layers,
        "guide": args.guide,
        "objective": objective_label(args),
        "split": split,
        "model": ("AVDGP" if args.guide.startswith("amortized") else model_label(layers, M)),
        "status": status,
        "settings": {**_settings(args), "batch_size_used": B, "inducing_used": M,
                     "hidden_dim_used": model.layers[0].output_dim if layers > 1 else None,
                     "run_seed": seed, "threads": torch.get_num_threads(),
                     "dtype": str(data.X_train.dtype).replace("torch.", "")},
        "data": {"num_train": N, "num_test": data.num_test, "input_dim": data.input_dim,
                 "num_splits": datasets.num_splits(short, data_dir=args.data_dir)},
        "metrics": metrics,
        "diagnostics": figures,
        "final_elbo": final_elbo,
        "final_elbo_per_point": final_elbo / N,
        "steps_done": len(losses),
        "resumed_from": resumed_from,
        "seconds_fit": fit_seconds,
        "seconds_per_step": fit_seconds / max(1, len(losses)),  # all calls of the run
        "seconds_predict": predict_seconds,
        "seconds": fit_seconds + predict_seconds,
        "versions": {"torch": torch.__version__, "pyro": pyro.__version__,
                     "python": platform.python_version()},
        "cpu": cpu_model(),
        "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if error:
        rec["error"] = error
    return rec, ckpt


def _snapshot_one(args, short: str, split: int, layers: int, ckpt_dir: Path) -> dict | None:
    """Score an unfinished run at its latest checkpoint, without training it or touching its
    checkpoint; ``None`` where it has none.

    The protocol's learning rate is constant and a resumed run replays the minibatch stream
    exactly, so the state after ``k`` of ``T`` steps is the state a ``k``-step run ends in:
    the record is that run's (``settings.steps = k``), with ``snapshot_of_steps = T``.
    """
    src = ckpt_dir / f"{_tag(args, short, layers, split)}.pt"
    if not src.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run.pt"
        shutil.copyfile(src, copy)  # the owner replaces its checkpoint atomically
        step = int(torch.load(copy, weights_only=False)["step"])
        if step == 0:
            return None
        at_step = argparse.Namespace(**{**vars(args), "steps": step})
        copy.rename(Path(tmp) / f"{_tag(at_step, short, layers, split)}.pt")
        rec, _ = _run_one(at_step, short, split, layers, Path(tmp))
    rec["snapshot_of_steps"] = args.steps
    return rec


def run_in_processes(argvs: list[list[str]], jobs: int) -> int:
    """Run ``python uci.py ARGV`` for each ARGV, ``jobs`` at a time, each process with one
    torch thread; returns the number that failed. Each writes its finished run to its
    ``--out`` (one appended line per run, so processes can share a file)."""
    script = str(Path(__file__).resolve())

    def one(argv: list[str]) -> int:
        cmd = [sys.executable, script, *argv, "--threads", "1", "--jobs", "1", "--quiet"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            tqdm.write(f"FAILED ({done.returncode}): {shlex.join(cmd)}\n{done.stderr[-2000:]}",
                       file=sys.stderr)
        else:
            tqdm.write(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "",
                       file=sys.stderr)
        return done.returncode

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(tqdm(pool.map(one, argvs), total=len(argvs), desc="runs", unit="run"))
    return sum(1 for c in codes if c)


# ---------------------------------------------------------------------------------- summary
def _fmt(mean: float, se: float | None, decimals: int | None = None) -> str:
    if not math.isfinite(mean):
        return "nan"
    if decimals is None:
        mag = math.floor(math.log10(abs(mean))) if mean != 0 else 0
        decimals = max(2, 1 - mag)
    se_txt = "—" if se is None or not math.isfinite(se) else f"{se:.{decimals}f}"
    return f"{mean:.{decimals}f}({se_txt})"


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error over splits (``None`` for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def group_by_configuration(records: list[dict]) -> dict[tuple, list[dict]]:
    """``{(dataset, layers, model, guide, objective, steps, batch, M, S, init, particles,
    hidden_dim, lr_schedule): records}`` (``hidden_dim``: as asked, ``None`` for the builder's
    default), one record per split (the last of a split: a rerun of it, or a second process
    on a file)."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        s = rec["settings"]
        key = (rec["dataset"], rec["layers"], rec["model"], rec["guide"], rec["objective"],
               s["steps"], s.get("batch_size_used"), s.get("inducing_used"), s["samples"],
               s.get("init", "dsvi"), s.get("particles", 1), s.get("hidden_dim"),
               s.get("lr_schedule", "constant"))
        groups.setdefault(key, []).append(rec)
    for key, recs in groups.items():  # one record per split: the last (a rerun of it, or a
        by_split = {r["split"]: r for r in recs}  # second process on the same file)
        groups[key] = list(by_split.values())
    return groups


def record_summary(records: list[dict]) -> None:
    """One result line per configuration (``benchmarks/results/uci.jsonl``): mean and
    standard error over the splits run."""
    for key, recs in group_by_configuration(records).items():
        ok = [r for r in recs if r.get("status", "ok") == "ok"]
        if not ok:
            continue
        ds, layers, label, guide, objective, steps, B, M, S, init, particles, hidden, lrs = key
        figures = {"splits": len(ok), "num_splits": ok[0]["data"]["num_splits"]}
        for name in ("test_loglik", "rmse", "crps"):
            figures[name], figures[f"{name}_se"] = mean_se([r["metrics"][name] for r in ok])
        figures["coverage95"] = sum(r["metrics"]["coverage95"] for r in ok) / len(ok)
        figures["s_per_step"] = sum(r["seconds_per_step"] for r in ok) / len(ok)
        settings = {"dataset": ds, "model": label, "guide": guide, "objective": objective,
                    "steps": steps, "batch": B, "inducing": M, "samples": S}
        if init != "dsvi":  # the records before the study: all dsvi, without the key
            settings["init"] = init
        if particles != 1:  # training draws per step (the records without the key: 1)
            settings["particles"] = particles
        if hidden is not None:  # a width asked for (else the builder's default)
            settings["hidden_dim"] = hidden
        if lrs != "constant":  # the records without the key: the protocol's constant rate
            settings["lr_schedule"] = lrs
        for name, default in (("device", "cpu"), ("dtype", "float64")):
            value = ok[0]["settings"].get(name, default)
            if value != default:  # the records before these options: all cpu, float64
                settings[name] = value
        results.record("uci", settings, figures)


def summarize(records: list[dict]) -> str:
    """Markdown table: per dataset and model (and guide, objective, settings), mean (standard
    error over splits) of the test log-likelihood and RMSE beside the published numbers."""
    groups = group_by_configuration(records)
    order = list(SHORT_NAMES.values())
    lines = [
        "| dataset | model | guide | splits | iters | batch | M | S | test log-lik | "
        "published | RMSE | published | CRPS | cover95 | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups, key=lambda k: (order.index(k[0]), k[1], k[3], k[4], k[5])):
        ds, layers, label, guide, objective, steps, B, M, S, init, particles, hidden, lrs = key
        if init != "dsvi":
            guide = f"{guide} ({init})"
        if particles != 1:
            guide = f"{guide}, {particles} draws/step"
        if hidden is not None:
            guide = f"{guide}, width {hidden}"
        recs = sorted(groups[key], key=lambda r: r["split"])
        ok = [r for r in recs if r.get("status", "ok") == "ok"]
        n_div = len(recs) - len(ok)
        if ok:
            ll = _fmt(*mean_se([r["metrics"]["test_loglik"] for r in ok]), decimals=2)
            rm = _fmt(*mean_se([r["metrics"]["rmse"] for r in ok]))
            cr = _fmt(*mean_se([r["metrics"]["crps"] for r in ok]))
            cv = f"{sum(r['metrics']['coverage95'] for r in ok) / len(ok):.3f}"
            sps = f"{sum(r['seconds_per_step'] for r in ok) / len(ok):.3f}"
        else:
            ll = rm = cr = cv = sps = "—"
        splits = f"{len(ok)}/{recs[0]['data']['num_splits']}"
        if n_div:
            splits += f" (+{n_div} diverged)"
        guide_txt = guide if objective == "auto" else f"{guide}, {objective}"
        pub_ll = PUBLISHED_LOGLIK.get(ds, {}).get(label, "—")
        pub_rm = PUBLISHED_RMSE.get(ds, {}).get(label, "—")
        if M != 100 and label != "SGP 500":  # the published SGP and DGPs used M = 100
            pub_ll, pub_rm = (f"{v} (M=100)" if v != "—" else v for v in (pub_ll, pub_rm))
        lines.append(f"| {ds} | {label} | {guide_txt} | {splits} | {steps} | {B} | {M} | {S} | "
                     f"{ll} | {pub_ll} | {rm} | {pub_rm} | {cr} | {cv} | {sps} |")
    return "\n".join(lines)


def _protocol_deviations(args, splits_run: dict[str, list[int]], n_avail: dict[str, int]) -> str:
    dev = []
    short = {ds: f"{len(v)} of {n_avail[ds]}" for ds, v in splits_run.items()
             if len(v) != n_avail[ds]}
    if short:
        dev.append("splits " + ", ".join(f"{ds} {t}" for ds, t in short.items()))
    for name, val in _settings(args).items():
        if name in PROTOCOL and val != PROTOCOL[name]:
            dev.append(f"{name} {val} (protocol {PROTOCOL[name]})")
    return "; ".join(dev) if dev else "none (full protocol)"


def _append_report(path: Path, command: str, table: str, args, splits_run, n_avail,
                   wall: float, note: str | None) -> None:
    new = not path.exists()
    with path.open("a") as fh:
        if new:
            fh.write("# Benchmarks\n\nEvery number in this file was measured by the command "
                     "shown beside it.\n")
        date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        splits_txt = "; ".join(f"{ds}: {_ranges(v)}" for ds, v in splits_run.items())
        fh.write(
            f"\n## UCI regression ({date})\n\n"
            f"Command: `{command}`\n\n"
            f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch threads "
            f"{torch.get_num_threads()}; torch {torch.__version__}, pyro {pyro.__version__}, "
            f"Python {platform.python_version()}\n"
            f"- Run: layers {' '.join(map(str, args.layers))}, guide {args.guide}, objective "
            f"{objective_label(args)}, {args.steps} Adam iterations at lr {args.lr}, minibatch "
            f"min({args.batch_size}, N), M = {args.inducing}, {args.particles} training "
            f"sample(s), S = {args.samples} test samples, seed {args.seed} + split\n"
            f"- Splits: {splits_txt}\n"
            f"- Deviations from the protocol of Salimbeni and Deisenroth 2017: "
            f"{_protocol_deviations(args, splits_run, n_avail)}\n"
            f"- Wall time of this invocation: {wall / 60:.1f} min (finished runs found in "
            f"the results file are not re-run)\n"
            f"- Published columns: {PUBLISHED_SOURCE}\n\n"
            f"{table}\n"
        )
        if note:
            fh.write(f"\n{note}\n")


def _ranges(ks: list[int]) -> str:
    if not ks:
        return "none"
    out, start, prev = [], ks[0], ks[0]
    for k in ks[1:] + [None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if k is not None:
            start = prev = k
    return ",".join(out)


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmark; returns a process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = shlex.join(
        (["python", sys.argv[0]] if argv is None else ["python", "-m", "pyro_dgp.bench.uci"])
        + (sys.argv[1:] if argv is None else list(argv))
    )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.guide not in GUIDES:
        parser.error(f"unknown guide {args.guide!r}")
    t_start = time.perf_counter()
    try:
        names = list(dict.fromkeys(_short(d) for d in args.datasets))
        n_avail = {ds: datasets.num_splits(ds, data_dir=args.data_dir) for ds in names}
        splits_run = split_indices(names, args.splits, args.data_dir)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(str(out) + ".ckpt")
    settings = _settings(args)

    def key_of(ds, layers, split):
        return _run_key({"dataset": ds, "layers": layers, "guide": args.guide,
                         "objective": objective_label(args), "split": split,
                         "settings": settings})

    plan = [(ds, layers, k) for ds in names for layers in args.layers for k in splits_run[ds]]
    selected = {key_of(*p) for p in plan}
    if args.snapshot:
        done = {_run_key(r) for r in read_records(out) if r.get("status") != "failed"}
        records = []
        for ds, layers, k in plan:
            rec = None if key_of(ds, layers, k) in done else _snapshot_one(
                args, ds, k, layers, ckpt_dir)
            if rec is None:
                continue
            append_record(Path(args.snapshot), rec)
            records.append(rec)
            m = rec["metrics"]
            print(f"{ds} {rec['model']} split {k} at step {rec['steps_done']} of "
                  f"{args.steps}: test log-lik {m['test_loglik']:.3f}, RMSE {m['rmse']:.4g}",
                  file=sys.stderr)
        if not records:
            print(f"no unfinished run of this command has a checkpoint in {ckpt_dir}",
                  file=sys.stderr)
        print(summarize(records) if records else "")
        return 0
    if not args.summary_only:
        # finished runs (ok or diverged) are skipped; failed ones are tried again
        done = {_run_key(r) for r in read_records(out) if r.get("status") != "failed"}
        todo = [p for p in plan if key_of(*p) not in done]
        skipped = len(plan) - len(todo)
        if skipped:
            print(f"{skipped} of {len(plan)} runs already in {out}; skipping them",
                  file=sys.stderr)
        if args.jobs > 1 and todo:
            base = list(sys.argv[1:] if argv is None else argv)
            failed = run_in_processes(
                [base + ["--datasets", ds, "--layers", str(layers), "--splits", f"{k}:{k + 1}",
                         "--no-record"] for ds, layers, k in todo], args.jobs)
            if failed:
                print(f"{failed} of {len(todo)} runs failed", file=sys.stderr)
            todo = []
        bar = tqdm(todo, desc="UCI runs", unit="run")
        for ds, layers, k in bar:
            bar.set_postfix_str(f"{ds} L={layers} split={k}")
            try:
                rec, ckpt = _run_one(args, ds, k, layers, ckpt_dir)
            except (RuntimeError, ValueError) as err:  # e.g. a Cholesky failure: record, go on
                rec = {"dataset": ds, "layers": layers, "guide": args.guide,
                       "objective": objective_label(args), "split": k, "status": "failed",
                       "error": f"{type(err).__name__}: {err}", "settings": settings,
                       "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
                append_record(out, rec)
                tqdm.write(f"{ds} L={layers} split {k} FAILED: {rec['error']}", file=sys.stderr)
                continue
            append_record(out, rec)
            ckpt.unlink(missing_ok=True)
            m = rec["metrics"]
            tqdm.write(f"{ds} {rec['model']} split {k}: test log-lik {m['test_loglik']:.3f}, "
                       f"RMSE {m['rmse']:.4g}, {rec['seconds']:.0f} s ({rec['status']})",
                       file=sys.stderr)
        bar.close()
    record = not (args.no_record or args.summary_only)
    if args.summary or args.append or args.summary_only or record:
        records = [r for r in read_records(out)
                   if _run_key(r) in selected and r.get("status") != "failed"]
        table = summarize(records)
        if args.summary or args.append or args.summary_only:
            print(table)
        if record:
            record_summary(records)
        if args.append:
            _append_report(Path(args.append), command, table, args, splits_run, n_avail,
                           time.perf_counter() - t_start, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
