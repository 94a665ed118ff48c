"""The ``pyro-dgp`` command line: ``demo``, ``fit``, ``evaluate``. The benchmarks are scripts in
the repository's ``benchmarks/`` folder (``python benchmarks/uci.py --help``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyro
import torch

from . import datasets, metrics
from .gp.deep_gp import DeepGP
from .guides.registry import GUIDES, make_guide
from .infer.checkpoint import load_fit, safe_load, save_fit
from .infer.training import fit
from .prediction import predict

__all__ = ["main"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _scores(pred, y, classification: bool) -> dict[str, float]:
    if classification:
        return {"nll": metrics.nll(pred, y), "accuracy": metrics.accuracy(pred, y),
                "auc": metrics.auc(pred, y)}
    return metrics.regression_report(pred, y)


def _table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(_fmt(r[c]).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


# ------------------------------------------------------------------------------------- demo
def cmd_demo(args) -> int:
    """Fit a GP and two-layer DGPs with two guides to the built-in step function."""
    data = datasets.step(n_train=args.n_train, n_test=200, seed=args.seed)
    runs = [("GP (1 layer)", 1, "meanfield"), ("DGP 2", 2, "meanfield"), ("DGP 2", 2, "automvn")]
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows, preds = [], {}
    for label, layers, guide_name in runs:
        pyro.set_rng_seed(args.seed)
        config = {"model": {"num_layers": layers, "num_inducing": args.num_inducing},
                  "guide": guide_name}
        model = DeepGP.regression(data.X_train, data.y_train, **config["model"])
        guide = make_guide(guide_name, model)
        t0 = time.perf_counter()
        result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps, lr=0.02,
                     seed=args.seed, progress=not args.quiet)
        pred = predict(model, guide, data.X_test, num_samples=100)
        row = {"model": label, "guide": guide_name, **_scores(pred, data.y_test, False),
               "elbo/N": result.final_elbo / len(data.y_train),
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        preds[f"{label}, {guide_name}"] = pred
        save_fit(out / f"fit_{layers}layer_{guide_name}.pt", model, guide, config)
        if not args.no_plots and layers > 1:
            _write_diagnostics(model, guide, data, out, prefix=f"{layers}layer_{guide_name}_")
    print("Step function, test set of 200 points (lower NLL/RMSE/CRPS is better):")
    print(_table(rows, ["model", "guide", "nll", "rmse", "crps", "coverage95", "elbo/N",
                        "seconds"]))
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    if not args.no_plots:
        _plot_predictions(data, preds, out / "predictions.png")
    print(f"results, fits and plots written to {out}/")
    return 0


def _write_diagnostics(model, guide, data, out: Path, prefix: str) -> None:
    """ArviZ DataTree (NetCDF) and per-layer diagnostic PNGs of one fit."""
    from .diagnostics import layer_summary, plot_diagnostics, save_datatree, to_datatree

    grid = None
    if data.X_train.shape[-1] == 1:
        lo, hi = float(data.X_train.min()), float(data.X_train.max())
        grid = torch.linspace(lo, hi, 100, dtype=data.X_train.dtype,
                              device=data.X_train.device).unsqueeze(-1)
    dt = to_datatree(model, guide, data.X_train, data.y_train, num_samples=100, grid=grid,
                     seed=0)
    save_datatree(dt, out / f"{prefix}datatree.nc")
    plot_diagnostics(dt, out, prefix=prefix)
    print(f"{prefix.rstrip('_')}: per-layer summary")
    print(layer_summary(dt).to_string())


def _plot_predictions(data, preds, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = data.X_test.squeeze(-1).cpu()
    order = torch.argsort(x)
    fig, axes = plt.subplots(1, len(preds), figsize=(4 * len(preds), 3.2), sharey=True)
    for ax, (label, pred) in zip(axes, preds.items(), strict=True):
        lo, hi = pred.quantiles([0.025, 0.975]).cpu()
        ax.fill_between(x[order], lo[order], hi[order], alpha=0.3, label="95% interval")
        ax.plot(x[order], pred.mean.cpu()[order], label="mean")
        ax.scatter(data.X_train.squeeze(-1).cpu(), data.y_train.cpu(), s=6, c="k",
                   label="train")
        ax.set_title(label)
    axes[0].legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -------------------------------------------------------------------------------------- fit
# Keys of a saved fit's config that rebuild its data split (besides "model" and "guide"):
#   data           UCI/synthetic name, or the absolute path of a CSV file
#   target         CSV target column (None for named sets, whose target is fixed)
#   split          UCI: index of the standard split; synthetic set / CSV file: the split's seed
#   test_fraction  CSV: fraction of rows held out (None for named sets)
#   data_dir       absolute folder searched first for UCI files (None: $PYRO_DGP_DATA, cache)
#   dtype, device  of the data and model
#   seed           seed of model initialisation, training and prediction
#   samples        predictive samples S behind the reported metrics
_DEFAULT_TEST_FRACTION = 0.1


def _is_csv(data: str) -> bool:
    return str(data).lower().endswith(".csv")


def _data_spec(data, target, split, test_fraction, data_dir, device, dtype, seed) -> dict:
    """Check the data arguments and fill in their defaults; the result is saved with a fit."""
    if _is_csv(data):
        if not target:
            raise ValueError("--target is required with a CSV file (the target column's name)")
        if data_dir is not None:
            raise ValueError("--data-dir is only for UCI sets; give the CSV file's path in --data")
        if test_fraction is not None and not 0 < test_fraction < 1:
            raise ValueError(f"--test-fraction must lie in (0, 1) (the fit is scored on the "
                             f"held-out rows), got {test_fraction}")
        return {"data": str(Path(data).expanduser().resolve()), "target": target,
                "split": int(seed if split is None else split),
                "test_fraction": float(_DEFAULT_TEST_FRACTION if test_fraction is None
                                       else test_fraction),
                "data_dir": None, "device": device, "dtype": dtype}
    if target is not None:
        raise ValueError(f"--target is only for CSV files: {data!r} is a named data set with a "
                         "fixed target column")
    if test_fraction is not None:
        raise ValueError(f"--test-fraction is only for CSV files: {data!r} has fixed train/test "
                         "splits (choose one with --split)")
    if data_dir is None:
        data_dir = os.environ.get(datasets.ENV_VAR) or None
    if data_dir is not None:
        data_dir = str(Path(data_dir).expanduser().resolve())
    return {"data": data, "target": None, "split": int(0 if split is None else split),
            "test_fraction": None, "data_dir": data_dir, "device": device, "dtype": dtype}


def _load_data(spec: dict, classification: bool = False):
    if _is_csv(spec["data"]):
        data = datasets.load_csv(spec["data"], target=spec["target"], seed=spec["split"],
                                 test_fraction=spec["test_fraction"], labels=classification)
    else:
        data = datasets.load(spec["data"], split=spec["split"], data_dir=spec["data_dir"])
    return data.to(device=spec["device"], dtype=_DTYPES[spec["dtype"]])


def cmd_fit(args) -> int:
    spec = _data_spec(args.data, args.target, args.split, args.test_fraction, args.data_dir,
                      args.device, args.dtype, args.seed)
    data = _load_data(spec, args.classification)
    pyro.set_rng_seed(args.seed)
    model_cfg = {"num_layers": args.layers, "num_inducing": min(args.inducing, data.num_train),
                 "seed": args.seed}
    if args.hidden_dim is not None:
        model_cfg["hidden_dim"] = args.hidden_dim
    if args.classification:
        model_cfg["task"] = "classification"
    config = {"model": model_cfg, "guide": args.guide, **spec, "seed": args.seed,
              "samples": args.samples}
    kwargs = {k: v for k, v in model_cfg.items() if k != "task"}
    build = DeepGP.classification if args.classification else DeepGP.regression
    model = build(data.X_train, data.y_train, **kwargs)
    guide = make_guide(args.guide, model)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps,
                 batch_size=args.batch_size, lr=args.lr, objective=args.objective,
                 num_particles=args.particles, seed=args.seed, progress=not args.quiet,
                 checkpoint=args.checkpoint or out / "checkpoint.pt", resume=args.resume)
    save_fit(out / "fit.pt", model, guide, config)
    scores = _evaluate(model, guide, data, args.samples, args.classification, args.seed)
    scores.update({"final_elbo": result.final_elbo, "seconds": result.seconds})
    (out / "metrics.json").write_text(json.dumps(scores, indent=2))
    print(json.dumps(scores, indent=2))
    return 0


def _evaluate(model, guide, data, num_samples, classification, seed=0) -> dict:
    pred = predict(model, guide, data.X_test, num_samples=num_samples, seed=seed)
    if not classification:
        pred = pred.rescale(data.y_mean, data.y_std)
        y = data.y_mean + data.y_std * data.y_test
    else:
        y = data.y_test
    return _scores(pred, y, classification)


def _evaluate_settings(args, cfg: dict) -> tuple[dict, int, int]:
    """``(data spec, seed, samples)``: the fit's saved values, overridden by explicit ones."""
    seed = args.seed if args.seed is not None else cfg.get("seed", cfg["model"].get("seed", 0))
    samples = args.samples if args.samples is not None else cfg.get("samples", 100)
    data = args.data if args.data is not None else cfg.get("data")
    if data is None:
        raise ValueError("--data is required (the fit does not record its data set)")
    # The saved target / split / test fraction / data folder describe the saved data set; they
    # carry over unless --data names another kind of data (a CSV file instead of a named set,
    # or the other way round). Fits saved before these keys existed split a CSV file with
    # their seed (their "split" was unused), so their split is left to default to the seed.
    same_kind = cfg.get("data") is not None and _is_csv(data) == _is_csv(cfg["data"])
    saved = dict(cfg) if same_kind else {}
    if "test_fraction" not in cfg and _is_csv(data):
        saved.pop("split", None)

    def pick(name, default=None):
        value = getattr(args, name)
        return value if value is not None else saved.get(name, default)

    spec = _data_spec(data, pick("target"), pick("split"), pick("test_fraction"),
                      pick("data_dir"),
                      args.device if args.device is not None else cfg.get("device", "cpu"),
                      args.dtype if args.dtype is not None else cfg.get("dtype", "float64"),
                      seed)
    return spec, seed, samples


