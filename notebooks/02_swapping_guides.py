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
# # 2. One model, many guides: fitting and comparing variational families
#
# A guide of `pyro_dgp` knows a model only through its layer sites (`<layer>.u`,
# `<layer>.f`), so every family fits the same model without an edit of it. Here one
# two-layer deep GP from the gallery (`models.RegressionDGP`) is fitted with six guides:
#
# | guide | family |
# |---|---|
# | `MeanField` | a Gaussian `q(u)` per layer, collapsed estimator (Salimbeni and Deisenroth 2017) |
# | `Coupled` | one Gaussian over all layers (Ustyuzhaninov et al. 2020) |
# | `Chain` | `q(u1) q(u2 \| u1)` (Ustyuzhaninov et al. 2020) |
# | `complete(AutoMultivariateNormal, model)` | a Pyro autoguide over the inducing outputs |
# | `SemiImplicit` | a neural mixture per layer (Molchanova et al. 2019) |
# | `Amortized` | per-point inducing points from an encoder (Meng and Zhang 2024) |
#
# and the fits are compared side by side: the ELBO, PSIS-LOO, and the calibration (coverage
# of the central 95% interval, CRPS) in-sample and on held-out points, with
# `pyro_dgp.compare_guides`, which warns when these criteria disagree.
#
# `PYRO_DGP_NOTEBOOK_SIZE=small` runs a quick version (CI); the default is the full run.

# %%
import os
import sys
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer.autoguide import AutoMultivariateNormal

import pyro_dgp as dgp

# the gallery models/ sits beside pyro_dgp/ in the repository (not installed): importable from
# the path, else found from the working directory up
try:
    import models
except ImportError:
    sys.path.insert(0, str(next((p for p in [Path.cwd(), *Path.cwd().parents]
                                 if (p / "models").is_dir()), Path.cwd())))
    import models

SMALL = os.environ.get("PYRO_DGP_NOTEBOOK_SIZE", "full") == "small"
N, M, STEPS, DRAWS = (60, 8, 150, 64) if SMALL else (200, 20, 3000, 200)
torch.set_num_threads(1)

# %% [markdown]
# ## Data and the model
#
# The step function: `y = -1` left of 0, `+1` right of it, with noise 0.05. A deep GP
# represents the jump with a steep warp in its first layer; a single GP cannot.
# Each guide trains its own copy of the model (same definition, same initial values), since
# fitting a guide also fits the model's kernels and noise.

# %%
data = dgp.datasets.step(n_train=N, n_test=200, seed=0)
X, y = data.X_train, data.y_train


def make_model(amortized=False):
    pyro.set_rng_seed(0)
    return models.RegressionDGP(X, hidden=(1,), num_inducing=M, noise_variance=0.01,
                                amortized=amortized)


GUIDES = {
    "MeanField": dgp.guides.MeanField,
    "Coupled": dgp.guides.Coupled,
    "Chain": dgp.guides.Chain,
    "AutoMVN": lambda m: dgp.complete(AutoMultivariateNormal, m),
    "SemiImplicit": lambda m: dgp.guides.SemiImplicit(m, num_mixing=20, noise_dim=10,
                                                      hidden=(32, 32)),
}

# %% [markdown]
# ## Fitting
#
# `dgp.fit` runs Pyro's SVI with the objective each family needs (the ELBO with closed-form
# KLs where the guide factorises like the model, `Trace_ELBO` otherwise). The amortized
# guide belongs to the model variant with per-point inducing points (`amortized=True`: a
# different prior, so strictly a different model of the same data) and trains with its own
# objective, `AmortizedELBO`.

# %%
fits = {}
for name, make_guide in GUIDES.items():
    model = make_model()
    guide = make_guide(model)
    result = dgp.fit(model, guide, X, y, num_steps=STEPS, lr=0.02, progress=False)
    fits[name] = (model, guide, result)
