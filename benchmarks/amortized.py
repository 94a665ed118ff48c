"""Amortized variational inference for deep GPs (AVDGP, Meng and Zhang 2024) against DS-DGP
mean-field on the same splits, and AVDGP's time per epoch on large synthetic sets.

The paper's setup (Meng and Zhang 2024, App. C.1): three layers ``D -> 16 -> 4 -> 1``,
isotropic Matern-5/2 kernels, Adam with learning rate 0.005, minibatches of 100, 100 epochs,
standardised inputs and targets. AVDGP: ``M = 8, 4, 4`` per-point inducing points
(``pyro_dgp.gp.avdgp_regression``), zero means, ``S = 32`` paths (AR2P: 32 learned quadrature
nodes), the per-point KL weighted by ``1/N`` (their App. A; ``--kl-weight``). DS-DGP:
``M = 256, 128, 128`` global inducing points (k-means), learned linear means of the inner
layers (identity/PCA start), the collapsed mean-field guide (Salimbeni and Deisenroth 2017),
``S = 32`` samples per step and at test. Scores on the test part, in standardised units:
NLL of the predictive mixture (AR2P/AR2PP: the weighted mixture over the nodes), RMSE of its
mean, CRPS. Splits: the standard UCI splits (90/10, Salimbeni and Deisenroth 2017), not the
paper's five random 8:1:1 splits.

Every finished (dataset, method, split) run is one JSON line of ``--out`` (a run already there
with the same settings is skipped, so an interrupted grid continues where it stopped); then
one line per (dataset, method) with the mean (standard error) over the splits is appended to
``benchmarks/results/amortized.jsonl`` (``--no-record``: not), and per synthetic size one line
with AVDGP's time per epoch (``--speed-sizes``; the epoch is ``N / B`` steps, so its time must
grow linearly in ``N``). ``python benchmarks/report.py`` renders them into BENCHMARKS.md.

A run writes a checkpoint at the end of every epoch (parameters, Adam's moments, every random
stream, the epoch times) to ``--checkpoint-dir`` (default ``<out>.ckpt/``), named by the run's
settings; a killed run, re-issued with the same settings, continues from its last finished
epoch exactly, and a finished run's checkpoint is deleted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import pyro
import results
import torch
from tqdm.auto import tqdm
from uci import append_record, mean_se, read_records

from pyro_dgp import datasets
from pyro_dgp.gp.architectures import LN2, default_dtype, kmeans, pca_mean
from pyro_dgp.gp.avdgp import avdgp_regression
from pyro_dgp.gp.deep_gp import DeepGP
from pyro_dgp.gp.layer import GPLayer
from pyro_dgp.guides import Amortized, MeanField
from pyro_dgp.infer.amortized import AmortizedELBO
from pyro_dgp.infer.objectives import make_objective
from pyro_dgp.kernels import Matern52
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import predict
from pyro_dgp.prediction.metrics import crps, nll, rmse
from pyro_dgp.train.checkpoint import atomic_save, rng_state, safe_load, set_rng_state

METHODS = ("dsdgp", "ar1", "ar2", "ar2p", "ar2pp")
DATASETS = {"energy": "energy", "kin8nm": "kin8nm", "power": "power-plant",
            "protein": "protein-tertiary-structure"}
_RUN_KEYS = ("epochs", "batch", "lr", "paths", "test_samples", "dsdgp_particles", "widths",
             "avdgp_inducing", "dsdgp_inducing", "kl_weight", "offset_scale", "inner_scale",
             "seed", "device", "dtype")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/amortized.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--methods", nargs="+", default=["dsdgp", "ar2p", "ar2pp"], choices=METHODS)
    p.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2],
                   help="indices of the standard UCI splits (default 0 1 2)")
    p.add_argument("--epochs", type=int, default=100, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.005, help="Adam's learning rate")
    p.add_argument("--paths", type=int, default=32, help="S: AVDGP paths (AR2P nodes)")
    p.add_argument("--test-samples", type=int, default=32,
                   help="predictive samples of DS-DGP, AR1 and AR2 (AR2P/AR2PP: the nodes)")
    p.add_argument("--dsdgp-particles", type=int, default=32,
                   help="DS-DGP samples per step (the paper's S = 32)")
    p.add_argument("--widths", type=int, nargs="+", default=[16, 4], help="inner widths")
    p.add_argument("--avdgp-inducing", type=int, nargs="+", default=[8, 4, 4])
    p.add_argument("--dsdgp-inducing", type=int, nargs="+", default=[256, 128, 128])
    p.add_argument("--kl-weight", choices=["one", "1/N"], default="1/N",
                   help="AVDGP's per-point KL weight (1/N: Meng and Zhang 2024, App. A)")
    p.add_argument("--offset-scale", type=float, default=None,
                   help="AVDGP's offsets b: about this many lengthscales from each input "
                   "(avdgp_regression's offset_scale; default: its default); 0: standard "
                   "normal offsets (Meng and Zhang 2024)")
    p.add_argument("--inner-scale", type=float, default=None,
                   help="AVDGP's initial scale of the inner layers' q(u_n) (Amortized's "
                   "inner_scale; default: its default)")
    p.add_argument("--speed-sizes", type=int, nargs="*", default=[100_000, 1_000_000],
                   help="synthetic N for AVDGP's (AR2P) time per epoch; none: skip")
    p.add_argument("--speed-epochs", type=int, default=1, help="epochs timed per size")
    p.add_argument("--speed-only", action="store_true", help="only the synthetic timings")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--seed", type=int, default=0, help="split k uses seed + k")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--data-dir", default=None, help="folder with uci/ (default $PYRO_DGP_DATA)")
    p.add_argument("--out", default="amortized_runs.jsonl", help="JSON lines of finished runs")
    p.add_argument("--checkpoint-dir", default=None,
                   help="folder of per-run checkpoints, one per epoch (default: <out>.ckpt/); "
                   "a finished run's checkpoint is deleted")
    p.add_argument("--no-record", action="store_true",
                   help="append nothing to benchmarks/results/amortized.jsonl")
    p.add_argument("--quiet", action="store_true", help="no per-epoch progress bar")
    return p


# ----------------------------------------------------------------------------------- models
def dsdgp_model(X: torch.Tensor, y: torch.Tensor, widths, Ms, seed: int) -> DeepGP:
    """DS-DGP as Meng and Zhang 2024 ran it: learned linear means of the inner layers
    (identity/PCA start), each layer's inducing inputs k-means of its input (the data carried
    through the means' starts), isotropic Matern-5/2, zero mean in the last layer."""
    dims = [X.shape[-1], *widths, 1]
    H, layers = X.detach(), []
    with default_dtype(X.dtype):
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            last = i == len(dims) - 2
            mean = "zero" if last else pca_mean(H, d_out)
            Z = kmeans(H, min(Ms[i], len(H)), seed)
            layers.append(GPLayer(d_in, d_out, inducing_points=Z, mean=mean,
                                  kernel=Matern52(d_in, variance=LN2, lengthscale=LN2, ard=False),
                                  train_mean=not last, name=f"layer{i + 1}"))
            if not last:
                H = H @ mean
        model = DeepGP(layers, Gaussian(LN2), num_data=X.shape[-2])
    return model.to(device=X.device, dtype=X.dtype)


