"""Semi-implicit guides against the gold standard, and on UCI.

Two parts, each recorded in ``benchmarks/results/semi_implicit.jsonl``:

``--part toys``
    On small 2-layer DGPs with the hyperparameters held fixed (``pyro_dgp.gold``), NUTS on
    ``q*(U)`` (the ELBO's optimal ``q(U)``) and every guide trained on the same model (mean-field,
    Coupled, Chain, SIVI, SSIVI): per guide the distances of its predictive of ``f`` to NUTS's on
    a grid (mean absolute difference of the means and of the log variances, mean 1-Wasserstein
    distance of the marginals), its ELBO (the surrogate bound ``L_K`` for SIVI/SSIVI) and its
    seconds per step; ``w1_layer1``, the same 1-Wasserstein distance for the first layer's
    ``f^1`` on the grid (NUTS's draws pooled over its chains, each chain weighing the same);
    on the two-mode toy also the mass of each mode in the first layer at ``x* = 1``. (There
    the predictive of ``f`` is the same in both modes, so only the first layer tells them
    apart.) Toys: the seven-point toy of Havasi et al. 2018 (``gold.two_mode_model``), and the
    compositional toy of Ustyuzhaninov et al. 2020 (SE warp then a periodic layer, the model of
    ``benchmarks/compositional.py``) at a size NUTS can sample (``--comp-train`` points,
    ``--comp-inducing`` inducing inputs per layer, fixed). The issue's "step toy of
    Ustyuzhaninov et al. 2020" is taken as that paper's compositional toy, the only
    one-dimensional toy it fits (an SE warp then a periodic layer, its §5 and Fig. 5; it has
    no step-function toy), while step-shaped data (``y = sign(x)``) are the seven-point toy of
    Havasi et al. 2018 above. One figure per toy under ``docs/``:
    each guide's predictive (and first layer) beside NUTS's. ``ssivi-tril`` is SSIVI with
    correlated components (``SemiImplicit(component_scale="tril")``). The amortized guides
    need a model of ``AmortizedGPLayer``\\ s, another prior, so they have no place beside this
    gold standard.

``--part uci``
    SSIVI against MeanField on boston and energy (``--uci-guides``: also ``ssivi-tril``), DGP 2,
    through ``benchmarks/uci.py`` (its runs, its protocol apart from the step count; its
    per-run records go to ``--work-dir``),
    one line per dataset and guide: test log-likelihood and RMSE, mean (standard error) over
    the splits; where every split's loss became NaN, the scores at the last finite step
    (``*_at_divergence``) and the steps reached (``nan_at_steps``).

Run: ``python benchmarks/semi_implicit.py --part toys uci``; ``--help`` for the settings.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pyro
import results
import torch
from tqdm.auto import tqdm

from pyro_dgp import gold
from pyro_dgp.guides import SemiImplicit
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.prediction import predict
from pyro_dgp.train.training import TrainingDivergedError, fit

__all__ = ["EXTRA_GUIDES", "GUIDES", "build_parser", "main", "run_toy"]

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64

#: the guides compared, by registry name (``pyro_dgp.guides.registry``; the semi-implicit
#: ones at the paper's settings: K = 100, 100-dimensional noise, three hidden layers of 100;
#: ``ssivi-tril`` with correlated components)
GUIDES = ("meanfield", "coupled", "chain", "sivi", "ssivi", "ssivi-tril")
#: further choices of ``--guides``: the other options of ``SemiImplicit`` (registered names),
#: and ``ssivi-init`` / ``ssivi-tril-init``, SSIVI (diagonal / correlated components) started
#: at a MeanField guide trained first on the same model for the same steps
#: (``SemiImplicit(init_from=...)``; its ``s_per_step`` is SSIVI's alone)
EXTRA_GUIDES = ("ssivi-iwhvi", "ssivi-discrete", "ssivi-init", "ssivi-tril-init")
#: the ``SemiImplicit`` options of the ``*-init`` guides
_STARTED = {"ssivi-init": {}, "ssivi-tril-init": {"component_scale": "tril"}}
#: the guides of the UCI part
UCI_GUIDES = ("meanfield", "ssivi", "ssivi-tril")


# ----------------------------------------------------------------------------------- toys
def _compositional_model(n_train: int, inducing: int, noise: float, variance: float,
                         device):
    """The compositional toy (``noise``: the data's standard deviation) and the model of
    ``benchmarks/compositional.py`` (``build_model``: SE warp with identity mean, periodic
    layer of period 1) with ``inducing`` inputs per layer and the likelihood's variance
    ``variance``, at its initial hyperparameters, which the comparison holds fixed."""
    from compositional import build_model

    from pyro_dgp import datasets
    data = datasets.compositional_toy(n_train=n_train, noise=noise, device=device)
    model = build_model(data.X_train, data.y_train, "fixed", M=inducing)
    model.likelihood.variance = data.X_train.new_tensor(variance)
    return model.to(device=device), data.X_train, data.y_train


def _toy(name: str, args):
    """``(model, X, y, grid)`` of the toy ``name``."""
    if name == "two_mode":
        model, X, y = gold.two_mode_model(noise=args.two_mode_noise, device=args.device)
        grid = torch.linspace(-1.5, 1.5, args.grid, dtype=DT, device=args.device)
    else:
        model, X, y = _compositional_model(args.comp_train, args.comp_inducing, args.comp_noise,
                                           args.comp_variance, args.device)
        grid = torch.linspace(-1.0, 1.0, args.grid, dtype=DT, device=args.device)
    return model, X, y, grid.unsqueeze(-1)


def run_toy(name: str, args, progress: bool = True) -> list[tuple[dict, dict]]:
    """NUTS and every guide of ``args.guides`` on the toy ``name``: one record each, and the
    figure. Returns the records (settings, figures)."""
    model, X, y, grid = _toy(name, args)
    x_star = X.new_tensor([[gold.TWO_MODE_INPUT]])
    noise = round(float(model.likelihood.variance.detach()), 12)
    common = {"toy": name, "n_train": X.shape[0], "noise": noise, "device": str(args.device)}
    t0 = time.perf_counter()
    # the ELBO's optimum q*(U): what the guides' families are measured against
    reference = gold.run_nuts(model, X, y, target="elbo_optimum",
                              num_samples=args.nuts_samples,
                              warmup_steps=args.nuts_warmup, num_chains=args.nuts_chains,
                              seed=args.seed, full_mass=True, progress=progress)
    nuts_seconds = time.perf_counter() - t0
    ref_pred = reference.predict(grid, seed=args.seed)
    figures = {"seconds": nuts_seconds, "min_ess_per_chain": min(reference.ess),
               "r_hat_max": reference.r_hat, "divergences": sum(reference.divergences)}
    ref_first = reference.layer_values(grid, model.layers[0].name, seed=args.seed)
    thin = torch.linspace(0, ref_first.shape[0] - 1, 200).long()  # over all the chains
    panels = {"NUTS": (ref_pred, ref_first[thin])}
    if name == "two_mode":
        b, a = gold.mode_masses(reference.layer_values(x_star, "layer1"))
        figures.update(mode_A=a, mode_B=b)
    records = [({**common, "guide": "nuts", "chains": args.nuts_chains,
                 "warmup": args.nuts_warmup, "samples": args.nuts_samples}, figures)]
    for guide_name in tqdm(args.guides, desc=f"{name}: guides", disable=not progress):
        pyro.set_rng_seed(args.seed)
        status = "ok"
        with gold.fixed_hyperparameters(model):
            guide = _make_guide(guide_name, model, X, y, args)
            try:
                result = fit(model, guide, X, y, num_steps=args.steps, lr=args.lr,
                             seed=args.seed, progress=progress, lr_schedule="constant",
                             final_elbo_particles=args.elbo_particles)
                elbo, elbo_se = result.final_elbo, result.final_elbo_stderr
                s_per_step = result.seconds / args.steps
            except TrainingDivergedError as err:  # parameters restored: score them
                status = f"diverged: {str(err).split(';')[0]}"
                elbo = elbo_se = s_per_step = math.nan
        pred = predict(model, guide, grid, num_samples=args.samples, seed=args.seed)
        distance = gold.predictive_distance(ref_pred, pred, seed=args.seed)
        first = gold.guide_layer_values(model, guide, grid, model.layers[0].name,
                                        num_samples=args.samples, seed=args.seed)
        label = guide_name if status == "ok" else f"{guide_name} ({status.split(':')[0]})"
        panels[label] = (pred, first[:200])
        figures = {**distance.as_dict(), "w1_layer1": gold.draws_w1(ref_first, first),
                   "elbo": elbo, "elbo_se": elbo_se, "s_per_step": s_per_step}
        if name == "two_mode":
            b, a = gold.mode_masses(gold.guide_layer_values(model, guide, x_star, "layer1",
                                                            num_samples=2000, seed=args.seed))
            figures.update(mode_A=a, mode_B=b)
        settings = {**common, "guide": guide_name, "steps": args.steps, "lr": args.lr}
        if status != "ok":
            settings["status"] = status
        records.append((settings, figures))
    if args.figures:
        _plot(name, X, y, grid, panels, ROOT / "docs" / f"semi_implicit_{name}.png")
    return records


def _make_guide(guide_name: str, model, X, y, args):
    """The guide ``guide_name`` of ``model`` (a registered name, or one of ``_STARTED``:
    SSIVI started at a MeanField guide trained here for ``args.steps``)."""
    if guide_name not in _STARTED:
        return make_guide(guide_name, model)
    start = make_guide("meanfield", model)
    fit(model, start, X, y, num_steps=args.steps, lr=args.lr, seed=args.seed, progress=False,
        lr_schedule="constant", final_elbo_particles=0)
    return SemiImplicit(model, init_from=start, **_STARTED[guide_name])


def _plot(name: str, X, y, grid, panels: dict, path: Path) -> Path:
    """One column per method: the first layer's draws on the grid (top) and the predictive of
    ``f`` (mean and 2 standard deviations, bottom), NUTS's in grey in every column."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyro_dgp.gold import mixture_moments

    x = grid[:, 0].cpu()
    fig, axes = plt.subplots(2, len(panels), figsize=(2.6 * len(panels), 5), sharex=True,
                             squeeze=False)
    ref_pred, ref_first = panels["NUTS"]
    ref_mean, ref_var = (t.cpu() for t in mixture_moments(ref_pred))
    # every column on NUTS's scale (a diverged guide's draws would flatten the others)
    lo, hi = float(ref_first.min()), float(ref_first.max())
    top_lim = (lo - 0.5 * (hi - lo), hi + 0.5 * (hi - lo))
    lo = float((ref_mean - 2 * ref_var.sqrt()).min().clamp(max=float(y.min())))
    hi = float((ref_mean + 2 * ref_var.sqrt()).max().clamp(min=float(y.max())))
    bottom_lim = (lo - 0.25 * (hi - lo), hi + 0.25 * (hi - lo))
    for j, (label, (pred, first)) in enumerate(panels.items()):
        top, bottom = axes[0, j], axes[1, j]
        for values, colour in ((ref_first, "0.6"), (first, "C0")):
            if label == "NUTS" and colour == "C0":
                continue
            draws = values[..., 0].cpu()
            top.plot(x, draws.T, ".", color=colour, ms=0.6, alpha=0.3)
        mean, var = (t.cpu() for t in mixture_moments(pred))
        bottom.fill_between(x, ref_mean - 2 * ref_var.sqrt(), ref_mean + 2 * ref_var.sqrt(),
                            color="0.8", label="NUTS")
        if label != "NUTS":
            bottom.plot(x, mean, color="C0", lw=1, label=label)
            bottom.plot(x, mean - 2 * var.sqrt(), color="C0", lw=0.6, ls="--")
            bottom.plot(x, mean + 2 * var.sqrt(), color="C0", lw=0.6, ls="--")
        bottom.plot(X[:, 0].cpu(), y.cpu(), "k.", ms=3)
        top.set_title(label, fontsize=9)
        top.set_ylim(*top_lim)
        bottom.set_ylim(*bottom_lim)
        if j == 0:
            top.set_ylabel("layer 1: f1(x) draws")
            bottom.set_ylabel("predictive of f(x)")
    fig.suptitle(f"{name}: each guide (blue) beside NUTS (grey), hyperparameters fixed",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    tmp.replace(path)  # atomic
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------ UCI
def run_uci(args) -> list[tuple[dict, dict]]:
    """``args.uci_guides`` (default SSIVI and MeanField) on ``args.datasets`` (DGP 2,
    ``args.splits`` splits) through ``benchmarks/uci.py``; one record per dataset and guide."""
    import uci

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    out = work / "uci_runs.jsonl"
    records = []
    for guide in args.uci_guides:
        argv = ["--datasets", *args.datasets, "--layers", "2", "--guide", guide,
                "--splits", str(args.splits), "--steps", str(args.uci_steps),
                "--device", str(args.device), "--out", str(out), "--no-record", "--quiet",
                "--seed", str(args.seed), "--jobs", str(args.jobs)]
        if args.data_dir:
            argv += ["--data-dir", args.data_dir]
        if uci.main(argv) != 0:
            raise RuntimeError(f"benchmarks/uci.py {' '.join(argv)} failed")
    runs = [r for r in uci.read_records(out) if r.get("status") in ("ok", "diverged")
            and r["settings"]["steps"] == args.uci_steps and r["layers"] == 2]
    for (ds, _, label, guide, *_), recs in uci.group_by_configuration(runs).items():
        if ds not in args.datasets or guide not in args.uci_guides:
            continue
        ok = [r for r in recs if r["status"] == "ok"]
        diverged = [r for r in recs if r["status"] == "diverged"]
        figures = {"splits": len(ok), "num_splits": recs[0]["data"]["num_splits"],
                   "diverged": len(diverged)}
        # a diverged run is scored at its last finite step (uci.py restores it there)
        scored, suffix = (ok, "") if ok else (diverged, "_at_divergence")
        for key in ("test_loglik", "rmse"):
            mean, se = uci.mean_se([r["metrics"][key] for r in scored])
            figures[key + suffix], figures[f"{key}{suffix}_se"] = mean, se
        if diverged:
            figures["nan_at_steps"] = ",".join(str(r["steps_done"]) for r in diverged)
        else:
            figures["s_per_step"] = sum(r["seconds_per_step"] for r in ok) / len(ok)
        settings = {"toy": None, "dataset": ds, "model": label, "guide": guide,
                    "steps": args.uci_steps, "lr": recs[0]["settings"]["lr"],
                    "device": str(args.device)}
        records.append((settings, figures))
    return records


# ------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/semi_implicit.py",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--part", nargs="+", choices=["toys", "uci"], default=["toys", "uci"])
    p.add_argument("--toys", nargs="+", choices=["two_mode", "compositional"],
                   default=["two_mode", "compositional"])
    p.add_argument("--guides", nargs="+", choices=GUIDES + EXTRA_GUIDES, default=list(GUIDES))
    p.add_argument("--steps", type=int, default=3000, help="Adam steps per guide (toys)")
    p.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate (toys)")
    p.add_argument("--samples", type=int, default=500, help="guide draws of the predictive")
    p.add_argument("--elbo-particles", type=int, default=64,
                   help="draws of each guide's final ELBO estimate")
    p.add_argument("--grid", type=int, default=100, help="grid points of the distances")
    p.add_argument("--nuts-chains", type=int, default=8)
    p.add_argument("--nuts-warmup", type=int, default=300)
    p.add_argument("--nuts-samples", type=int, default=300)
    p.add_argument("--two-mode-noise", type=float, default=1e-2,
                   help="likelihood variance of the two-mode toy (fixed)")
    p.add_argument("--comp-train", type=int, default=12,
                   help="training points of the compositional toy")
    p.add_argument("--comp-inducing", type=int, default=6,
                   help="inducing inputs per layer of the compositional toy")
    p.add_argument("--comp-noise", type=float, default=1e-2,
                   help="noise standard deviation of the compositional toy's data")
    p.add_argument("--comp-variance", type=float, default=1e-2,
                   help="likelihood variance of the compositional toy's model (fixed)")
    p.add_argument("--datasets", nargs="+", default=["boston", "energy"])
    p.add_argument("--uci-guides", nargs="+", choices=UCI_GUIDES,
                   default=["meanfield", "ssivi"], help="the guides of the UCI part")
    p.add_argument("--splits", type=int, default=3, help="the first n splits (UCI)")
    p.add_argument("--uci-steps", type=int, default=20000,
                   help="Adam steps per UCI run (the protocol's 20,000 by default)")
    p.add_argument("--data-dir", default=None, help="folder holding uci/")
    p.add_argument("--work-dir", default=str(ROOT / "runs" / "semi_implicit"),
                   help="per-run UCI records and checkpoints (resumable)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--jobs", type=int, default=1,
                   help="UCI runs at a time, each in its own process (benchmarks/uci.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-figures", dest="figures", action="store_false",
                   help="write no figure under docs/")
    p.add_argument("--no-record", action="store_true",
                   help="print the figures; append nothing to the results")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    args.device = torch.device(args.device)
    torch.set_num_threads(1)  # small problems: more threads only spin (docs/design.md)
    records = []
    if "toys" in args.part:
        for name in args.toys:
            records += run_toy(name, args, progress=not args.quiet)
    if "uci" in args.part:
        records += run_uci(args)
    for settings, figures in records:
        print(settings, {k: round(v, 4) if isinstance(v, float) else v
                         for k, v in figures.items()})
        if not args.no_record:
            results.record("semi_implicit", settings, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
