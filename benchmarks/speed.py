"""Speed benchmark: one SVI step of a DSVI deep GP, pyro_dgp vs GPyTorch vs plain PyTorch.

The three implementations run the SAME model and the same step:

- a stack of 2 or 3 GP layers, ``D -> H -> ... -> 1``, ``M`` inducing inputs per layer shared by
  the layer's outputs, ARD RBF kernels (fixed linear PCA/identity mean on inner layers, zero mean
  on the last), a Gaussian likelihood;
- whitened mean-field ``q(u) = prod_l prod_d N(m, S S^T)`` with a full ``M x M`` factor per
  output; DSVI's collapsed estimator with one sample of each inner layer, the last layer's
  expected log-likelihood in closed form, the KL in closed form;
- one step is forward + backward + ``torch.optim.Adam`` update (and the loss read back as a
  float, as a training loop does), on a minibatch of ``B`` rows drawn from ``N`` synthetic
  points. All three use the Adam that :func:`pyro_dgp.fit` uses
  (:func:`pyro_dgp.training.make_optimizer`: fused where torch has it).

``ours``     :class:`pyro_dgp.DeepGP.regression` + :class:`pyro_dgp.guides.MeanField` +
             ``AnalyticKL_ELBO.differentiable_loss`` + Adam, as :func:`pyro_dgp.fit` runs it
             (the first step validated, later steps under ``pyro.validation_enabled(False)``).
``gpytorch`` ``gpytorch.models.deep_gps.DeepGP`` of ``DeepGPLayer``\\ s with
             ``CholeskyVariationalDistribution`` + whitened ``VariationalStrategy`` (inducing
             inputs and kernel hyperparameters shared by a layer's outputs, as ours; GPyTorch
             still computes ``K_ZZ``, ``K_ZX`` and the Cholesky factor once per output, its
             idiomatic ``DeepGPLayer``, where ours and plain compute them once per layer: a
             part of the ratio at H > 1), ``GaussianLikelihood``,
             ``DeepApproximateMLL(VariationalELBO)``, ``num_likelihood_samples(1)``,
             ``gpytorch.settings.debug(False)``. Differences that do not change the cost: no
             between-layer white noise (GPyTorch has no white kernel; ours adds 1e-5 to the
             diagonal), its own Cholesky jitter, softplus instead of exp for positive
             hyperparameters, and its ELBO is divided by N.
``graph``, ``plain-graph`` (CUDA only) ``ours`` and ``plain`` with the loss and its gradient
             recorded as a CUDA graph after the first step and replayed
             (:class:`pyro_dgp.train.cuda_graph.GraphedLoss`, what ``fit(cuda_graph=True)``
             does), the optimiser step eager.
``plain``    :class:`PlainDSVI`: the same model and estimator written directly with tensors and
             ``torch.linalg`` (no Pyro, no distributions): the floor. Its loss equals ours for
             the same parameters and noise draws (``tests/project/test_speed_bench.py``). In float64
             it evaluates the conditional variance in the same quadratic form as ours
             (``pyro_dgp.conditional``), so ours/plain measures the framework's overhead, not
             an algorithmic difference; GPyTorch uses the projected form (a triangular solve
             over the batch).

Time: the median over ``--repeats`` steps after ``--warmup`` steps, the three implementations
interleaved step by step (in rotating order) in one process per configuration, so that load
from other processes on the machine hits all three alike.

Peak memory: how far one step raises the process's memory above what it held before the step,
in a fresh process per (configuration, implementation). On CPU: the peak resident set size
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before the step; ``ru_maxrss`` where
that is not available) minus the resident set size before the step, with glibc's malloc told to
return large blocks to the system at once (``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``)
so that RSS follows what is live. On CUDA: ``torch.cuda.max_memory_allocated`` minus
``memory_allocated`` before the step. Either way it is the step's transient memory (autograd
graph, temporaries, gradients), not the parameters, the data or the optimizer state.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import results
import torch
from machine import cpu_model

from pyro_dgp.gp.conditional import quadratic_conditional
from pyro_dgp.train.training import make_objective, make_optimizer

__all__ = ["Config", "PlainDSVI", "build_parser", "main", "make_implementations"]

IMPLEMENTATIONS = ("ours", "svi", "gpytorch", "plain")
#: on a GPU also: ours' and the floor's step with the forward and backward pass replayed from a
#: CUDA graph (pyro_dgp.train.cuda_graph, as ``fit(cuda_graph=True)``)
GRAPHED = ("graph", "plain-graph")
#: on a GPU, an experiment towards the compute floor: ours' and the floor's loss compiled by
#: ``torch.compile`` (inductor's fused kernels, replayed from its own CUDA graphs)
COMPILED = ("compiled", "plain-compiled")


@dataclass(frozen=True)
class Config:
    num_layers: int
    num_inducing: int
    batch_size: int
    hidden_dim: int
    input_dim: int = 8
    num_data: int = 20_000
    dtype: str = "float64"
    device: str = "cpu"
    seed: int = 0

    @property
    def label(self) -> str:
        return (f"L={self.num_layers} M={self.num_inducing} B={self.batch_size} "
                f"H={self.hidden_dim}")


# ----------------------------------------------------------------------------------- data
def make_data(cfg: Config):
    """``N`` points in ``D`` dims: a smooth function of the inputs plus noise (kin8nm-sized)."""
    g = torch.Generator().manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    X = torch.randn(cfg.num_data, cfg.input_dim, generator=g, dtype=torch.float64)
    w = torch.randn(cfg.input_dim, generator=g, dtype=torch.float64) / math.sqrt(cfg.input_dim)
    y = torch.sin(2 * X @ w) + 0.3 * torch.cos(X[:, 0]) + 0.1 * torch.randn(
        cfg.num_data, generator=g, dtype=torch.float64)
    return X.to(cfg.device, dtype), y.to(cfg.device, dtype)


def make_batches(cfg: Config, count: int = 16) -> list[torch.Tensor]:
    """Minibatch index sets, the same for every implementation."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    B = min(cfg.batch_size, cfg.num_data)
    return [torch.randperm(cfg.num_data, generator=g)[:B].to(cfg.device) for _ in range(count)]