def cmd_evaluate(args) -> int:
    cfg = safe_load(args.fit, map_location="cpu")["config"]
    spec, seed, samples = _evaluate_settings(args, cfg)
    classification = cfg["model"].get("task") == "classification"
    data = _load_data(spec, classification)
    model, guide, cfg = load_fit(args.fit, data.X_train, data.y_train)
    scores = _evaluate(model, guide, data, samples, classification, seed)
    print(json.dumps(scores, indent=2))
    if args.plots:
        out = Path(args.plots)
        out.mkdir(parents=True, exist_ok=True)
        _write_diagnostics(model, guide, data, out, prefix="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyro-dgp", description="Deep Gaussian processes on Pyro")
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_fit(sub)
    _add_evaluate(sub)
    return p


def _add_demo(sub) -> None:
    d = sub.add_parser("demo", help="fit GP and DGP models with two guides on built-in data")
    d.add_argument("--steps", type=_positive_int, default=1500, help="SVI steps per model")
    d.add_argument("--n-train", type=_positive_int, default=100, help="training points")
    d.add_argument("--num-inducing", type=_positive_int, default=20)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--output", default="out/demo", help="folder for results, fits, plots")
    d.add_argument("--no-plots", action="store_true")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)


def _data_args(q, for_fit: bool) -> None:
    """The options that say which data a fit is of (saved with the fit; ``evaluate`` reads
    them from it unless given)."""
    saved = "" if for_fit else " (default: the fit's)"
    q.add_argument("--data", required=for_fit,
                   help="a UCI name (boston, energy, ...), a built-in set, or a CSV path"
                        + saved)
    q.add_argument("--target",
                   help="target column of a CSV file (required for CSV, an error for "
                        "named sets, whose target is fixed)" + saved)
    q.add_argument("--split", type=int, default=None,
                   help="which train/test split: for a UCI set the index of the standard "
                        "split (default 0), for a built-in set its seed, for a CSV file "
                        "the seed of its random split (default: --seed)" + saved)
    q.add_argument("--test-fraction", type=float, default=None,
                   help="CSV files only: fraction of rows held out for testing (default "
                        f"{_DEFAULT_TEST_FRACTION})" + saved)
    q.add_argument("--data-dir",
                   help="folder with uci/ (default: $PYRO_DGP_DATA, cache)" + saved)
    q.add_argument("--device", default="cpu" if for_fit else None,
                   help="torch device (default cpu)" + saved)
    q.add_argument("--dtype", choices=sorted(_DTYPES),
                   default="float64" if for_fit else None,
                   help="floating-point type (default float64)" + saved)
    q.add_argument("--samples", type=_positive_int, default=100 if for_fit else None,
                   help="predictive samples S (default 100)" + saved)
    q.add_argument("--seed", type=int, default=0 if for_fit else None,
                   help="seed of initialisation, training and prediction (default 0)"
                        + saved)


