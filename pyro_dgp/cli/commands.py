"""The commands of the ``pyro-dgp`` command line: ``demo``, ``fit``, ``evaluate``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyro
import torch

from .. import datasets, metrics
from ..gp.deep_gp import DeepGP
from ..guides.protocol import protocol_of
from ..guides.registry import has_local_inducing, make_guide
from ..infer.natgrad import warmup_gamma
from ..infer.objectives import default_num_particles
from ..prediction import predict
from ..train import distributed
from ..train.saved import MODELS, load_fit, model_from_config, read_fit, save_fit
from ..train.threads import num_threads, step_work, threads_for
from ..train.training import fit
from .data import data_spec, evaluate_settings, load_data

__all__ = ["DEFAULT_INDUCING", "DEFAULT_LAYERS", "cmd_demo", "cmd_evaluate", "cmd_fit", "note"]

#: ``pyro-dgp fit``'s defaults of ``--layers`` and ``--num-inducing`` (the DSVI model's)
DEFAULT_LAYERS, DEFAULT_INDUCING = 2, 100


def note(text: str) -> None:
    """A line on stderr for what the command did differently from what was asked."""
    print(f"note: {text}", file=sys.stderr)


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
        threads = _threads(args, model, len(data.y_train))
        with num_threads(threads):
            # fit's default cosine decay of the rate (to a tenth at the last step) lets each
            # fit settle: at a constant 0.02 they kept leaving their optimum to the end, and
            # the table compared them wherever each had fallen
            result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps,
                         lr=0.02, lr_schedule="cosine", seed=args.seed,
                         progress=not args.quiet, threads=threads)
            pred = predict(model, guide, data.X_test, num_samples=100)
            if not args.no_plots and layers > 1:
                _write_diagnostics(model, guide, data, out,
                                   prefix=f"{layers}layer_{guide_name}_")
        row = {"model": label, "guide": guide_name, **_scores(pred, data.y_test, False),
               "elbo/N": result.final_elbo / len(data.y_train),
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        preds[f"{label}, {guide_name}"] = pred
        save_fit(out / f"fit_{layers}layer_{guide_name}.pt", model, guide, config)
    print("Step function, test set of 200 points (lower NLL/RMSE/CRPS is better):")
    print(_table(rows, ["model", "guide", "nll", "rmse", "crps", "coverage95", "elbo/N",
                        "seconds"]))
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    if not args.no_plots:
        _plot_predictions(data, preds, out / "predictions.png")
    print(f"results, fits and plots written to {out}/")
    return 0


def _write_diagnostics(model, guide, data, out: Path, prefix: str) -> None:
    """ArviZ DataTree (NetCDF) and the per-layer diagnostic PNGs that apply to one fit; the
    ones skipped are named on stderr with the reason."""
    from ..diagnostics import (
        MAX_INPUT_PANELS,
        layer_summary,
        plot_diagnostics,
        save_datatree,
        skipped_plots,
        to_datatree,
    )

    grid = None
    if data.X_train.shape[-1] == 1:
        lo, hi = float(data.X_train.min()), float(data.X_train.max())
        grid = torch.linspace(lo, hi, 100, dtype=data.X_train.dtype,
                              device=data.X_train.device).unsqueeze(-1)
    # per-point inducing outputs (amortized layers) have no sample paths: draws per point
    paths = False if has_local_inducing(model) else None
    dt = to_datatree(model, guide, data.X_train, data.y_train, num_samples=100, grid=grid,
                     seed=0, paths=paths)
    save_datatree(dt, out / f"{prefix}datatree.nc")
    written = plot_diagnostics(dt, out, prefix=prefix)
    label = prefix.rstrip("_")
    print(f"{label}: per-layer summary" if label else "per-layer summary")
    print(layer_summary(dt).to_string())
    print(f"wrote {', '.join(path.name for path in written.values())} to {out}/")
    for name, why in skipped_plots(dt).items():
        note(f"plot '{name}' skipped: {why}")
    if data.X_train.shape[-1] > MAX_INPUT_PANELS:
        note(f"the plots against each input show the first {MAX_INPUT_PANELS} of "
             f"{data.X_train.shape[-1]} inputs")


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


def cmd_fit(args) -> int:
    spec = data_spec(args.data, args.target, args.split, args.test_fraction, args.data_dir,
                      args.device, args.dtype, args.seed)
    if args.cuda_graph and not str(spec["device"]).startswith("cuda"):
        raise ValueError(f"--cuda-graph needs --device cuda, not --device {spec['device']}")
    world = launched_processes()
    if world > 1 and spec["device"] == "cuda":  # one GPU per process of the node
        data = load_data({**spec, "device": f"cuda:{os.environ.get('LOCAL_RANK', 0)}"},
                         args.classification)
    else:
        data = load_data(spec, args.classification)
    pyro.set_rng_seed(args.seed)
    if args.batch_size >= data.num_train:
        note(f"--batch-size {args.batch_size} covers all {data.num_train} training points: "
              "full-batch training")
    model_cfg = _model_config(args, data.num_train)
    config = {"model": model_cfg, "guide": args.guide, **spec, "seed": args.seed,
              "samples": args.samples}
    model = model_from_config(model_cfg, data.X_train, data.y_train)
    guide = make_guide(args.guide, model)
    # "auto": an amortized guide's own objective (make_objective)
    training = _training_options(args, guide)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(args.checkpoint) if args.checkpoint else out / "checkpoint.pt"
    B = min(args.batch_size, data.num_train)
    particles = (default_num_particles(args.objective, guide) if args.particles is None
                 else args.particles)
    threads = _threads(args, model, -(-B // world), particles)
    if world > 1:
        distributed.init(args.device, timeout=args.timeout)
    with num_threads(threads):
        result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps,
                     batch_size=B, lr=args.lr, num_particles=particles,
                     seed=args.seed, progress=not args.quiet,
                     checkpoint=checkpoint, resume=args.resume, threads=threads,
                     distributed=world > 1, cuda_graph=args.cuda_graph, **training)
        if world > 1:
            rank = distributed.DataParallel().rank
            distributed.shutdown()
            if rank != 0:  # process 0 writes the fit and its scores
                return 0
            note(f"trained data-parallel on {world} processes (torchrun's WORLD_SIZE)")
        save_fit(out / "fit.pt", model, guide, config)
        scores = _evaluate(model, guide, data, args.samples, args.classification, args.seed)
    scores.update({"final_elbo": result.final_elbo, "seconds": result.seconds})
    (out / "metrics.json").write_text(json.dumps(scores, indent=2))
    print(json.dumps(scores, indent=2))
    print(f"wrote the fit to {out / 'fit.pt'}, its test scores to {out / 'metrics.json'} and "
          f"the checkpoint to {checkpoint} (pyro-dgp evaluate {out / 'fit.pt'} scores it again)")
    return 0


#: the guides of the registry whose q(u) is made of Gaussian blocks with Cholesky factors,
#: which natural-gradient steps update (:class:`~pyro_dgp.infer.natgrad.NaturalGradient`)
NATURAL_GRADIENT_GUIDES = ("meanfield", "meanfield-sampled", "coupled", "coupled-per-point")

#: the step size at which ``--natural-gradient`` starts its warm-up (Salimbeni,
#: Eleftheriadis and Hensman 2018)
NATURAL_GRADIENT_START = 1e-4


def _training_options(args, guide) -> dict:
    """``fit``'s keyword arguments from ``--objective``, ``--alpha`` and
    ``--natural-gradient``.

    :raises ValueError: ``--alpha`` without ``--objective alpha``, or ``--natural-gradient``
        with a guide whose ``q(u)`` natural-gradient steps cannot update, each with the
        reason."""
    options = {"objective": args.objective}
    if args.alpha is not None:
        if args.objective != "alpha":
            raise ValueError(f"--alpha {args.alpha} sets the alpha of --objective alpha, not of "
                             f"--objective {args.objective}: add --objective alpha or drop "
                             "--alpha")
        options["alpha"] = args.alpha
    if args.natural_gradient is not None:
        _check_natural_gradient(args.guide, guide)
        gamma = args.natural_gradient
        # log-linear warm-up from min(1e-4, gamma) to gamma over warmup_gamma's first steps
        options["natural_gradient"] = warmup_gamma(
            gamma, start=min(NATURAL_GRADIENT_START, gamma))
    return options


def _check_natural_gradient(name: str, guide) -> None:
    """Refuse ``--natural-gradient`` for a guide whose ``q(u)`` is not made of Gaussian blocks
    with Cholesky factors (the natural parameters the steps update)."""
    supported = ", ".join(NATURAL_GRADIENT_GUIDES)
    blocks = protocol_of(guide).natural_gradient_blocks()
    if blocks is None:
        raise ValueError(f"--natural-gradient steps a Gaussian q(u) in its natural parameters; "
                         f"--guide {name} ({type(guide).__name__}) has none: use one of "
                         f"{supported}, or train without --natural-gradient")
    try:
        blocks.gaussian_blocks()
    except TypeError as err:  # e.g. a low-rank covariance, not a Cholesky factor
        raise ValueError(f"--natural-gradient does not apply to --guide {name}: {err}; use one "
                         f"of {supported}") from None


def _model_config(args, num_train: int) -> dict:
    """The settings of the model to build (``--model``, a builder of
    :data:`~pyro_dgp.train.saved.MODELS`), saved with the fit
    (:func:`~pyro_dgp.train.saved.model_from_config`): the sizes it takes of ``--layers``,
    ``--num-inducing`` and ``--hidden-dim``; those given that it does not take are noted."""
    builder = MODELS[args.model]
    sizes = {"num_layers": ("--layers", args.layers, args.layers != DEFAULT_LAYERS),
             "num_inducing": ("--num-inducing", min(args.num_inducing, num_train),
                              args.num_inducing != DEFAULT_INDUCING),
             "hidden_dim": ("--hidden-dim", args.hidden_dim, args.hidden_dim is not None)}
    unused = [option for size, (option, _, given) in sizes.items()
              if given and size not in builder.sizes]
    if unused:
        verb = "does" if len(unused) == 1 else "do"
        note(f"{', '.join(unused)} {verb} not apply to --model {args.model}, {builder.about}")
    if "num_inducing" in builder.sizes and args.num_inducing > num_train:
        note(f"--num-inducing {args.num_inducing} is more than the {num_train} training points: "
             f"using M = {num_train} inducing points per layer")
    cfg = {"architecture": args.model}
    cfg.update({size: value for size, (_, value, _) in sizes.items()
                if size in builder.sizes and value is not None})
    cfg["seed"] = args.seed
    if args.kernel_per_output:
        if "kernel_per_output" not in builder.options:
            raise ValueError(f"--kernel-per-output does not apply to --model {args.model}, "
                             f"{builder.about}")
        cfg["kernel_per_output"] = True
    if args.classification:
        cfg["task"] = "classification"
    return cfg


def launched_processes() -> int:
    """The number of processes ``torchrun`` started for this run (``WORLD_SIZE``; 1 when
    started otherwise)."""
    text = os.environ.get("WORLD_SIZE", "1")
    try:
        return max(int(text), 1)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be a number of processes, got {text!r}") from None


def _threads(args, model, batch_size: int, particles: int = 1) -> int | None:
    """``--threads``, else by the problem's size on CPU
    (:func:`pyro_dgp.train.threads.threads_for`), else as is."""
    if args.threads is not None:
        return args.threads
    if next(model.parameters()).device.type != "cpu":
        return None
    return threads_for(step_work(model, batch_size, particles))


def _evaluate(model, guide, data, num_samples, classification, seed=0) -> dict:
    pred = predict(model, guide, data.X_test, num_samples=num_samples, seed=seed)
    if not classification:
        pred = pred.rescale(data.y_mean, data.y_std)
        y = data.y_mean + data.y_std * data.y_test
    else:
        y = data.y_test
    return _scores(pred, y, classification)


def cmd_evaluate(args) -> int:
    saved = read_fit(args.fit, map_location="cpu")
    cfg = saved["config"]
    spec, seed, samples = evaluate_settings(args, cfg)
    classification = cfg["model"].get("task") == "classification"
    data = load_data(spec, classification)
    inputs, have = saved.get("input_dim"), data.X_train.shape[-1]
    if inputs is not None and inputs != have:
        fitted_on = f" ({cfg['data']})" if cfg.get("data") else ""
        raise ValueError(f"the fit has {inputs} inputs, {spec['data']} has {have}: evaluate it "
                         f"on the data it was fitted to{fitted_on}")
    model, guide, cfg = load_fit(args.fit, data.X_train, data.y_train, state=saved)
    # a prediction pass is S x (up to 1024) points
    with num_threads(_threads(args, model, samples * min(1024, len(data.y_test)))):
        scores = _evaluate(model, guide, data, samples, classification, seed)
        print(json.dumps(scores, indent=2))
        if args.plots:
            out = Path(args.plots)
            out.mkdir(parents=True, exist_ok=True)
            _write_diagnostics(model, guide, data, out, prefix="")
    return 0