def build(method: str, X, y, args, seed: int):
    """``(model, guide, objective, test samples)`` of one method."""
    if method == "dsdgp":
        model = dsdgp_model(X, y, args.widths, args.dsdgp_inducing, seed)
        guide = MeanField(model)
        objective = make_objective("analytic-kl", guide, num_particles=args.dsdgp_particles)
        return model, guide, objective, args.test_samples
    offsets = {} if args.offset_scale is None else {"offset_scale": args.offset_scale or None}
    scale = {} if args.inner_scale is None else {"inner_scale": args.inner_scale}
    model = avdgp_regression(X, y, hidden_dims=args.widths, num_inducing=args.avdgp_inducing,
                             kl_weight=args.kl_weight, seed=seed, **offsets)
    guide = Amortized(model, rule=method.upper(), num_paths=args.paths, **scale)
    return model, guide, AmortizedELBO(), args.test_samples


# --------------------------------------------------------------------------------- training
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, guide, objective, X, y, args, seed: int, epochs: int, desc: str,
          checkpoint: Path | None = None):
    """Adam on shuffled minibatches of ``args.batch_size`` for ``epochs`` passes (each point
    once per epoch); returns the seconds of each epoch, the last epoch's mean loss/point and
    the epoch training resumed from (``None``: from the start).

    ``checkpoint``: a file written at the end of every epoch; where it exists, training
    continues from it (the epochs it holds are not run again)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    N, B = X.shape[-2], min(args.batch_size, X.shape[-2])
    model.num_data = N
    optim = pyro.optim.Adam({"lr": args.lr})
    svi = pyro.infer.SVI(model, guide, optim, objective)
    gen = torch.Generator(device=X.device).manual_seed(seed)
    seconds, loss, resumed_from = [], math.nan, None
    if checkpoint is not None and checkpoint.exists():
        seconds, loss = _resume(checkpoint, model, guide, optim, gen, X, y)
        resumed_from = len(seconds)
    bar = tqdm(range(len(seconds), epochs), desc=desc, disable=args.quiet, leave=False)
    with pyro.validation_enabled(False):
        for _ in bar:
            _sync(X.device)
            t0, total = time.perf_counter(), 0.0
            for idx in torch.randperm(N, generator=gen, device=X.device).split(B):
                total += svi.step(X[idx], y[idx])
            _sync(X.device)
            seconds.append(time.perf_counter() - t0)
            loss = total / math.ceil(N / B) / N
            bar.set_postfix(loss=f"{loss:.4f}/pt", s=f"{seconds[-1]:.1f}")
            if checkpoint is not None:
                checkpoint.parent.mkdir(parents=True, exist_ok=True)
                atomic_save(checkpoint, {
                    "model": model.state_dict(), "guide": guide.state_dict(),
                    "optimizer": _adam_state(optim, model, guide),
                    "rng": rng_state(gen, X.device), "seconds": seconds, "loss": loss})
    return seconds, loss, resumed_from


def _store_names(model, guide) -> dict[str, str]:
    """Param-store name -> the parameter's name in ``model.`` or ``guide.``; the store's names
    carry a per-instance suffix (``DeepGP_1``) that differs between processes."""
    store, names = pyro.get_param_store(), {}
    for prefix, module in (("model", model), ("guide", guide)):
        for key, param in module.named_parameters():
            name = store.param_name(param)
            if name is not None:
                names.setdefault(name, f"{prefix}.{key}")
    return names


def _adam_state(optim, model, guide) -> dict:
    """Adam's moments of every parameter, by its name in ``model.`` or ``guide.``."""
    names = _store_names(model, guide)
    return {names[name]: state for name, state in optim.get_state().items()}