model = make_model(amortized=True)
guide = dgp.guides.Amortized(model, rule="AR2", num_paths=8)
result = dgp.fit(model, guide, X, y, num_steps=STEPS, lr=0.02, progress=False,
                 objective=dgp.AmortizedELBO())
fits["Amortized"] = (model, guide, result)
for name, (_, _, r) in fits.items():
    print(f"{name:13s} ELBO {r.final_elbo:9.2f} +- {r.final_elbo_stderr:.2f}")

# %% [markdown]
# ## The fits
#
# The predictive mean and 90% band of each guide on a grid, with the training data.

# %%
grid = data.X_test
fig, axes = plt.subplots(2, 3, figsize=(11, 5), sharex=True, sharey=True)
for ax, (name, (model, guide, _)) in zip(axes.flat, fits.items(), strict=True):
    pred = dgp.predict(model, guide, grid, num_samples=DRAWS, seed=0)
    lo, hi = pred.quantiles([0.05, 0.95])
    ax.fill_between(grid[:, 0], lo, hi, alpha=0.3)
    ax.plot(grid[:, 0], pred.mean)
    ax.plot(X[:, 0], y, "k.", ms=3)
    ax.set_title(name)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Comparing them
#
# `dgp.to_datatree` turns `DRAWS` draws of each guide into an ArviZ DataTree with a
# `log_likelihood` group (for PSIS-LOO) and `posterior_predictive` draws (for calibration).
# `compare_guides` puts side by side, best first by PSIS-LOO:
#
# - `elpd`, `se`, `weight`: PSIS-LOO (Vehtari, Gelman and Gabry 2017) and stacking weights;
# - `pareto_k_max`, `n_bad_k`: points where LOO is unreliable;
# - `elbo`: the ELBO of each fit;
# - `coverage`, `crps` (in-sample) and `heldout_*` (on the test points): does the guide's
#   predictive cover 95% of the points, and how sharp and right is it?
#
# A `GuideComparisonWarning` says which guide each criterion prefers when they disagree by
# more than twice the standard error of the difference, and which guides have unreliable LOO.

# %%
trees = {name: dgp.to_datatree(m, g, X, y, num_samples=DRAWS, seed=0)
         for name, (m, g, _) in fits.items()}
heldout = {name: dgp.to_datatree(m, g, data.X_test, data.y_test, num_samples=DRAWS, seed=0)
           for name, (m, g, _) in fits.items()}
elbos = {name: r.final_elbo for name, (_, _, r) in fits.items()}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", dgp.GuideComparisonWarning)
    table = dgp.compare_guides(trees, heldout=heldout, elbos=elbos)
columns = ["rank", "elpd", "se", "weight", "pareto_k_max", "elbo", "coverage", "crps",
           "heldout_coverage", "heldout_crps", "heldout_elpd"]
print(table[columns].round(3))

# %%
for w in caught:
    if issubclass(w.category, dgp.GuideComparisonWarning):
        print("GuideComparisonWarning:", w.message, "\n")
print("preferred by each criterion:", table.attrs["preferred"])

# %% [markdown]
# ## How to read it
#
# - The ELBO and PSIS-LOO can both prefer a guide whose predictive is overconfident: a guide
#   that puts no posterior mass on the uncertain region around the jump scores well on the
#   points away from it. Coverage far below 0.95, or a held-out CRPS above another guide's,
#   is the sign; the warning names both guides.
# - Guides of different families fit different amounts of the posterior's correlations
#   (`MeanField` none across layers, `Coupled` and `Chain` all, the semi-implicit family
#   non-Gaussian shapes), and so differ most where the layers trade off against each other.
# - The amortized guide's row compares a model-and-guide pair (its prior differs); its ELBO
#   bounds the evidence of its own model. Its rule here is `AR2` (random paths): the
#   quadrature rules `AR2P` and `AR2PP` draw (nearly) the same value every time, so their
#   draws carry no spread for PSIS-LOO to weigh.
