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
# # 1. A deep GP written by hand, trained with plain `pyro.infer.SVI`
#
# A GP layer of `pyro_dgp` is a `PyroModule` that owns two sample sites: `<layer>.u`, its
# inducing outputs, and `<layer>.f`, its function values at the layer's inputs. A deep GP is
# then ordinary Pyro code: call one layer on the output of another, and observe the last one
# with any likelihood you like. This notebook writes such a model from scratch, a warping GP
# feeding a periodic GP, fits it to a chirp with Pyro's own `SVI` loop, and predicts with
# Pyro's own `Predictive`.
#
# Set `PYRO_DGP_NOTEBOOK_SIZE=small` for a quick run (CI does); the default is the full run.

# %%
import os

import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer import SVI, Predictive, TraceMeanField_ELBO
from pyro.nn import PyroModule, PyroParam

import pyro_dgp as dgp

SMALL = os.environ.get("PYRO_DGP_NOTEBOOK_SIZE", "full") == "small"
STEPS = 400 if SMALL else 4000
torch.set_num_threads(1)  # small matrices: more threads only spin
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data: a chirp `y = sin(2 pi (x + x^3 / 2)) + noise`
#
# The compositional toy of `pyro_dgp.datasets`: a smooth monotone warp followed by a periodic
# function. A stationary GP fits it poorly; the composition of the two explains it.

# %%
data = dgp.datasets.compositional_toy(n_train=50, n_test=200, noise=0.05)
X, y = data.X_train, data.y_train  # (50, 1) and (50,), float64
plt.figure(figsize=(6, 2.5))
plt.plot(X[:, 0], y, "k.")
plt.title("training data")
plt.show()

# %% [markdown]
# ## The model
#
# `warp` maps `x` to `h` with an identity mean (so it starts as the identity), `g` is a
# periodic GP of `h`. Each layer call samples `<layer>.u` and then `<layer>.f` inside a
# data plate; the observation noise is a learned parameter. Nothing else is needed: no
# guide-specific code, no special likelihood class.

# %%
class WarpedPeriodic(PyroModule):
    def __init__(self, Z):
        super().__init__()
        self.warp = dgp.GPLayer(1, 1, inducing_points=Z, kernel=dgp.kernels.RBF(1),
                                mean="identity")
        self.g = dgp.GPLayer(1, 1, inducing_points=Z.clone(),
                             kernel=dgp.kernels.Periodic(1, period=1.0))
        self.noise = PyroParam(Z.new_tensor(0.1), constraints.positive)

    def forward(self, x, y=None):
        plate = pyro.plate("data", x.shape[-2], dim=-1)
        h = self.warp(x, plate=plate)  # samples warp.u, then warp.f at x: (N, 1)
        f = self.g(h, plate=plate)  # samples g.u, then g.f at h
        with plate:
            return pyro.sample("y", dist.Normal(f.squeeze(-1), self.noise), obs=y)


Z = torch.linspace(-1, 1, 15, dtype=X.dtype)[:, None]
model = WarpedPeriodic(Z)

# %% [markdown]
# ## A guide, and Pyro's SVI loop
#
# `MeanField` is one Gaussian `q(u)` per layer with the collapsed estimator of Salimbeni and
# Deisenroth 2017. It finds the layers by running the model once, so it works on this
# hand-written model unchanged. `inner_variance=1e-5` starts the warp's `q(u)` nearly
# deterministic (Salimbeni and Deisenroth's initialisation), so that the periodic layer first
# sees a clean copy of `x` rather than a warp drawn from the prior. The ELBO is Pyro's
# `TraceMeanField_ELBO` (closed-form KLs). The optimiser is Adam with its learning rate decayed
# to 1% over the run (`ClippedAdam`'s `lrd`, a factor per step): at a constant rate of 0.02 a
# long run drifts late (the loss climbs back and the noise grows), as `pyro_dgp.fit`'s default
# schedule also avoids.

# %%
guide = dgp.guides.MeanField(model, inner_variance=1e-5)
optim = pyro.optim.ClippedAdam({"lr": 0.02, "lrd": 0.01 ** (1 / STEPS)})
svi = SVI(model, guide, optim, TraceMeanField_ELBO())
losses = [svi.step(X, y) for _ in range(STEPS)]
noise_sd = float(model.noise.detach())
print(f"loss: first {losses[0]:.1f}, last {losses[-1]:.1f}; noise sd {noise_sd:.3f} (true 0.05)")
if SMALL:
    print(f"the small run's {STEPS} steps stop before the noise is learned; the full run's "
          "4,000 steps bring it near the true 0.05")
plt.figure(figsize=(6, 2.5))
plt.plot(losses)
plt.yscale("symlog")
plt.xlabel("step")
plt.ylabel("-ELBO")
plt.show()

# %% [markdown]
# ## Predictions with Pyro's `Predictive`
#
# `Predictive` runs the guide and then the model on its draws. The guide's `g.f` site holds
# the last layer's function values at the new inputs, `y` the noisy observations.

# %%
grid = data.X_test
predictive = Predictive(model, guide=guide, num_samples=200, return_sites=["g.f", "y"])
with torch.no_grad():
    draws = predictive(grid)
f = draws["g.f"].reshape(200, -1)
y_draws = draws["y"].reshape(200, -1)
lo, hi = torch.quantile(y_draws, torch.tensor([0.05, 0.95], dtype=y.dtype), dim=0)
plt.figure(figsize=(6, 3))
plt.fill_between(grid[:, 0], lo, hi, alpha=0.3, label="90% predictive interval")
plt.plot(grid[:, 0], f.mean(0), label="posterior mean of f")
plt.plot(X[:, 0], y, "k.", label="data")
plt.legend(fontsize=8)
plt.show()
rmse = float((f.mean(0) - data.y_test).square().mean().sqrt())
print(f"test RMSE of the mean: {rmse:.3f}")

# %% [markdown]
# The same model and guide work with everything else in `pyro_dgp`: `dgp.fit` (progress,
# checkpoints, minibatches), `dgp.to_datatree` for ArviZ (notebook 3), and any other guide
# family (notebook 2). The gallery in `models/` holds more models written this way.
