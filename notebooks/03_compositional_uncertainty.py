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
# # 3. Compositional uncertainty in ArviZ
#
# A deep GP explains data as a composition `f2(f1(x))`, and several compositions may explain
# them about equally well: a steeper first layer with a smoother second one, say. That is
# the *compositional uncertainty* of Ustyuzhaninov et al. 2020, and a variational guide may
# keep it or lose it. This notebook fits one two-layer model with two guides, exports
# each fit to an ArviZ `DataTree` with one group per role, and reads the layers from it:
# per-layer draws, per-layer summaries, sample paths of each layer and of the composition,
# and the sign of a *collapsed* layer.
#
# `PYRO_DGP_NOTEBOOK_SIZE=small` runs a quick version (CI); the default is the full run.

# %%
import os
import sys
import tempfile
from pathlib import Path

import arviz_plots as azp
import arviz_stats as azs
import matplotlib.pyplot as plt
import pyro
import torch
from IPython.display import Image, display

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
N, M, STEPS, DRAWS = (60, 10, 300, 50) if SMALL else (100, 20, 5000, 200)
torch.set_num_threads(1)
FIGURES = Path(tempfile.mkdtemp(prefix="layer_plots_"))

# %% [markdown]
# ## Model and fits
#
# The two-layer deep GP of the gallery (`models.RegressionDGP`, layers `layer1` and `layer2`
# of width 1) on the step function: the jump can sit in the first layer (a steep warp, a
# smooth second layer), in the second, or be shared between them. Two guides: `MeanField`,
# independent Gaussians per layer, and `Chain`, `q(u1) q(u2 | u1)`, which can represent how
# the second layer's shape depends on the first one's. Each guide trains its own copy of the
# model.

# %%
data = dgp.datasets.step(n_train=N, noise=0.05, seed=0)
X, y = data.X_train, data.y_train
grid = torch.linspace(-1, 1, 100, dtype=X.dtype)[:, None]
fits = {}
for name in ("MeanField", "Chain"):
    pyro.set_rng_seed(0)
    model = models.RegressionDGP(X, hidden=(1,), num_inducing=M, noise_variance=0.01)
    guide = (dgp.guides.MeanField(model, inner_variance=1e-5) if name == "MeanField"
             else dgp.guides.Chain(model))
    result = dgp.fit(model, guide, X, y, num_steps=STEPS, lr=0.02, progress=False)
    fits[name] = (model, guide)
    print(f"{name}: ELBO {result.final_elbo:.1f} +- {result.final_elbo_stderr:.1f}, noise "
          f"variance {float(model.likelihood.variance.detach()):.4f}")

# %% [markdown]
# ## The DataTree
#
# `to_datatree` draws `DRAWS` samples of the guide (one chain: SVI draws are independent)
# and files them by role: `posterior` (the inducing outputs `u` of each layer),
# `posterior_predictive`, `log_likelihood` and `observed_data` at the data, `constant_data`
# (inputs, inducing inputs) and `layers`, each layer's function values `f` with their
# Gaussians and prior variances. With `grid=` the `layers` group holds *sample paths* on the
# grid: for each draw, every layer's `f` drawn jointly over the grid given that draw's `u`,
# so that each draw is one function per layer and one composition.

# %%
trees = {name: dgp.to_datatree(m, g, X, y, grid=grid, num_samples=DRAWS, seed=0)
         for name, (m, g) in fits.items()}
tree = trees["Chain"]
for group in tree.children:
    print(f"{group:22s}", dict(tree[group].sizes), list(tree[group].data_vars))

# %% [markdown]
# The posterior of the inducing outputs, summarised by ArviZ (a few of them):

# %%
print(azs.summary(tree, var_names=["layer1.u"], kind="stats").head(6))

# %% [markdown]
# ## Per-layer summaries: the collapse indicator
#
# `layer_summary` averages, per layer, the posterior variance of `f` over the points and
# divides it by the prior variance `k(x, x)` at the layer's own inputs: `var_ratio`. Near 1
# the layer is as uncertain as its prior; near 0 it is deterministic under the guide: the
# layer has *collapsed*, all the uncertainty of the fit sits in the other layers (or in the
# noise), and the compositions that explain the data equally well are reduced to one.
# Mean-field guides are known to do this to the inner layers of compositional fits
# (Ustyuzhaninov et al. 2020). The `kl` column is each layer's `KL(q(u) || p(u))`.

# %%
summaries = {name: dgp.layer_summary(t) for name, t in trees.items()}
for name, table in summaries.items():
    print(name)
    print(table.round(4), "\n")
for name, table in summaries.items():
    ratio = table.loc["layer1", "var_ratio"]
    print(f"{name}: the first layer keeps {ratio:.1%} of its prior variance"
          + (" (collapsed)" if ratio < 0.05 else ""))

# %% [markdown]
# ## Sample paths of each layer and of the composition
#
# Left: draws of the first layer `f1(x)`; middle: the second layer against its own input
# `f2(f1)`; right: the composition `f2(f1(x))` against `x`. Under a collapsed first layer
# all the left-hand paths coincide; with compositional uncertainty they spread, each change
# of the first layer matched by one of the second, while every composition still passes
# through the data.

# %%
for name, t in trees.items():
    print(name)
    display(Image(str(dgp.diagnostics.plot_layer_paths(t, FIGURES / f"{name}_paths.png"))))

# %% [markdown]
# Posterior against prior variance of each layer along `x` (log scale):

# %%
for name, t in trees.items():
    print(name)
    display(Image(str(dgp.diagnostics.plot_layer_variance(t, FIGURES / f"{name}_var.png"))))

# %% [markdown]
# ## The same draws with ArviZ and matplotlib directly
#
# The `layers` group is an ordinary xarray dataset, so any ArviZ plot reads it. Here the
# distribution of the first layer's value at three inputs under each guide: a collapsed
# layer shows a spike, compositional uncertainty a spread.

# %%
# the library's plot files switched matplotlib to Agg: back to inline figures
# %matplotlib inline
where = {"grid": [10, 50, 90]}
for name, t in trees.items():
    azp.plot_dist(t, group="layers", var_names=["layer1.f"], coords=where,
                  backend="matplotlib")
    plt.gcf().suptitle(f"{name}: layer1.f at grid points 10, 50, 90 (x = -0.8, 0, 0.8)", y=1.08)
    plt.show()

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3), sharey=True)
for ax, (name, t) in zip(axes, trees.items(), strict=True):
    f1 = t["layers"]["layer1.f"].isel(chain=0).values[..., 0]  # (draw, grid)
    ax.plot(grid[:, 0], f1.T, lw=0.5, alpha=0.5)
    ax.set_title(f"{name}: draws of the first layer f1(x)")
    ax.set_xlabel("x")
fig.tight_layout()
plt.show()
