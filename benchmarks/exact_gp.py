"""Exact-GP control on UCI splits: how hard is a split for any GP, before blaming the DGP?

GPyTorch's ``ExactGP`` (constant mean, ARD RBF with a scale, Gaussian noise; float64; an
implementation independent of this library), hyperparameters by Adam on the exact marginal
likelihood, on the same standardised splits as ``benchmarks/uci.py``. Prints, per split, the
test log-likelihood and RMSE in original units and the test point scored worst, so a split
whose mean is set by a few points shows as such. For the small sets only (O(N^3)).

Run: ``python benchmarks/exact_gp.py --dataset energy --splits 0 1 2 3 [--append BENCHMARKS.md]``
"""

import argparse
import datetime as _dt
import math
import os
import shlex
import sys
import time
from pathlib import Path

import gpytorch
import torch
from machine import cpu_model
from uci import mean_se

from pyro_dgp import datasets


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, X, y, likelihood):
        super().__init__(X, y, likelihood)
        self.mean = gpytorch.means.ConstantMean()
        self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=X.shape[1]))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))


def run_split(name: str, split: int, steps: int, lr: float, data_dir=None) -> dict:
    s = datasets.load(name, split=split, data_dir=data_dir)
    X, y = s.X_train.double(), s.y_train.double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = _ExactGP(X, y, likelihood).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    t0 = time.time()
    for _ in range(steps):
        opt.zero_grad()
        loss = -mll(model(X), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = likelihood(model(s.X_test.double()))
        mu, sd = pred.mean, pred.variance.sqrt()
        # standardised-scale log-density, to original units by -log(y_std)
        ll = torch.distributions.Normal(mu, sd).log_prob(s.y_test.double()) - math.log(s.y_std)
        rmse = float((mu - s.y_test).square().mean().sqrt()) * s.y_std
    return {"split": split, "test_loglik": float(ll.mean()), "rmse": rmse,
            "worst_point": float(ll.min()), "train_mll_per_point": -float(loss.detach()),
            "noise_var": float(likelihood.noise.detach()), "seconds": time.time() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="a UCI set (small ones: O(N^3))")
    p.add_argument("--splits", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=1500, help="Adam steps on the marginal likelihood")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--append", default=None, metavar="FILE", help="append the table to FILE")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for k in args.splits:
        r = run_split(args.dataset, k, args.steps, args.lr, args.data_dir)
        rows.append(r)
        print(f"split {k}: test log-lik {r['test_loglik']:.3f}, RMSE {r['rmse']:.3f}, worst "
              f"point {r['worst_point']:.2f}, train mll/N {r['train_mll_per_point']:.3f}, "
              f"noise {r['noise_var']:.2e}, {r['seconds']:.0f} s", flush=True)
    mean, se = mean_se([r["test_loglik"] for r in rows])
    se = float("nan") if se is None else se
    table = "\n".join(
        ["| split | test log-lik | RMSE | worst test point | train mll / N |",
         "|---|---|---|---|---|"]
        + [f"| {r['split']} | {r['test_loglik']:.3f} | {r['rmse']:.3f} | "
           f"{r['worst_point']:.2f} | {r['train_mll_per_point']:.3f} |" for r in rows]
        + [f"| mean (se) | {mean:.3f} ({se:.3f}) | | | |"])
    print(table)
    if args.append:
        date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        command = "python benchmarks/exact_gp.py " + shlex.join(sys.argv[1:] if argv is None
                                                               else argv)
        with Path(args.append).open("a") as fh:
            fh.write(f"\n## Exact-GP control: {args.dataset} ({date})\n\n"
                     f"Command: `{command}`\n\n"
                     f"- Machine: {cpu_model()}, {os.cpu_count()} logical CPUs, torch threads "
                     f"{torch.get_num_threads()}; torch {torch.__version__}, gpytorch "
                     f"{gpytorch.__version__}\n"
                     f"- GPyTorch ExactGP, constant mean, ARD RBF with scale, float64; "
                     f"{args.steps} Adam steps at lr {args.lr} on the exact marginal "
                     f"likelihood; test log-lik and RMSE in original units\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
