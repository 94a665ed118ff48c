"""Guides against the posterior on the two symmetric toys: which guide puts ``f^1`` in both modes.

On the two-mode toy of Havasi et al. 2018 (``gold.two_mode_model``) and the smooth symmetric toy
(``gold.symmetric_model``), both of whose posteriors are invariant under ``f^1 -> -f^1`` with
the second layer reflected (``pyro_dgp.gold.symmetry``), with the hyperparameters fixed:

- the gold standard: NUTS on the posterior (``gold.run_nuts(target="posterior")``), its chains
  then ``gold.symmetrised`` (each chain's mirror image added with half its group's weight), so
  each mode weighs exactly one half, as the symmetry says; stacking alone cannot weigh modes
  that predict alike. The rising mode's mass by importance sampling
  (``gold.importance_mode_masses``, with its standard error) is recorded beside it as the
  independent check (``mass_rising``, ``mass_rising_se``).
- per guide, trained on the same model: ``w1``, the mean 1-Wasserstein distance of its
  predictive of ``f`` on a grid to the gold standard's (``gold.predictive_distance``);
  ``w1_layer1``, the same for the first layer's ``f^1`` (``gold.draws_w1``); ``share_rising``,
  the share of its draws whose ``f^1`` rises over the data (``gold.rising``, 2,000 draws); its
  ELBO (``final_elbo``; the stratified mixture ELBO for the mixtures); ``seconds`` of training.

The guides: ``meanfield``, ``coupled``, ``chain`` (the registry's); ``ssivi-tril-init``, SSIVI
with correlated components started at the ``meanfield`` fit of seed 0 (the semi-implicit
variant of the best ELBO in ``benchmarks/semi_implicit.py``'s runs); ``mixture``, the registry's
``Mixture`` (K = 4 MeanField components at spread starts); ``mixture-fits``, ``Mixture(
init_from=fits)`` over ``--fits`` MeanField fits of seeds ``0 .. fits - 1`` (K = fits), before
(``mixture-fits-start``, uniform weights, no training) and after ``--mixture-steps`` steps of
its stratified ELBO; ``mixture-modes``, the same of ``guides.one_per_mode(fits)`` (the
first fit of each group within 100 nats of symmetrised KL: one component per mode found, chosen
without the toy's labels) for ``--mixture-steps``;
``stack-fits``, the same fits stacked by PSIS-LOO (``pyro_dgp.stack``;
its predictive resampled to the stacking weights, its shares the weighted fits' shares; no
ELBO). The goal (issue 39): a guide with each mode's share within 0.15 of the gold's mass on the
two-mode toy and within 15-85% on the symmetric toy (``goal_shares``), and a ``w1`` below every
single Gaussian guide's (meanfield, coupled, chain; ``goal_w1``).

Run: ``python benchmarks/toys.py`` (``--help`` for the settings; reduced from the full
protocols so that both toys take about 20 minutes of one core).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import pyro
import results
import torch

from pyro_dgp import evaluate_elbo, gold, stack
from pyro_dgp.diagnostics import Stacked
from pyro_dgp.guides import Mixture, SemiImplicit, one_per_mode
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.prediction import MixturePredictive, predict
from pyro_dgp.train.training import fit

__all__ = ["GAUSSIAN", "GUIDES", "TOYS", "build_parser", "main", "run_toy"]

DT = torch.float64
#: toy -> (builder, grid half-width, allowed distance of each mode's share from the gold's mass)
TOYS = {"two_mode": (gold.two_mode_model, 1.5, 0.15),
        "symmetric": (gold.symmetric_model, 1.5, 0.35)}
#: the guides of ``--guides`` (the MeanField fits always run)
GUIDES = ("coupled", "chain", "mixture", "ssivi-tril-init", "mixture-fits", "mixture-modes",
          "stack-fits")
#: the single Gaussian guides whose ``w1`` the goal must beat
GAUSSIAN = ("meanfield", "coupled", "chain")


def _train(model, guide, X, y, args, steps: int, seed: int) -> dict:
    """Fit ``guide`` (hyperparameters fixed); its ELBO, standard error and seconds."""
    pyro.set_rng_seed(seed)
    with gold.fixed_hyperparameters(model):
        result = fit(model, guide, X, y, num_steps=steps, lr=args.lr, seed=seed,
                     progress=False, lr_schedule="constant",
                     final_elbo_particles=args.elbo_particles)
    return {"elbo": result.final_elbo, "elbo_se": result.final_elbo_stderr,
            "seconds": result.seconds}


def _reference(model, X, y, args) -> tuple:
    """The symmetrised NUTS gold standard and its record's figures."""
    t0 = time.perf_counter()
    nuts = gold.run_nuts(model, X, y, target="posterior", num_samples=args.nuts_samples,
                         warmup_steps=args.nuts_warmup, num_chains=args.nuts_chains,
                         seed=args.seed, full_mass=True, max_tree_depth=args.max_tree_depth,
                         progress=False, jobs=args.nuts_jobs)
    seconds = time.perf_counter() - t0
    reference = gold.symmetrised(nuts)
    masses = gold.importance_mode_masses(model, X, y, num_draws=args.is_draws, seed=args.seed)
    share = float(gold.rising(reference.layer_values(X, "layer1", seed=args.seed))
                  .double().mean())
    rising_chains = [bool(gold.rising(_chain_values(nuts, c, X)).double().mean() > 0.5)
                     for c in range(nuts.num_chains)]
    figures = {"share_rising": share, "mass_rising": masses.rising,
               "mass_rising_se": masses.stderr, "is_ess": masses.ess,
               "chains_rising": sum(rising_chains), "divergences": sum(nuts.divergences),
               "r_hat_max_group": max(nuts.chain_groups.r_hat),
               "ess_per_chain_min": min(nuts.chain_groups.ess_per_chain), "seconds": seconds}
    return reference, figures