class _AdamStep:
    """One optimiser step on ``self.loss``: the same for every implementation timed."""

    def step(self, X, y) -> float:
        self.opt.zero_grad()
        loss = self.loss(X, y)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


# ----------------------------------------------------------------------------------- ours
class Ours(_AdamStep):
    name = "ours"

    def __init__(self, cfg: Config, X, y, lr: float = 0.01):
        import pyro

        import pyro_dgp as dgp

        self.pyro = pyro
        self.model = dgp.DeepGP.regression(
            X, y, num_layers=cfg.num_layers, hidden_dim=cfg.hidden_dim,
            num_inducing=cfg.num_inducing, seed=cfg.seed,
            train_mean=False,  # DSVI's fixed inner means: the maths GPyTorch and plain compute
        )
        self.guide = dgp.guides.MeanField(self.model)
        # as fit: AnalyticKL_ELBO, with one draw per step (the floor's maths)
        self.elbo = make_objective("auto", self.guide, num_particles=1)
        B = min(cfg.batch_size, cfg.num_data)
        with torch.no_grad():
            self.guide(X[:B], y[:B])
        params = {id(p): p for m in (self.model, self.guide) for p in m.parameters()}
        self.opt = make_optimizer(torch.optim.Adam, list(params.values()), lr)
        self.validated = False

    def loss(self, X, y) -> torch.Tensor:
        return self.elbo.differentiable_loss(self.model, self.guide, X, y)

    def step(self, X, y) -> float:
        # As pyro_dgp.fit: the first step runs with Pyro's validation, later ones without.
        with self.pyro.validation_enabled(not self.validated):
            loss = super().step(X, y)
        self.validated = True
        return loss


class PyroSVI:
    """The same model and guide trained the plain-Pyro way: ``pyro.infer.SVI`` with
    ``TraceMeanField_ELBO`` and ``pyro.optim.Adam``, Pyro's validation as Pyro leaves it."""

    name = "svi"

    def __init__(self, cfg: Config, X, y, lr: float = 0.01):
        import pyro
        from pyro.infer import SVI, TraceMeanField_ELBO

        import pyro_dgp as dgp

        pyro.set_rng_seed(cfg.seed)  # the same initial values as ours
        self.model = dgp.DeepGP.regression(
            X, y, num_layers=cfg.num_layers, hidden_dim=cfg.hidden_dim,
            num_inducing=cfg.num_inducing, seed=cfg.seed,
            train_mean=False,  # DSVI's fixed inner means: the maths GPyTorch and plain compute
        )
        self.guide = dgp.guides.MeanField(self.model)
        self.svi = SVI(self.model, self.guide, pyro.optim.Adam({"lr": lr}),
                       TraceMeanField_ELBO())

    def step(self, X, y) -> float:
        return float(self.svi.step(X, y))


