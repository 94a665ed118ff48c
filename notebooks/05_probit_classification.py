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
# # 5. Classification with a probit deep GP
#
# `models.ProbitDGP` (the gallery, `models/classification.py`) is a deep GP whose last layer
# `f` gives `p(y = 1 | x) = Phi(f(x))`. The likelihood scores `E log Phi(+-f)` under the
# Gaussian of each guide draw of `f` by Gauss-Hermite quadrature, and the predictive
# `p(y = 1) = E Phi(f) = Phi(m / sqrt(1 + v))` in closed form per draw; the mixture over draws
# is a Bernoulli whose mean is the predicted probability.
#
# `PYRO_DGP_NOTEBOOK_SIZE=small` runs a quick version (CI); the default is the full run.

# %%
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pyro
import torch

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
N, M, STEPS = (100, 10, 150) if SMALL else (400, 30, 3000)
torch.set_num_threads(1)
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data: two interleaving half-moons

# %%
data = dgp.datasets.classification_2d(n_train=N, n_test=400, noise=0.15, seed=0)
X, y = data.X_train, data.y_train  # (N, 2), labels 0/1 as floats
plt.figure(figsize=(4, 3))
plt.scatter(X[:, 0], X[:, 1], c=y, cmap="coolwarm", s=10)
plt.show()

# %% [markdown]
# ## Model, guide and fit
#
# Two layers (2 -> 2 -> 1), `M` inducing points each; the `Chain` guide couples the two
# layers' inducing outputs. Any other family fits the same model (notebook 2).

# %%
model = models.ProbitDGP(X, hidden=(2,), num_inducing=M)
guide = dgp.guides.Chain(model)
result = dgp.fit(model, guide, X, y, num_steps=STEPS, lr=0.03, progress=False)
print(f"ELBO {result.final_elbo:.1f} +- {result.final_elbo_stderr:.1f}")

# %% [markdown]
# ## Test metrics
#
# Accuracy (the predicted probability thresholded at 0.5), the negative log predictive
# density (NLL, nats per point), the area under the ROC curve, and the Brier score, which is
# the CRPS of a binary predictive.

# %%
pred = dgp.predict(model, guide, data.X_test, num_samples=64, seed=0)
metrics = {"accuracy": dgp.metrics.accuracy(pred, data.y_test),
           "nll": dgp.metrics.nll(pred, data.y_test),
           "auc": dgp.metrics.auc(pred, data.y_test),
           "brier": dgp.metrics.crps(pred, data.y_test)}
print({k: round(v, 3) for k, v in metrics.items()})

# %% [markdown]
# ## The predicted probability
#
# `p(y = 1 | x)` on a grid, with the 0.5 contour (the decision boundary) and the training
# points. Far from the data the probability returns towards 0.5: the GP's uncertainty.

# %%
g = torch.linspace(-2.0, 3.0, 60, dtype=X.dtype)
gx, gy = torch.meshgrid(g, g, indexing="xy")
grid = torch.stack([gx.reshape(-1), gy.reshape(-1)], -1)
p = dgp.predict(model, guide, grid, num_samples=64, seed=0).mean.reshape(60, 60)
plt.figure(figsize=(5, 4))
plt.contourf(gx, gy, p, levels=20, cmap="coolwarm", alpha=0.8)
plt.colorbar(label="p(y = 1)")
plt.contour(gx, gy, p, levels=[0.5], colors="k")
plt.scatter(X[:, 0], X[:, 1], c=y, cmap="coolwarm", edgecolors="k", s=12)
plt.show()