def _chain_values(nuts, chain: int, X) -> torch.Tensor:
    """``(S, N, 1)``: chain ``chain``'s draws of ``f^1`` at ``X`` (its mode)."""
    one = gold.GoldStandard(nuts.model, {k: v[chain:chain + 1] for k, v in nuts.samples.items()},
                            target=nuts.target, X=nuts.X, y=nuts.y)
    return one.layer_values(X, "layer1")


def _resampled(pred: MixturePredictive) -> MixturePredictive:
    """A weighted mixture's components resampled to its weights (an equally weighted set of
    the same size, each component ``round(w S)`` times, largest remainders)."""
    S = pred.loc.shape[0]
    shares = pred.weights[:, 0].double() * S  # (S,): the draws' weights, shared by the points
    counts = shares.floor().long()
    left = S - int(counts.sum())
    counts[torch.argsort(shares - counts, descending=True)[:left]] += 1
    index = torch.repeat_interleave(torch.arange(S), counts)
    return MixturePredictive(pred.loc[index], pred.var[index], pred.likelihood)


def _scores(model, guide_or_stack, X, grid, reference, ref_pred, ref_first, args) -> dict:
    """The distances and the rising share of one guide (or of a ``Stacked``)."""
    if not isinstance(guide_or_stack, Stacked):
        guide = guide_or_stack
        pred = predict(model, guide, grid, num_samples=args.samples, seed=args.seed)
        first = gold.guide_layer_values(model, guide, grid, "layer1", num_samples=args.samples,
                                        seed=args.seed)
        at_data = gold.guide_layer_values(model, guide, X, "layer1", num_samples=2000,
                                          seed=args.seed)
        share = float(gold.rising(at_data).double().mean())
    else:
        stacked = guide_or_stack
        pred = _resampled(stacked.predict(grid, num_samples=args.samples, seed=args.seed))
        w = stacked.weights.double()
        firsts = [gold.guide_layer_values(model, g, grid, "layer1", num_samples=args.samples,
                                          seed=args.seed) for _, g in stacked.fits]
        counts = torch.round(w * args.samples).long()
        first = torch.cat([f[:int(c)] for f, c in zip(firsts, counts, strict=True)])
        shares = [float(gold.rising(gold.guide_layer_values(model, g, X, "layer1", 2000,
                                                            seed=args.seed)).double().mean())
                  for _, g in stacked.fits]
        share = float(sum(wj * s for wj, s in zip(w.tolist(), shares, strict=True)))
    distance = gold.predictive_distance(ref_pred, pred, seed=args.seed)
    return {"w1": distance.w1, "mean_abs": distance.mean_abs,
            "w1_layer1": gold.draws_w1(ref_first, first), "share_rising": share}


