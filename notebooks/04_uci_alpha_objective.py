# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. UCI regression with the local alpha-divergence objective
#
# The ELBO fits `q` by `KL(q || p)`, which prefers too-narrow posteriors. The local
# alpha-divergence objective (`fit(objective="alpha", alpha=a)`, the black-box alpha of
# Hernandez-Lobato et al. 2016 applied per data point) interpolates between the ELBO
# (`a -> 0`) and a predictive objective (`a = 1`); it is a training loss, not a bound.
# This notebook fits a two-layer deep GP to a UCI data set with the ELBO and with
# `alpha = 0.5`, and compares their *mixture predictives*: each prediction is a mixture of
# the Gaussians of `S` guide draws, scored by its negative log density (NLL), its CRPS and
# the coverage of its quantile bands, in the original units of the target.
#
# The data are read from `$PYRO_DGP_DATA` (the folder holding `uci/`; see the README).
# `PYRO_DGP_NOTEBOOK_SIZE=small` runs a quick version on `boston` (CI); the full run uses
# `PYRO_DGP_UCI` (default `boston`) with the settings of Salimbeni and Deisenroth 2017.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

import pyro_dgp as dgp

SMALL = os.environ.get("PYRO_DGP_NOTEBOOK_SIZE", "full") == "small"
NAME = "boston" if SMALL else os.environ.get("PYRO_DGP_UCI", "boston")
M, STEPS, S = (20, 150, 32) if SMALL else (100, 5000, 100)
torch.set_num_threads(1)

data = dgp.datasets.load(NAME, split=0, download=False)  # standardised on the train part
print(f"{data.name}: {data.num_train} training and {data.num_test} test points, "
      f"{data.X_train.shape[1]} inputs")

# %% [markdown]
# ## Two fits: the ELBO and alpha = 0.5
#
# The same model, built twice from the same seed. The alpha objective estimates
# `log E_q p(y_n | f)^a` per point from `num_particles` draws of the last layer's Gaussian
# (closed form for a Gaussian likelihood given each draw).

# %%
objectives = {"ELBO": {"objective": "elbo"},
              "alpha = 0.5": {"objective": "alpha", "alpha": 0.5, "num_particles": 10}}
fits = {}
for name, options in objectives.items():
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=M)
    guide = dgp.guides.MeanField(model)
    result = dgp.fit(model, guide, data.X_train, data.y_train, num_steps=STEPS, lr=0.01,
                     progress=False, seed=0, **options)
    fits[name] = (model, guide, result)
    print(f"{name}: final loss per point {result.losses[-1] / data.num_train:.3f}")

# %% [markdown]
# ## The mixture predictive
#
# `predict` returns a `MixturePredictive` in the original units (`y_mean`, `y_std`): its
# `log_prob` is the mixture's log density (logsumexp over the draws), `crps` the closed-form
# CRPS of a mixture of normals, and `quantiles` the mixture's quantiles.

# %%
y_test = data.y_mean + data.y_std * data.y_test  # original units
rows, preds = {}, {}
for name, (model, guide, _) in fits.items():
    pred = dgp.predict(model, guide, data.X_test, num_samples=S, y_mean=data.y_mean,
                       y_std=data.y_std, seed=0)
    preds[name] = pred
    rows[name] = dgp.metrics.regression_report(pred, y_test)
print(pd.DataFrame(rows).T.round(3))

# %% [markdown]
# ## Quantile bands
#
# The test points ordered by their predictive mean, with the 5-95% and 25-75% bands of each
# mixture and the observed targets. A calibrated predictive has about 90% of the points in
# the outer band and half in the inner one.

# %%
fig, axes = plt.subplots(1, len(preds), figsize=(11, 3.5), sharey=True)
for ax, (name, pred) in zip(axes, preds.items(), strict=True):
    order = torch.argsort(pred.mean)
    q = pred.quantiles([0.05, 0.25, 0.75, 0.95])[:, order]
    idx = np.arange(len(order))
    ax.fill_between(idx, q[0], q[3], alpha=0.25, label="5-95%")
    ax.fill_between(idx, q[1], q[2], alpha=0.4, label="25-75%")
    ax.plot(idx, y_test[order], "k.", ms=3, label="observed")
    inside = dgp.metrics.coverage(pred, y_test, 0.90)
    ax.set_title(f"{name}: {inside:.0%} inside 5-95%")
    ax.set_xlabel("test points by predictive mean")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Reading the numbers
#
# NLL rewards a predictive that puts high density on the observations (and punishes
# overconfidence severely); CRPS compares the whole predictive distribution with each
# observation, in the target's units; `coverage95` is the share of test points inside the
# central 95% interval. With few steps (the small run) both fits are far from converged, so
# its numbers say nothing about the objectives; for a study over splits, run
# `benchmarks/uci.py --objective alpha` (its results go to `BENCHMARKS.md`).
