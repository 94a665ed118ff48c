"""The gold standard's posterior on the two-mode toy: its predictive at ``x = -0.5`` against
importance sampling, and the stacking weights of its chains' modes.

NUTS on ``gold.two_mode_model()``'s posterior (``gold.run_nuts(target="posterior")``, chains
from prior draws, seeds ``seed .. seed + chains - 1``), its chains grouped and weighed by
stacking (``pyro_dgp.gold.chains``). Recorded: the predictive mean and variance of ``f`` at
``x = -0.5`` (the stacked draws), the same by self-normalised importance sampling (the prior of
``f^1`` at the data as proposal, the last layer's exact GP marginal likelihood as weight) with
its standard error, and per group its chains, its mode (the sign of ``f^1(1) - f^1(-1)``: ``A``
increasing, ``B`` decreasing), its stacking weight, R-hat and bulk ESS per chain.

Run: ``python benchmarks/gold.py --chains 4 --warmup 200 --samples 200``
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import results
import torch

from pyro_dgp import gold

X_QUERY = -0.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gold.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--max-tree-depth", type=int, default=10)
    p.add_argument("--noise", type=float, default=1e-2, help="the toy's likelihood variance")
    p.add_argument("--is-draws", type=int, default=1_000_000,
                   help="importance-sampling draws of the reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", default=1, type=lambda s: s if s == "auto" else int(s),
                   help="processes that run the chains (gold.run_nuts's jobs: a number or "
                        "'auto'); the draws do not depend on it")
    p.add_argument("--no-record", action="store_true",
                   help="print the figures; append nothing to the results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # small problems: more threads only spin (docs/design.md)
    model, X, y = gold.two_mode_model(noise=args.noise)
    x_star = X.new_tensor([[X_QUERY]])
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", gold.GoldMixingWarning)
        res = gold.run_nuts(model, X, y, target="posterior", num_samples=args.samples,
                            warmup_steps=args.warmup, num_chains=args.chains, seed=args.seed,
                            full_mass=True, max_tree_depth=args.max_tree_depth,
                            progress=False, jobs=args.jobs)
    seconds = time.perf_counter() - t0
    pred = res.predict(x_star, seed=args.seed)
    mean, var = gold.mixture_moments(pred)
    is_mean, is_var, is_se = gold.two_mode_posterior_predictive(
        model, X, y, x_star, args.is_draws, args.seed)
    with torch.no_grad():
        f1 = res.samples["layer1.u"][:, :, 0] @ model.layers[0].kzz_cholesky().mT  # (C, S, 7)
    groups = []
    for g, chains in enumerate(res.groups):
        rising = float((f1[chains, :, -1] > f1[chains, :, 0]).double().mean())
        groups.append({"chains": chains, "mode": "A" if rising > 0.5 else "B",
                       "weight": float(res.weights[g]), "r_hat": res.chain_groups.r_hat[g],
                       "ess_per_chain": res.chain_groups.ess_per_chain[g]})
    weight = {m: sum((gr["weight"] for gr in groups if gr["mode"] == m), 0.0) for m in ("A", "B")}
    settings = {"toy": "two_mode", "target": "posterior", "noise": args.noise,
                "chains": args.chains, "warmup": args.warmup, "samples": args.samples,
                "max_tree_depth": args.max_tree_depth, "seed": args.seed}
    figures = {"pred_mean_x-0.5": float(mean[0]), "pred_var_x-0.5": float(var[0]),
               "is_pred_mean_x-0.5": is_mean, "is_pred_var_x-0.5": is_var,
               "is_pred_var_se": is_se, "weight_mode_A": weight["A"],
               "weight_mode_B": weight["B"], "groups": groups,
               "divergences": sum(res.divergences), "mixing_warnings": len(caught),
               "seconds": seconds}
    print(settings, figures)
    if not args.no_record:
        results.record("gold", settings, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