# ------------------------------------------------------------------------------ gpytorch
class GPyTorch(_AdamStep):
    name = "gpytorch"

    def __init__(self, cfg: Config, X, y, init: Ours, lr: float = 0.01):
        import gpytorch
        from gpytorch.mlls import DeepApproximateMLL, VariationalELBO
        from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
        from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

        self.gpytorch = gpytorch

        class FixedLinearMean(gpytorch.means.Mean):
            """``m(x) = x W`` per output (DSVI's fixed inner-layer mean); x: (..., D, N, Din)."""

            def __init__(self, W):
                super().__init__()
                self.register_buffer("W", W.clone())

            def forward(self, x):
                # output d uses column d of W; x is repeated over the outputs at dim -3
                return (x * self.W.mT.unsqueeze(-2)).sum(-1)

        class Layer(DeepGPLayer):
            def __init__(self, Z, d_out, W, inner_variance):
                M, d_in = Z.shape
                batch = torch.Size([d_out]) if d_out is not None else torch.Size([])
                q = CholeskyVariationalDistribution(M, batch_shape=batch)
                strategy = VariationalStrategy(self, Z.clone(), q, learn_inducing_locations=True)
                super().__init__(strategy, d_in, d_out)
                self.mean_module = (FixedLinearMean(W) if W is not None
                                    else gpytorch.means.ZeroMean())
                rbf = gpytorch.kernels.RBFKernel(ard_num_dims=d_in)
                self.covar_module = gpytorch.kernels.ScaleKernel(rbf)  # values: copy_from
                self.inner_variance = inner_variance

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(
                    self.mean_module(x), self.covar_module(x))

        class Model(DeepGP):
            def __init__(self, layers):
                super().__init__()
                self.layers = torch.nn.ModuleList(layers)

            def forward(self, x):
                h = x
                for layer in self.layers:
                    h = layer(h)
                return h

        layers = []
        n = len(init.model.layers)
        for i, ol in enumerate(init.model.layers):
            last = i == n - 1
            W = None if last else ol.mean_function(
                torch.eye(ol.input_dim, dtype=X.dtype, device=X.device)).detach()
            layers.append(Layer(ol.inducing_points.detach(), None if last else ol.output_dim, W,
                                1e-5 if not last else None))
        self.model = Model(layers).to(device=X.device, dtype=X.dtype)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood().to(X.device, X.dtype)
        # hyperparameters, noise and q(u) as ours starts them (m = 0, S = 1e-5 I inner, I the
        # last); GPyTorch must not initialise q itself on its first call
        self.copy_from(init)
        for layer in self.model.layers:
            layer.variational_strategy.variational_params_initialized.fill_(1)
        self.mll = DeepApproximateMLL(VariationalELBO(self.likelihood, self.model,
                                                      num_data=cfg.num_data))
        self.model.train()
        self.likelihood.train()
        params = {id(p): p for m in (self.model, self.likelihood) for p in m.parameters()}
        self.opt = make_optimizer(torch.optim.Adam, list(params.values()), lr)

    def loss(self, X, y) -> torch.Tensor:
        gp = self.gpytorch
        with gp.settings.num_likelihood_samples(1), gp.settings.debug(False):
            return -self.mll(self.model(X), y)

    @torch.no_grad()
    def copy_from(self, ours: Ours) -> None:
        """Set every parameter GPyTorch's model shares with ``ours`` (inducing inputs, kernel
        hyperparameters, ``q(u)``, noise) to ours' current values: the two then compute the
        same model but for ours' between-layer white noise, which GPyTorch's has not."""
        for site, layer in zip(ours.guide.layer_sites, self.model.layers, strict=True):
            kern = site.layer.kernel
            rbf = kern.kernels[0] if hasattr(kern, "kernels") else kern
            strategy = layer.variational_strategy
            strategy.inducing_points.copy_(site.layer.inducing_points)
            layer.covar_module.base_kernel.lengthscale = rbf.lengthscale.reshape(1, -1)
            layer.covar_module.outputscale = rbf.variance
            loc, tril = ours.guide.q_params(site)
            q = strategy._variational_distribution
            q.variational_mean.copy_(loc.reshape(q.variational_mean.shape))
            q.chol_variational_covar.copy_(tril.reshape(q.chol_variational_covar.shape))
        self.likelihood.noise = ours.model.likelihood.variance