def _add_fit(sub) -> None:
    f = sub.add_parser("fit", help="fit a DGP to a UCI set or a CSV file")
    _data_args(f, for_fit=True)
    f.add_argument("--layers", type=_positive_int, default=2)
    f.add_argument("--hidden-dim", type=_positive_int)
    f.add_argument("--inducing", type=_positive_int, default=100)
    f.add_argument("--guide", choices=sorted(GUIDES), default="meanfield")
    f.add_argument("--objective", choices=["auto", "elbo", "meanfield", "renyi"],
                   default="auto",
                   help="auto: the analytic-KL ELBO where the guide factorises like the "
                        "model, else Trace_ELBO; renyi: RenyiELBO(alpha=0.5), with a guide "
                        "that samples u (meanfield-sampled or an auto* guide)")
    f.add_argument("--particles", type=_positive_int, default=1)
    f.add_argument("--steps", type=_positive_int, default=20000)
    f.add_argument("--batch-size", type=_positive_int, default=10000)
    f.add_argument("--lr", type=_positive_float, default=0.01)
    f.add_argument("--classification", action="store_true")
    f.add_argument("--checkpoint", help="checkpoint file (default OUTPUT/checkpoint.pt)")
    f.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    f.add_argument("--output", default="out/fit")
    f.add_argument("--quiet", action="store_true")
    f.set_defaults(func=cmd_fit)


def _add_evaluate(sub) -> None:
    e = sub.add_parser(
        "evaluate", help="score a saved fit on its test split",
        description="Score a saved fit on the test split it was fitted with. The data set, "
                    "split, dtype, device, seed and number of samples are read from the fit; "
                    "an argument given here overrides the saved value.")
    e.add_argument("fit", help="fit.pt written by 'pyro-dgp fit'")
    _data_args(e, for_fit=False)
    e.add_argument("--plots", metavar="DIR",
                   help="also write the ArviZ DataTree and per-layer diagnostic PNGs here")
    e.set_defaults(func=cmd_evaluate)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