def _guides(model, X, y, args) -> list[tuple[str, object, dict]]:
    """Every guide of the module docstring in ``args.guides``, trained: ``(name, guide,
    figures)``; the MeanField fits always (every further guide reads them)."""
    out = []
    fits = []
    for k in range(args.fits):
        guide = make_guide("meanfield", model)
        figures = _train(model, guide, X, y, args, args.steps, args.seed + k)
        fits.append((guide, figures))
    out.append(("meanfield", fits[0][0], fits[0][1]))
    for name in ("coupled", "chain", "mixture"):
        if name in args.guides:
            guide = make_guide(name, model)
            out.append((name, guide, _train(model, guide, X, y, args, args.steps, args.seed)))
    if "ssivi-tril-init" in args.guides:
        ssivi = SemiImplicit(model, init_from=fits[0][0], component_scale="tril")
        figures = _train(model, ssivi, X, y, args, args.steps, args.seed)
        figures["seconds_with_start"] = figures["seconds"] + fits[0][1]["seconds"]
        out.append(("ssivi-tril-init", ssivi, figures))
    return out + _from_fits(model, X, y, args, fits)


def _from_fits(model, X, y, args, fits) -> list[tuple[str, object, dict]]:
    """The guides made of the MeanField fits ``[(guide, figures), ...]``, and the fits of
    seeds after the first."""
    out = []
    fit_seconds = sum(f["seconds"] for _, f in fits)
    if "mixture-fits" in args.guides:
        out += _mixtures_of_fits(model, X, y, args, fits, fit_seconds)
    if "mixture-modes" in args.guides:
        out.append(_one_fit_per_mode(model, X, y, args, fits, fit_seconds))
    if "stack-fits" in args.guides:
        t0 = time.perf_counter()
        stacked = stack([(model, g) for g, _ in fits], X=X, y=y, num_samples=100, seed=args.seed)
        out.append(("stack-fits", stacked, {"seconds": time.perf_counter() - t0,
                                            "seconds_with_fits": fit_seconds,
                                            "weights": [round(float(w), 4)
                                                        for w in stacked.weights]}))
    return out + [(f"meanfield-seed{args.seed + k}", g, f) for k, (g, f) in
                  enumerate(fits[1:], start=1)]


def _mixtures_of_fits(model, X, y, args, fits, fit_seconds) -> list[tuple[str, object, dict]]:
    """``Mixture(init_from=fits)`` before and after training."""
    out = []
    start = Mixture(model, init_from=[g for g, _ in fits])
    elbo = evaluate_elbo(model, start, X, y, num_particles=args.elbo_particles,
                         objective="stratified", seed=args.seed)
    out.append(("mixture-fits-start", start, {"elbo": elbo.value, "elbo_se": elbo.stderr,
                                              "seconds": 0.0,
                                              "seconds_with_fits": fit_seconds}))
    mixture = Mixture(model, init_from=[g for g, _ in fits])
    figures = _train(model, mixture, X, y, args, args.mixture_steps, args.seed)
    figures["seconds_with_fits"] = figures["seconds"] + fit_seconds
    figures["weights"] = [round(float(w), 4) for w in mixture.weights()]
    out.append(("mixture-fits", mixture, figures))
    return out


def _one_fit_per_mode(model, X, y, args, fits, fit_seconds) -> tuple[str, object, dict]:
    """``Mixture(init_from=one_per_mode(fits))``: the first fit of each group of ``fits``
    within 100 nats of one another (symmetrised KL of their ``q(U)``; no use of the toy's
    modes), trained ``args.mixture_steps``: as many components per mode."""
    guides = [g for g, _ in fits]
    kept = one_per_mode(guides, model)
    mixture = Mixture(model, init_from=kept)
    figures = _train(model, mixture, X, y, args, args.mixture_steps, args.seed)
    figures["seconds_with_fits"] = figures["seconds"] + fit_seconds
    figures["weights"] = [round(float(w), 4) for w in mixture.weights()]
    figures["fit_seeds"] = [args.seed + guides.index(g) for g in kept]
    figures["fits_rising"] = [bool(gold.rising(gold.guide_layer_values(
        model, g, X, "layer1", num_samples=500, seed=args.seed)).double().mean() > 0.5)
        for g in kept]
    return "mixture-modes", mixture, figures