def _resume(path: Path, model, guide, optim, gen, X, y) -> tuple[list[float], float]:
    """Load a checkpoint of :func:`train` into the model, guide, optimiser and random streams;
    returns its epoch times and last loss per point."""
    state = safe_load(path, map_location=X.device)
    with torch.no_grad():  # creates the lazily-built parameters and enters all in the store
        guide_trace = pyro.poutine.trace(guide).get_trace(X[:2], y[:2])
        pyro.poutine.replay(model, trace=guide_trace)(X[:2], y[:2])
    model.load_state_dict(state["model"])
    guide.load_state_dict(state["guide"])
    by_key = {key: name for name, key in _store_names(model, guide).items()}
    # Adam's moments, taken up by each parameter's optimiser at its first step
    optim.set_state({by_key[key]: moments for key, moments in state["optimizer"].items()})
    set_rng_state(state["rng"], gen, X.device)  # last: the calls above drew from the streams
    return list(state["seconds"]), float(state["loss"])


def checkpoint_path(args, name: str, method: str, split: int) -> Path:
    """A run's checkpoint file, named by the run and a digest of the settings it computes with."""
    folder = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(f"{args.out}.ckpt")
    digest = hashlib.sha1(json.dumps(_settings(args), sort_keys=True).encode()).hexdigest()
    return folder / f"{name}_{method}_s{split}_{digest[:12]}.pt"


def _epoch_time(seconds: list[float]) -> float:
    """Mean seconds per epoch, leaving out the first (warm-up) where there are more."""
    timed = seconds[1:] if len(seconds) > 1 else seconds
    return sum(timed) / len(timed)


def run_one(args, name: str, method: str, split: int) -> dict:
    """Fit one method on one split and score it; the record of ``--out``."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    data = datasets.load(DATASETS[name], split=split, data_dir=args.data_dir,
                         dtype=dtype, device=device)
    seed = args.seed + split
    pyro.set_rng_seed(seed)
    model, guide, objective, S = build(method, data.X_train, data.y_train, args, seed)
    seconds, loss, resumed_from = train(model, guide, objective, data.X_train, data.y_train,
                                        args, seed, args.epochs, f"{name} {method} split {split}",
                                        checkpoint_path(args, name, method, split))
    pred = predict(model, guide, data.X_test, num_samples=S, seed=seed)
    return {"dataset": name, "method": method, "split": split, "settings": _settings(args),
            "num_train": data.num_train, "num_test": data.num_test,
            "nll": nll(pred, data.y_test), "rmse": rmse(pred, data.y_test),
            "crps": crps(pred, data.y_test), "components": pred.num_samples,
            "final_loss_per_point": loss, "s_per_epoch": _epoch_time(seconds),
            "epoch_seconds": seconds, "resumed_from_epoch": resumed_from,
            "threads": torch.get_num_threads()}


def _settings(args) -> dict:
    return {"epochs": args.epochs, "batch": args.batch_size, "lr": args.lr,
            "paths": args.paths, "test_samples": args.test_samples,
            "dsdgp_particles": args.dsdgp_particles, "widths": list(args.widths),
            "avdgp_inducing": list(args.avdgp_inducing),
            "dsdgp_inducing": list(args.dsdgp_inducing), "kl_weight": args.kl_weight,
            "offset_scale": args.offset_scale, "inner_scale": args.inner_scale,
            "seed": args.seed, "device": args.device, "dtype": args.dtype}


# ------------------------------------------------------------------------------- speed test
def synthetic(N: int, D: int, seed: int, device, dtype):
    """``N`` standard normal inputs in ``D`` dims, ``y = sin(sum x / sqrt D) + noise 0.1``."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=dtype)
    y = torch.sin(X.sum(-1) / math.sqrt(D)) + 0.1 * torch.randn(N, generator=g, dtype=dtype)
    return X.to(device), y.to(device)