# --------------------------------------------------------------------------------- plain
def _sqdist(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``|a_i - b_j|^2`` for rows of ``A (n, d)``, ``B (m, d)``, by one matmul."""
    d2 = (A * A).sum(-1, keepdim=True) + (B * B).sum(-1) - 2 * A @ B.mT
    return d2.clamp_min(0)


class PlainDSVI(_AdamStep):
    """DSVI written directly with tensors: the floor the framework versions are held to.

    Parameters are stored unconstrained exactly as Pyro stores ours (``exp`` for positive
    values; ``tril(x, -1) + diag(exp(diag x))`` for Cholesky factors), so that the loss can be
    compared with ours to rounding error for the same parameter values.

    :param layers: per layer a dict with ``Z (M, Din)``, ``W (Din, Dout)`` or ``None`` (zero
        mean), ``variance``, ``lengthscale (Din,)``, ``white`` (between-layer noise) or ``None``,
        ``q_loc (Dout, M)``, ``q_tril (Dout, M, M)``.
    :param noise: Gaussian likelihood variance; :param num_data: N.
    """

    name = "plain"

    def __init__(self, layers: list[dict], noise, num_data: int, jitter: float | None = None,
                 lr: float = 0.01, quadratic: bool | None = None):
        def leaf(t):
            return t.detach().clone().requires_grad_(True)

        self.layers = []
        for spec in layers:
            tril = spec["q_tril"].detach()
            raw = tril.tril(-1) + torch.diag_embed(tril.diagonal(dim1=-2, dim2=-1).log())
            self.layers.append({
                "Z": leaf(spec["Z"]),
                "W": None if spec["W"] is None else spec["W"].detach().clone(),
                "log_variance": leaf(torch.as_tensor(spec["variance"]).log()),
                "log_lengthscale": leaf(torch.as_tensor(spec["lengthscale"]).log()),
                "log_white": None if spec["white"] is None
                else leaf(torch.as_tensor(spec["white"]).log()),
                "q_loc": leaf(spec["q_loc"]),
                "q_raw": leaf(raw),
            })
        self.log_noise = leaf(torch.as_tensor(noise).log())
        # the conditional's quadratic form (default: in float64, as ours)
        self.quadratic = quadratic if quadratic is not None else (
            self.log_noise.dtype == torch.float64)
        self.num_data = int(num_data)
        dtype = self.log_noise.dtype
        self.jitter = jitter if jitter is not None else (1e-6 if dtype == torch.float64 else 1e-5)
        self.params = [self.log_noise] + [
            v for layer in self.layers for k, v in layer.items() if k != "W" and v is not None
        ]
        self.opt = make_optimizer(torch.optim.Adam, self.params, lr)

    @classmethod
    def from_ours(cls, model, guide, lr: float = 0.01, quadratic: bool | None = None
                  ) -> PlainDSVI:
        """The same parameter values as a :class:`~pyro_dgp.DeepGP` + ``MeanField`` pair."""
        specs = []
        for site in guide.layer_sites:
            layer = site.layer
            kern = layer.kernel
            rbf, white = (kern.kernels[0], kern.kernels[1]) if hasattr(kern, "kernels") else (
                kern, None)
            eye = torch.eye(layer.input_dim, dtype=layer.inducing_points.dtype,
                            device=layer.inducing_points.device)
            loc, tril = guide.q_params(site)
            specs.append({
                "Z": layer.inducing_points,
                "W": None if layer._mean_kind == "zero" else layer.mean_function(eye).detach(),
                "variance": rbf.variance.detach(),
                "lengthscale": rbf.lengthscale.detach(),
                "white": None if white is None else white.variance.detach(),
                "q_loc": loc,
                "q_tril": tril,
            })
        return cls(specs, model.likelihood.variance.detach(), model.num_data,
                   jitter=model.layers[0].jitter, lr=lr, quadratic=quadratic)

    def loss(self, X: torch.Tensor, y: torch.Tensor, eps: list | None = None) -> torch.Tensor:
        """Negative ELBO: ``-(N/B) sum_i E log p(y_i | f_i) + sum_l KL(q(U^l) || p(U^l))``.

        :param eps: standard normal draws ``(B, D_l)`` per inner layer (default: fresh).
        """
        h = X
        kl = X.new_zeros(())
        n = len(self.layers)
        for i, p in enumerate(self.layers):
            ls = p["log_lengthscale"].exp()
            variance = p["log_variance"].exp()
            Zs, hs = p["Z"] / ls, h / ls
            c = Zs.detach().mean(0, keepdim=True)  # as ours: centred for the expansion's rounding
            Zs, hs = Zs - c, hs - c
            M = Zs.shape[0]
            kdiag = variance if p["log_white"] is None else variance + p["log_white"].exp()
            Kzz = variance * torch.exp(-0.5 * _sqdist(Zs, Zs))
            # K_ZZ + white I + jitter * mean(diag) I, all on the diagonal
            Kzz = Kzz + (kdiag - variance + self.jitter * kdiag) * torch.eye(
                M, dtype=Kzz.dtype, device=Kzz.device)
            L = torch.linalg.cholesky_ex(Kzz)[0]  # the floor: no check read back
            # var exp(-|z - x|^2 / 2) as exp(z~ . x~), one thin GEMM (as ours computes K_ZX)
            z_aug = torch.cat([Zs, p["log_variance"] - 0.5 * Zs.square().sum(-1, keepdim=True),
                               torch.ones_like(Zs[:, :1])], -1)
            x_aug = torch.cat([hs, torch.ones_like(hs[:, :1]),
                               -0.5 * hs.square().sum(-1, keepdim=True)], -1)
            Kzx = (z_aug @ x_aug.mT).exp_()  # (M, B), exp in place as ours
            raw = p["q_raw"]
            diag = raw.diagonal(dim1=-2, dim2=-1)
            S = raw.tril(-1) + torch.diag_embed(diag.exp())  # (D, M, M)
            m = p["q_loc"]  # (D, M)
            D = m.shape[0]
            if self.quadratic:
                # the quadratic form of pyro_dgp/conditional.py, as ours uses in float64:
                # var_d = k - k_x^T C_d k_x, C_d = L^-T (I - S_d S_d^T) L^-1
                eye = torch.eye(M, dtype=L.dtype, device=L.device)
                Linv = torch.linalg.solve_triangular(L, eye, upper=False)
                W = S.mT @ Linv
                C = Linv.mT @ Linv - W.mT @ W
                alpha = torch.linalg.solve_triangular(L.mT, m.mT, upper=True)  # (M, D)
                mean, quad = quadratic_conditional(Kzx, 0.5 * (C + C.mT), alpha)  # (B, D) each
                var = kdiag - quad
            else:
                A = torch.linalg.solve_triangular(L, Kzx, upper=False)  # (M, B)
                At = A.mT  # (B, M)
                mean = At @ m.mT  # (B, D)
                # |S_d^T a_i|^2 for every d by one GEMM against [S_1 | ... | S_D] (M, D M)
                R = At @ S.permute(1, 0, 2).reshape(M, D * M)  # (B, D M)
                var = (kdiag - (A * A).sum(0)).unsqueeze(-1) + R.square().unflatten(
                    -1, (D, M)).sum(-1)
            var = var.clamp_min(torch.finfo(var.dtype).tiny)
            if p["W"] is not None:
                mean = mean + h @ p["W"]
            # KL(N(m, S S^T) || N(0, I)) per output, summed
            kl = kl + 0.5 * (S.square().sum() + m.square().sum() - m.numel()) - diag.sum()
            if i < n - 1:
                e = torch.randn_like(mean) if eps is None else eps[i]
                h = mean + e * var.sqrt()
        noise = self.log_noise.exp()
        mu, v = mean.squeeze(-1), var.squeeze(-1)
        ell = -0.5 * (math.log(2 * math.pi) + noise.log()) - 0.5 * ((y - mu).square() + v) / noise
        return -(self.num_data / X.shape[0]) * ell.sum() + kl



class Graphed:
    """``impl``'s step with its loss and gradient replayed from a CUDA graph recorded after
    its first (eager) step, as :func:`pyro_dgp.fit` with ``cuda_graph=True``."""

    def __init__(self, impl, name: str):
        self.impl, self.name, self.graphed = impl, name, None

    def step(self, X, y) -> float:
        import pyro

        from pyro_dgp.train.cuda_graph import GraphedLoss

        if self.graphed is None:
            loss = self.impl.step(X, y)
            params = [p for group in self.impl.opt.param_groups for p in group["params"]]
            with pyro.validation_enabled(False):
                try:
                    self.graphed = GraphedLoss(self.impl.loss, params, (X, y))
                except RuntimeError as err:
                    raise RuntimeError(f"{self.name}: {err}") from err
            return loss
        loss = self.graphed(X, y)
        self.impl.opt.step()
        return float(loss)


class Compiled(_AdamStep):
    """``impl``'s step with its loss compiled by ``torch.compile`` (inductor's default mode:
    the elementwise work fused into fewer kernels); wrapped in :class:`Graphed`, the compiled
    loss and gradient are then recorded as one CUDA graph, as ``fit(cuda_graph=True)`` records
    the eager one. Pyro's validation is off, as after fit's first step."""

    def __init__(self, impl, name: str):
        self.impl, self.name, self.opt = impl, name, impl.opt
        self.compiled = torch.compile(impl.loss, dynamic=False)

    def loss(self, X, y) -> torch.Tensor:
        import pyro

        with pyro.validation_enabled(False):
            return self.compiled(X, y)


# ------------------------------------------------------------------------------- driver
def make_implementations(cfg: Config, names=IMPLEMENTATIONS):
    """Data, minibatch index sets and the implementations named (built from ours' init)."""
    import pyro

    X, y = make_data(cfg)
    batches = make_batches(cfg)
    pyro.clear_param_store()
    pyro.set_rng_seed(cfg.seed)
    ours = Ours(cfg, X, y)
    impls = {}
    for name in names:
        if name == "ours":
            impls[name] = ours
        elif name == "svi":
            impls[name] = PyroSVI(cfg, X, y)
        elif name == "gpytorch":
            impls[name] = GPyTorch(cfg, X, y, ours)
        elif name == "plain":
            impls[name] = PlainDSVI.from_ours(ours.model, ours.guide)
        elif name == "graph":
            pyro.set_rng_seed(cfg.seed)
            impls[name] = Graphed(Ours(cfg, X, y), name)
        elif name == "plain-graph":
            impls[name] = Graphed(PlainDSVI.from_ours(ours.model, ours.guide), name)
        elif name == "compiled":
            pyro.set_rng_seed(cfg.seed)
            impls[name] = Graphed(Compiled(Ours(cfg, X, y), name), name)
        elif name == "plain-compiled":
            impls[name] = Graphed(Compiled(PlainDSVI.from_ours(ours.model, ours.guide), name),
                                  name)
        else:
            raise ValueError(f"unknown implementation {name!r}")
    return X, y, batches, impls


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_config(cfg: Config, names, warmup: int, repeats: int) -> dict:
    """Median ms/step per implementation, the implementations interleaved."""
    X, y, batches, impls = make_implementations(cfg, names)
    order = list(impls)
    k = 0
    for _ in range(warmup):
        for name in order:
            idx = batches[k % len(batches)]
            impls[name].step(X[idx], y[idx])
        k += 1
    times = {name: [] for name in order}
    for r in range(repeats):
        rot = order[r % len(order):] + order[: r % len(order)]
        idx = batches[k % len(batches)]
        k += 1
        Xb, yb = X[idx], y[idx]
        for name in rot:
            _sync(cfg.device)
            t0 = time.perf_counter()
            impls[name].step(Xb, yb)
            _sync(cfg.device)
            times[name].append(1000 * (time.perf_counter() - t0))
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_guides(cfg: Config, guides, steps: int) -> dict[str, dict]:
    """ms per step of :func:`pyro_dgp.fit` (``fit``'s own ``seconds`` over ``steps`` steps,
    the first, validated step and the recording included) for each registry guide, eager and,
    on CUDA, with ``cuda_graph=True``. The amortized guides fit the AVDGP model they need
    (``gp.avdgp_regression``'s defaults: widths 16, 4 and M = 8, 4, 4), the others the
    configuration's DSVI model."""
    import pyro

    import pyro_dgp as dgp
    from pyro_dgp.guides.registry import LOCAL_INDUCING_GUIDES, make_guide

    X, y = make_data(cfg)

    def run(name, cuda_graph, num_steps):
        pyro.clear_param_store()
        if name in LOCAL_INDUCING_GUIDES:
            model = dgp.gp.avdgp_regression(X, y, seed=cfg.seed)
        else:
            model = dgp.DeepGP.regression(X, y, num_layers=cfg.num_layers,
                                          hidden_dim=cfg.hidden_dim,
                                          num_inducing=cfg.num_inducing, seed=cfg.seed)
        guide = make_guide(name, model)
        return dgp.fit(model, guide, X, y, num_steps=num_steps, batch_size=cfg.batch_size,
                       progress=False, final_elbo_particles=0, cuda_graph=cuda_graph,
                       seed=cfg.seed)

    try:
        run(guides[0], False, 3)  # libraries' first-call set-up, outside the timings
    except dgp.TrainingDivergedError:
        pass  # named per guide below
    out = {}
    for name in guides:
        row = {}
        for cuda_graph in (False, True) if cfg.device.startswith("cuda") else (False,):
            key = "graph" if cuda_graph else "eager"
            try:
                result = run(name, cuda_graph, steps)
            except dgp.TrainingDivergedError as err:  # a figure of its own: which guide fails
                row[key] = None
                row[f"{key}_error"] = str(err).split(";")[0]
                continue
            row[key] = 1000 * result.seconds / steps
            if cuda_graph:
                row["graph_steps"] = result.graph_steps
        out[name] = row
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_config(cfg: Config, name: str) -> float:
    """MiB by which one step (after one warm-up step) raises memory; see the module doc."""
    X, y, batches, impls = make_implementations(cfg, (name,))
    impl = impls[name]
    Xb, yb = X[batches[0]], y[batches[0]]
    impl.step(Xb, yb)  # warm-up: lazily created state (optimizer moments, caches)
    Xb, yb = X[batches[1]], y[batches[1]]
    if cfg.device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        impl.step(Xb, yb)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = _rss_bytes()
    ok = _reset_peak()
    impl.step(Xb, yb)
    return max(0, _peak_bytes(ok) - before) / 2**20


def _worker(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    cfg = Config(**spec["cfg"])
    if spec["kind"] == "guides":
        return time_guides(cfg, spec["names"], spec["steps"])
    if spec["kind"] == "time":
        return time_config(cfg, spec["names"], spec["warmup"], spec["repeats"])
    return {spec["names"][0]: memory_config(cfg, spec["names"][0])}


def _run_worker(spec: dict) -> dict:
    env = dict(os.environ)
    if spec["kind"] == "memory":
        # make glibc unmap freed large blocks at once, so that RSS follows live memory
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
        env.setdefault("MALLOC_TRIM_THRESHOLD_", "65536")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
        capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/speed.py",
        description="Time one SVI step of a DSVI deep GP: pyro_dgp vs GPyTorch vs plain PyTorch "
        "(same model, same step); see benchmarks/speed.py for what is measured.",
    )
    p.add_argument("--layers", type=int, nargs="+", default=[2, 3])
    p.add_argument("--num-inducing", "--inducing", dest="inducing",
                   type=int, nargs="+", default=[100, 128], help="M")
    p.add_argument("--batch", type=int, nargs="+", default=[1024, 10_000], help="B")
    p.add_argument("--hidden", type=int, nargs="+", default=None,
                   help="hidden widths H (default: min(30, D) and 1)")
    p.add_argument("--input-dim", type=int, default=8, help="D of the synthetic inputs")
    p.add_argument("--num-data", type=int, default=20_000, help="N of the synthetic data")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--impl", nargs="+", choices=IMPLEMENTATIONS + GRAPHED + COMPILED,
                   default=None,
                   help=f"default: {' '.join(IMPLEMENTATIONS)}, on CUDA also "
                        f"{' '.join(GRAPHED)}; {' '.join(COMPILED)} (torch.compile, CUDA "
                        "only) when named")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--guides", nargs="+", metavar="NAME",
                   help="instead: ms per step of fit with these registry guides, eager and (on "
                        "CUDA) with cuda_graph=True, over --steps steps")
    p.add_argument("--steps", type=int, default=300, help="steps per --guides timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-record", action="store_true",
                   help="do not append the rows to benchmarks/results/speed.jsonl")
    p.add_argument("--append", metavar="FILE", help="append a markdown section to FILE")
    p.add_argument("--note", default="", help="a line for the markdown section")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _table(rows: list[dict], names) -> list[str]:
    head = ["config"] + [f"{n} ms" for n in names]
    if "ours" in names and "gpytorch" in names:
        head.append("ours/gpytorch")
    if "ours" in names and "plain" in names:
        head.append("ours/plain")
    if "svi" in names and "plain" in names:
        head.append("svi/plain")
    if "graph" in names and "plain-graph" in names:
        head.append("graph/plain-graph")
    head += [f"{n} MiB" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        t, mem = r["ms"], r.get("mib", {})
        cells = [r["label"]] + [_fmt(t.get(n)) for n in names]
        if "ours" in names and "gpytorch" in names:
            cells.append(_fmt(t["ours"] / t["gpytorch"], ".2f"))
        if "ours" in names and "plain" in names:
            cells.append(_fmt(t["ours"] / t["plain"], ".2f"))
        if "svi" in names and "plain" in names:
            cells.append(_fmt(t["svi"] / t["plain"], ".2f"))
        if "graph" in names and "plain-graph" in names:
            cells.append(_fmt(t["graph"] / t["plain-graph"], ".2f"))
        cells += [_fmt(mem.get(n), ".0f") for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    hidden = args.hidden or sorted({min(30, args.input_dim), 1}, reverse=True)
    names = list(args.impl or IMPLEMENTATIONS + (GRAPHED if args.device != "cpu" else ()))
    if args.device == "cpu" and set(names) & set(GRAPHED + COMPILED):
        raise SystemExit(f"--impl {' '.join(GRAPHED + COMPILED)} need --device cuda")
    configs = [
        Config(L, M, B, H, args.input_dim, args.num_data, args.dtype, args.device, args.seed)
        for L in args.layers for M in args.inducing for B in args.batch for H in hidden
    ]
    if args.guides:
        return _guides_main(args, configs)
    rows = []
    for cfg in configs:
        spec = {"cfg": asdict(cfg), "threads": args.threads, "names": names,
                "warmup": args.warmup, "repeats": args.repeats, "kind": "time"}
        row = {"label": cfg.label, "ms": _run_worker(spec)}
        if not args.no_memory:
            row["mib"] = {}
            for n in names:
                row["mib"].update(_run_worker({**spec, "kind": "memory", "names": [n]}))
        rows.append(row)
        print("  ".join([cfg.label] + [f"{n} {row['ms'][n]:.1f} ms" for n in names]),
              file=sys.stderr, flush=True)
        if not args.no_record:  # each configuration as it is measured: a killed run keeps them
            results.record("speed", {**asdict(cfg), "threads": args.threads},
                           {"ms_per_step": row["ms"], **({"peak_mib": row["mib"]}
                                                         if "mib" in row else {})})
    table = _table(rows, names)
    print("\n".join(table))
    if args.append:
        cmd = "python benchmarks/speed.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        mem = ("peak MiB: the step's transient memory (RSS high-water mark over the step minus "
               "RSS before it, fresh process per cell)" if args.device == "cpu" else
               "peak MiB: torch.cuda.max_memory_allocated over the step minus allocated before")
        lines = [
            "",
            f"## Speed, {datetime.date.today().isoformat()}",
            "",
            f"- command: `{cmd}`",
            f"- machine: {cpu_model()}, {os.cpu_count()} cores, torch threads {args.threads}, "
            f"device {args.device}",
            f"- torch {torch.__version__}, {_versions()}",
            f"- data: synthetic, N = {args.num_data}, D = {args.input_dim}, {args.dtype}; "
            f"ms/step is the median of {args.repeats} interleaved steps after {args.warmup} "
            "warm-up steps",
            f"- {mem}",
        ]
        if args.note:
            lines.append(f"- {args.note}")
        lines += [""] + table + [""]
        with open(args.append, "a") as f:
            f.write("\n".join(lines))
    return 0


def _guides_main(args, configs) -> int:
    """``--guides``: one worker per configuration, one line per guide."""
    print("| config | guide | eager ms | cuda_graph ms | eager / cuda_graph |")
    print("|---|---|---|---|---|")
    for cfg in configs:
        spec = {"cfg": asdict(cfg), "threads": args.threads, "names": list(args.guides),
                "steps": args.steps, "kind": "guides"}
        for name, row in _run_worker(spec).items():
            graph = row.get("graph")
            eager = row.get("eager")
            ratio = None if graph is None or eager is None else eager / graph
            errors = "; ".join(row[k] for k in ("eager_error", "graph_error") if k in row)
            print(f"| {cfg.label} | {name} | {_fmt(eager, '.2f')} | {_fmt(graph, '.2f')} | "
                  f"{_fmt(ratio, '.1f')} |" + (f" {errors}" if errors else ""), flush=True)
            if not args.no_record:
                results.record("speed_guides", {**asdict(cfg), "threads": args.threads,
                                                "guide": name, "steps": args.steps},
                               {"ms_per_step": {k: v for k, v in row.items()
                                                if k in ("eager", "graph")},
                                **{k: v for k, v in row.items() if k.endswith("_error")},
                                **({"graph_steps": row["graph_steps"]}
                                   if "graph_steps" in row else {})})
    return 0


def _versions() -> str:
    out = []
    for mod in ("pyro", "gpytorch"):
        try:
            out.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            pass
    return ", ".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