def run_toy(name: str, args) -> list[tuple[dict, dict]]:
    """The gold standard and every guide on the toy ``name``: one record each."""
    make, width, tolerance = TOYS[name]
    model, X, y = make()
    grid = torch.linspace(-width, width, args.grid, dtype=DT).unsqueeze(-1)
    # the reference each W1 is measured against: rows compare within one reference only
    common = {"toy": name, "n_train": X.shape[0],
              "noise": round(float(model.likelihood.variance.detach()), 12),
              "reference": f"nuts {args.nuts_chains}x({args.nuts_warmup}+{args.nuts_samples})"}
    reference, nuts_figures = _reference(model, X, y, args)
    ref_pred = reference.predict(grid, seed=args.seed)
    ref_first = reference.layer_values(grid, "layer1", seed=args.seed)
    records = [({**common, "guide": "gold", "chains": args.nuts_chains,
                 "warmup": args.nuts_warmup, "samples": args.nuts_samples,
                 "max_tree_depth": args.max_tree_depth, "is_draws": args.is_draws},
                nuts_figures)]
    mass = nuts_figures["mass_rising"]
    rows = []
    for guide_name, guide, figures in _guides(model, X, y, args):
        figures = {**_scores(model, guide, X, grid, reference, ref_pred, ref_first, args),
                   **figures}
        rows.append((guide_name, figures))
    seeds = [f["share_rising"] for n, f in rows if n.startswith("meanfield")]
    best_gaussian = min(f["w1"] for n, f in rows if n in GAUSSIAN)  # meanfield at least
    for guide_name, figures in rows:
        if guide_name == "stack-fits":
            figures["fits_rising"] = sum(s > 0.5 for s in seeds)
        share = figures["share_rising"]
        figures["goal_shares"] = bool(abs(share - mass) <= tolerance
                                      and abs((1 - share) - (1 - mass)) <= tolerance)
        figures["goal_w1"] = bool(figures["w1"] < best_gaussian)
        steps = args.mixture_steps if guide_name in ("mixture-fits", "mixture-modes") else (
            0 if guide_name in ("mixture-fits-start", "stack-fits") else args.steps)
        settings = {**common, "guide": guide_name, "steps": steps, "lr": args.lr}
        if guide_name in ("mixture-fits", "mixture-fits-start", "mixture-modes", "stack-fits"):
            settings["fits"] = args.fits
        records.append((settings, figures))
    return records


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/toys.py",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--toys", nargs="+", choices=list(TOYS), default=list(TOYS))
    p.add_argument("--guides", nargs="+", choices=GUIDES, default=list(GUIDES),
                   help="the guides besides the MeanField fits (always run)")
    p.add_argument("--steps", type=int, default=1500, help="Adam steps per guide")
    p.add_argument("--mixture-steps", type=int, default=500,
                   help="Adam steps of the mixture started at the fits")
    p.add_argument("--fits", type=int, default=8, help="MeanField fits (seeds) for the "
                   "mixture-fits and stack-fits guides")
    p.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate (constant)")
    p.add_argument("--samples", type=int, default=500, help="guide draws on the grid")
    p.add_argument("--elbo-particles", type=int, default=64)
    p.add_argument("--grid", type=int, default=60, help="grid points of the distances")
    p.add_argument("--nuts-chains", type=int, default=2)
    p.add_argument("--nuts-warmup", type=int, default=150)
    p.add_argument("--nuts-samples", type=int, default=150)
    p.add_argument("--max-tree-depth", type=int, default=8)
    p.add_argument("--nuts-jobs", default=1, type=lambda s: s if s == "auto" else int(s),
                   help="processes that run NUTS's chains (gold.run_nuts's jobs); the draws do "
                        "not depend on it")
    p.add_argument("--is-draws", type=int, default=400_000,
                   help="importance-sampling draws of the modes' masses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true",
                   help="print the figures; append nothing to the results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.fits < 1:
        print("error: --fits must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # small problems: more threads only spin (docs/design.md)
    for name in args.toys:
        for settings, figures in run_toy(name, args):
            print(settings["toy"], settings["guide"],
                  {k: round(v, 4) if isinstance(v, float) and math.isfinite(v) else v
                   for k, v in figures.items()}, flush=True)
            if not args.no_record:
                results.record("toys", settings, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