def speed_one(args, N: int) -> dict:
    """AVDGP (AR2P) epochs on ``N`` synthetic points of 8 inputs (as kin8nm)."""
    X, y = synthetic(N, 8, args.seed, torch.device(args.device), getattr(torch, args.dtype))
    pyro.set_rng_seed(args.seed)
    model, guide, objective, _ = build("ar2p", X, y, args, args.seed)
    seconds, _, _ = train(model, guide, objective, X, y, args, args.seed, args.speed_epochs,
                          f"synthetic N={N}")
    steps = math.ceil(N / min(args.batch_size, N))
    return {"s_per_epoch": sum(seconds) / len(seconds), "steps_per_epoch": steps,
            "ms_per_step": 1000 * sum(seconds) / len(seconds) / steps,
            "epochs_timed": len(seconds)}


# ---------------------------------------------------------------------------- bookkeeping
def _key(rec: dict) -> tuple:
    s = rec["settings"]
    return (rec["dataset"], rec["method"], rec["split"],
            *(json.dumps(s.get(k)) for k in _RUN_KEYS))


def record_summary(args, runs: list[dict]) -> None:
    """One line per (dataset, method): mean (standard error) over the splits run."""
    groups: dict[tuple, list[dict]] = {}
    for rec in runs:
        groups.setdefault((rec["dataset"], rec["method"]), []).append(rec)
    for (name, method), recs in groups.items():
        figures = {"splits": len(recs),
                   "num_splits": datasets.num_splits(DATASETS[name], data_dir=args.data_dir)}
        for field in ("nll", "rmse", "crps"):
            figures[field], figures[f"{field}_se"] = mean_se([r[field] for r in recs])
        figures["s_per_epoch"] = sum(r["s_per_epoch"] for r in recs) / len(recs)
        settings = {"dataset": name, "N": recs[0]["num_train"], "method": method,
                    **_table_settings(args)}
        results.record("amortized", settings, figures)


def _table_settings(args) -> dict:
    return {"epochs": args.epochs, "batch": args.batch_size, "paths": args.paths,
            "device": args.device, "dtype": args.dtype, "kl_weight": args.kl_weight,
            "offset_scale": args.offset_scale, "inner_scale": args.inner_scale}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if not args.speed_only:
        done = {_key(r) for r in read_records(out)}
        plan = [(d, m, k) for d in args.datasets for m in args.methods for k in args.splits]
        for name, method, split in tqdm(plan, desc="runs", unit="run"):
            probe = {"dataset": name, "method": method, "split": split,
                     "settings": _settings(args)}
            if _key(probe) in done:
                continue
            rec = run_one(args, name, method, split)
            append_record(out, rec)
            checkpoint_path(args, name, method, split).unlink(missing_ok=True)
            tqdm.write(f"{name} {method} split {split}: NLL {rec['nll']:.3f}, RMSE "
                       f"{rec['rmse']:.3f}, CRPS {rec['crps']:.3f}, "
                       f"{rec['s_per_epoch']:.2f} s/epoch", file=sys.stderr)
        wanted = {_key({"dataset": d, "method": m, "split": k, "settings": _settings(args)})
                  for d, m, k in plan}
        runs = [r for r in read_records(out) if _key(r) in wanted]
        if runs and not args.no_record:
            record_summary(args, runs)
    for N in args.speed_sizes:
        figures = speed_one(args, N)
        tqdm.write(f"synthetic N={N}: {figures['s_per_epoch']:.1f} s/epoch, "
                   f"{figures['ms_per_step']:.2f} ms/step", file=sys.stderr)
        if not args.no_record:
            results.record("amortized", {"dataset": "synthetic", "N": N, "method": "ar2p",
                                         **_table_settings(args), "epochs": args.speed_epochs},
                           figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
