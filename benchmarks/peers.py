"""GPyTorch's deep GPs beside ours on the UCI splits, at equal steps, batch, M, dtype and device.

Four peers, each trained on the same split (``pyro_dgp.datasets.load``, inputs and targets
standardised on the training part, as ``benchmarks/uci.py`` loads it) and scored by the same
code (:mod:`pyro_dgp.prediction.metrics` on the peer's predictive mixture):

``deepgp``
    GPyTorch's ``DeepGP`` as its Deep GP tutorial builds it (``examples/05_Deep_Gaussian_
    Processes/Deep_Gaussian_Processes.ipynb``): hidden layers of width 10 with a linear mean,
    a last layer with a constant mean, ``ScaleKernel(RBFKernel)`` with ARD, Cholesky
    variational distributions at standard-normal inducing inputs (learned), a Gaussian
    likelihood, ``DeepApproximateMLL(VariationalELBO)``, Adam at 0.01 and 10 likelihood
    samples in training and prediction. Its predictive is the uniform mixture over those 10
    draws of the hidden layers, each a Gaussian (the last layer's marginal plus the noise).
``deepgp-shared``
    A diagnostic, not a tutorial's model: ``deepgp`` with one kernel per hidden layer shared
    by its GPs (as in Salimbeni and Deisenroth 2017's model and ours) instead of a kernel
    per GP, to measure what the tutorial's per-GP kernels add.
``dspp``
    GPyTorch's ``DSPP`` (Jankowiak et al. 2020) as its DSPP tutorial builds it
    (``Deep_Sigma_Point_Processes.ipynb``): hidden width 3, Q = 8 quadrature sites,
    mean-field variational distributions, ``ScaleKernel(MaternKernel)`` (nu 5/2) with ARD,
    the first layer's inducing inputs from k-means (``scipy.cluster.vq.kmeans2``), the last
    layer's standard normal, ``DeepPredictiveLogLikelihood`` with beta 0.05, Adam at 0.01
    divided by 10 at the tutorial's milestones (epochs 20, 150 and 300 of its 400, here the
    same fractions of the steps). Its predictive is the mixture over the Q sites weighted by
    the learned quadrature weights.
``ours``
    ``pyro_dgp``: ``DeepGP.regression``, the mean-field guide and ``fit`` with their defaults
    (the package's learning rate, schedule and draws per step, recorded as ``particles``),
    predicted with S = 100 draws.
``ours-per-output``
    ``ours`` with ``DeepGP.regression(..., kernel_per_output=True)``: a kernel per inner GP,
    as in GPyTorch's tutorial, the other way round from ``deepgp-shared``.

Every peer takes ``--steps`` Adam steps on minibatches of ``min(--batch, N)`` points with
``--inducing`` inducing points per GP. The tutorials' other settings (widths, samples,
kernels, schedules) are theirs, not tuned here. Scores: test log-likelihood, RMSE, CRPS and
95% coverage in the original units of y, the NLL of the standardised targets, and seconds and
milliseconds per step of training.

One line per finished (dataset, split, peer) goes to ``benchmarks/results/uci_gpytorch.jsonl``
(:func:`results.record`); a run whose settings are already there is skipped (``--force`` runs
it again). ``python benchmarks/report.py`` shows the mean (standard error) over the splits.

Run ``python benchmarks/peers.py --help``.
"""

from __future__ import annotations

import argparse
import sys
import time

import gpytorch
import pyro
import results
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean
from gpytorch.mlls import DeepApproximateMLL, DeepPredictiveLogLikelihood, VariationalELBO
from gpytorch.models.deep_gps import DeepGPLayer
from gpytorch.models.deep_gps.dspp import DSPP, DSPPLayer
from gpytorch.variational import (
    CholeskyVariationalDistribution,
    MeanFieldVariationalDistribution,
    VariationalStrategy,
)
from scipy.cluster.vq import kmeans2
from torch.distributions import Normal

from pyro_dgp import datasets
from pyro_dgp.gp.deep_gp import DeepGP as PackageDeepGP
from pyro_dgp.guides import MeanField
from pyro_dgp.infer.objectives import ELBO_PARTICLES
from pyro_dgp.prediction import DrawMixturePredictive, predict
from pyro_dgp.prediction.metrics import coverage, crps, nll, rmse
from pyro_dgp.train.training import fit

__all__ = ["BENCHMARK", "PEERS", "build_parser", "main", "mixture_scores", "run_peer"]

BENCHMARK = "uci_gpytorch"
PEERS = ("deepgp", "deepgp-shared", "dspp", "ours", "ours-per-output")
#: the peers that are this package (trained by ``fit``, ``particles`` in their settings)
OURS = ("ours", "ours-per-output")
#: the peers run unless ``--peers`` says otherwise (``deepgp-shared`` is a diagnostic)
DEFAULT_PEERS = ("deepgp", "dspp", "ours")
#: the tutorials' settings: hidden widths, likelihood samples, quadrature sites, beta
DEEPGP_WIDTH, DEEPGP_SAMPLES = 10, 10
DSPP_WIDTH, DSPP_SITES, DSPP_BETA = 3, 8, 0.05
#: the DSPP tutorial's learning-rate drops (x0.1) at epochs 20, 150 and 300 of 400
DSPP_MILESTONES = (20 / 400, 150 / 400, 300 / 400)
LR = 0.01
#: test points per forward pass at prediction (the tutorials' test loaders)
TEST_CHUNK = 1024
#: predictive draws of ``ours`` (benchmarks/uci.py's protocol)
OUR_SAMPLES = 100


# ------------------------------------------------------------------------- GPyTorch's models
class TutorialLayer(DeepGPLayer):
    """A layer of the Deep GP tutorial: ``output_dims`` GPs (``None``: one, squeezed) of an
    ``input_dims``-dimensional input, ``num_inducing`` standard-normal inducing inputs each;
    ``shared_kernel``: one kernel for the layer's GPs (the tutorial's: one per GP)."""

    def __init__(self, input_dims: int, output_dims: int | None, num_inducing: int,
                 linear_mean: bool, shared_kernel: bool = False):
        batch = torch.Size([]) if output_dims is None else torch.Size([output_dims])
        kernel_batch = torch.Size([]) if shared_kernel else batch
        inducing = torch.randn(*batch, num_inducing, input_dims)
        q_u = CholeskyVariationalDistribution(num_inducing_points=num_inducing,
                                              batch_shape=batch)
        strategy = VariationalStrategy(self, inducing, q_u, learn_inducing_locations=True)
        super().__init__(strategy, input_dims, output_dims)
        # the tutorial's linear mean has no batch shape: one map shared by the hidden GPs
        self.mean_module = LinearMean(input_dims) if linear_mean else ConstantMean(
            batch_shape=batch)
        self.covar_module = ScaleKernel(
            RBFKernel(batch_shape=kernel_batch, ard_num_dims=input_dims),
            batch_shape=kernel_batch, ard_num_dims=None)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


class TutorialDeepGP(gpytorch.models.deep_gps.DeepGP):
    """The Deep GP tutorial's model, ``num_layers - 1`` hidden layers of ``width`` GPs."""

    def __init__(self, input_dim: int, num_layers: int, width: int, num_inducing: int,
                 shared_kernel: bool = False):
        super().__init__()
        dims = [input_dim] + [width] * (num_layers - 1)
        self.layers = torch.nn.ModuleList(
            [TutorialLayer(d, width, num_inducing, linear_mean=True,
                           shared_kernel=shared_kernel) for d in dims[:-1]]
            + [TutorialLayer(dims[-1], None, num_inducing, linear_mean=False)])
        self.likelihood = GaussianLikelihood()

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class SigmaPointLayer(DSPPLayer):
    """A layer of the DSPP tutorial: mean-field q(u), Matern 5/2 ARD kernel; ``inducing``
    ``(M, D)`` shared start of the GPs (jittered by 0.01 each) or ``None`` (standard normal)."""

    def __init__(self, input_dims: int, output_dims: int | None, num_inducing: int,
                 inducing: torch.Tensor | None, linear_mean: bool, sites: int):
        batch = torch.Size([]) if output_dims is None else torch.Size([output_dims])
        if inducing is None:
            inducing = torch.randn(*batch, num_inducing, input_dims)
        elif output_dims is not None:
            inducing = inducing.expand(output_dims, *inducing.shape).clone()
            inducing = inducing + 0.01 * torch.randn_like(inducing)
        q_u = MeanFieldVariationalDistribution(num_inducing_points=inducing.shape[-2],
                                               batch_shape=batch)
        strategy = VariationalStrategy(self, inducing, q_u, learn_inducing_locations=True)
        super().__init__(strategy, input_dims, output_dims, sites)
        self.mean_module = (LinearMean(input_dims, batch_shape=batch) if linear_mean
                            else ConstantMean(batch_shape=batch))
        self.covar_module = ScaleKernel(MaternKernel(batch_shape=batch, ard_num_dims=input_dims),
                                        batch_shape=batch, ard_num_dims=None)

    def forward(self, x, mean_input=None, **kwargs):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


class TutorialDSPP(DSPP):
    """The DSPP tutorial's model, ``num_layers - 1`` hidden layers of ``width`` GPs; the first
    layer's inducing inputs start at ``inducing (M, D)``."""

    def __init__(self, inducing: torch.Tensor, num_layers: int, width: int, num_inducing: int,
                 sites: int):
        super().__init__(sites)
        dims = [inducing.shape[-1]] + [width] * (num_layers - 1)
        starts = [inducing] + [None] * (num_layers - 2)
        self.layers = torch.nn.ModuleList(
            [SigmaPointLayer(d, width, num_inducing, z, True, sites)
             for d, z in zip(dims[:-1], starts, strict=True)]
            + [SigmaPointLayer(dims[-1], None, num_inducing, None, False, sites)])
        self.likelihood = GaussianLikelihood()

    def forward(self, x, **kwargs):
        for layer in self.layers:
            x = layer(x, **kwargs)
        return x


# --------------------------------------------------------------------------------- training
def minibatches(N: int, B: int, steps: int, generator: torch.Generator,
                device: torch.device | None = None):
    """``steps`` index tensors on ``device`` of a reshuffled pass over ``range(N)`` in batches
    of ``B``, the last of each pass shorter (a ``DataLoader(shuffle=True)``'s order)."""
    done = 0
    while done < steps:
        for idx in torch.randperm(N, generator=generator).to(device).split(B):
            if done == steps:
                return
            done += 1
            yield idx


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_gpytorch(model, objective, data, args, seed: int, scheduler_milestones=()):
    """Adam at :data:`LR` over ``args.steps`` minibatches; returns the training seconds."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.999))
    milestones = sorted({max(1, round(f * args.steps)) for f in scheduler_milestones})
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.1)
    X, y = data.X_train, data.y_train
    B = min(args.batch, data.num_train)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    _sync(X.device)
    t0 = time.perf_counter()
    with gpytorch.settings.num_likelihood_samples(DEEPGP_SAMPLES):
        for idx in minibatches(data.num_train, B, args.steps, generator, X.device):
            optimizer.zero_grad()
            loss = -objective(model(X[idx]), y[idx])
            loss.backward()
            optimizer.step()
            schedule.step()
    _sync(X.device)
    return time.perf_counter() - t0


def _build_deepgp(data, args, shared_kernel: bool = False):
    model = TutorialDeepGP(data.input_dim, args.layers, DEEPGP_WIDTH, _inducing(args, data),
                           shared_kernel)
    model = model.to(device=data.X_train.device, dtype=data.X_train.dtype)
    return model, DeepApproximateMLL(VariationalELBO(model.likelihood, model, data.num_train))


def _kmeans_start(X: torch.Tensor, M: int) -> torch.Tensor:
    """``(M, D)`` k-means centres of ``X`` (k-means from M random rows, as the DSPP tutorial
    starts its first layer), in ``X``'s dtype and device."""
    rows = torch.randperm(min(100_000, X.shape[0]))[:M]
    x = X.detach().cpu().double().numpy()
    centres, _ = kmeans2(x, x[rows.numpy()], minit="matrix")
    return torch.as_tensor(centres, dtype=X.dtype, device=X.device)


def _build_dspp(data, args):
    M = _inducing(args, data)
    start = _kmeans_start(data.X_train, M).cpu()
    model = TutorialDSPP(start, args.layers, DSPP_WIDTH, M, DSPP_SITES)
    model = model.to(device=data.X_train.device, dtype=data.X_train.dtype)
    objective = DeepPredictiveLogLikelihood(model.likelihood, model, num_data=data.num_train,
                                            beta=DSPP_BETA)
    return model, objective


def _inducing(args, data) -> int:
    return min(args.inducing, data.num_train)


# -------------------------------------------------------------------------------- prediction
def _gpytorch_components(model, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(K, T)`` means and variances of ``y`` (noise included) of the model's K mixture
    components at the ``T`` test inputs, in chunks of :data:`TEST_CHUNK` points."""
    means, variances = [], []
    model.eval()
    with (torch.no_grad(), gpytorch.settings.num_likelihood_samples(DEEPGP_SAMPLES),
          gpytorch.settings.fast_computations(log_prob=False, solves=False)):
        for x in X.split(TEST_CHUNK):
            y_dist = model.likelihood(model(x))
            means.append(y_dist.mean)
            variances.append(y_dist.variance)
    return torch.cat(means, -1), torch.cat(variances, -1)


def gpytorch_predictive(model, X: torch.Tensor) -> DrawMixturePredictive:
    """The predictive of a trained GPyTorch deep GP at ``X (T, D)``: a mixture of normals per
    point, uniform over the likelihood samples of a ``DeepGP``, weighted by the learned
    quadrature weights of a ``DSPP`` (standardised units)."""
    mean, var = _gpytorch_components(model, X)
    weights = model.quad_weights.detach().exp() if isinstance(model, DSPP) else None
    return DrawMixturePredictive(Normal(mean, var.sqrt()), weights=weights)


def mixture_scores(pred, data) -> dict[str, float]:
    """Scores of a predictive in standardised units against the split's test targets: test
    log-likelihood, NLL, RMSE, CRPS and 95% coverage in the original units of y, and the NLL
    of the standardised targets (``nll_std``)."""
    y = data.y_mean + data.y_std * data.y_test
    original = pred.rescale(data.y_mean, data.y_std)
    test_nll = nll(original, y)
    return {"test_loglik": -test_nll, "nll": test_nll, "rmse": rmse(original, y),
            "crps": crps(original, y), "coverage95": coverage(original, y, 0.95),
            "nll_std": nll(pred, data.y_test)}


# ------------------------------------------------------------------------------------ peers
def _run_gpytorch(peer: str, data, args, seed: int) -> tuple[DrawMixturePredictive, float]:
    torch.manual_seed(seed)
    if peer == "dspp":
        model, objective = _build_dspp(data, args)
    else:
        model, objective = _build_deepgp(data, args, shared_kernel=peer == "deepgp-shared")
    milestones = DSPP_MILESTONES if peer == "dspp" else ()
    seconds = _train_gpytorch(model, objective, data, args, seed, milestones)
    torch.manual_seed(seed)
    return gpytorch_predictive(model, data.X_test), seconds


def _run_ours(data, args, seed: int, kernel_per_output: bool = False) -> tuple:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model = PackageDeepGP.regression(data.X_train, data.y_train, num_layers=args.layers,
                                     num_inducing=_inducing(args, data), seed=seed,
                                     kernel_per_output=kernel_per_output)
    guide = MeanField(model)
    _sync(data.X_train.device)
    result = fit(model, guide, data.X_train, data.y_train, num_steps=args.steps,
                 batch_size=min(args.batch, data.num_train), seed=seed, progress=False)
    _sync(data.X_train.device)
    pred = predict(model, guide, data.X_test, num_samples=OUR_SAMPLES, seed=seed)
    return pred, result.seconds, model


def hidden_width(peer: str, model=None) -> int:
    """The hidden layers' width of a peer (``ours``: the width ``DeepGP.regression`` chose)."""
    if peer in ("deepgp", "deepgp-shared"):
        return DEEPGP_WIDTH
    if peer == "dspp":
        return DSPP_WIDTH
    return model.layers[0].output_dim


def run_peer(peer: str, data, args, seed: int) -> tuple[dict, dict]:
    """Train and score one peer on one split; returns ``(settings extras, figures)``."""
    t0 = time.perf_counter()
    if peer in OURS:
        pred, seconds, model = _run_ours(data, args, seed, peer == "ours-per-output")
        width = hidden_width(peer, model)
    else:
        pred, seconds = _run_gpytorch(peer, data, args, seed)
        width = hidden_width(peer)
    figures = mixture_scores(pred, data)
    figures.update({"seconds": time.perf_counter() - t0, "seconds_fit": seconds,
                    "ms_per_step": 1000 * seconds / args.steps,
                    "components": pred.num_samples})
    return {"hidden_width": width}, figures


# ---------------------------------------------------------------------------------- command
def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    p = argparse.ArgumentParser(
        prog="python benchmarks/peers.py", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["kin8nm"],
                   help="UCI set names or aliases (or a synthetic set: its split is the seed)")
    p.add_argument("--splits", nargs="+", type=int, default=[0], help="split indices")
    p.add_argument("--peers", nargs="+", choices=PEERS, default=list(DEFAULT_PEERS))
    p.add_argument("--steps", type=int, default=3000, help="Adam steps of every peer")
    p.add_argument("--batch", type=int, default=1000, help="minibatch size (capped at N)")
    p.add_argument("--inducing", type=int, default=100,
                   help="inducing points M per GP (capped at N)")
    p.add_argument("--layers", type=int, default=2, help="GP layers (at least 2)")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--seed", type=int, default=0, help="base seed; split k uses seed + k")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--data-dir", default=None,
                   help=f"folder holding uci/ (default: ${datasets.ENV_VAR}, then the cache)")
    p.add_argument("--no-record", action="store_true",
                   help="record nothing (and skip nothing already recorded)")
    p.add_argument("--force", action="store_true", help="rerun runs already recorded")
    return p


def _check(args, parser) -> None:
    if args.layers < 2:
        parser.error(f"--layers must be at least 2 (GPyTorch's deep GPs), got {args.layers}")
    for name in ("steps", "batch", "inducing"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch finds no CUDA device; use --device cpu")


def _settings(args, dataset: str, split: int, peer: str, width: int) -> dict:
    return {"dataset": dataset, "split": split, "peer": peer, "layers": args.layers,
            "steps": args.steps, "batch": args.batch, "inducing": args.inducing,
            "hidden_width": width, "dtype": args.dtype, "device": args.device,
            "seed": args.seed, "gpytorch": gpytorch.__version__,
            # fit's default draws per step of the mean-field guide's ELBO
            **({"particles": ELBO_PARTICLES} if peer in OURS else {})}


def _recorded(args) -> set[tuple]:
    """``(dataset, split, peer, settings but the hidden width)`` of the recorded runs."""
    if args.no_record or args.force:
        return set()
    return {_identity(rec["settings"]) for rec in results.read(BENCHMARK)}


def _identity(settings: dict) -> str:
    return repr(sorted((k, v) for k, v in settings.items() if k != "hidden_width"))


def _load(name: str, split: int, args):
    data = datasets.load(name, split=split, data_dir=args.data_dir)
    return data.to(device=args.device, dtype=getattr(torch, args.dtype))


def _data_figures(name: str, data, args) -> dict:
    """The split's sizes, and the set's number of standard splits (a UCI set's only)."""
    out = {"num_train": data.num_train, "num_test": data.num_test}
    try:
        out["num_splits"] = datasets.num_splits(name, data_dir=args.data_dir)
    except ValueError:  # a synthetic set: any seed is a split
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every (dataset, split, peer) selected; returns a process exit status (1 if a run
    failed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(args, parser)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    done, failed = _recorded(args), 0
    for name in args.datasets:
        for split in args.splits:
            data = _load(name, split, args)
            for peer in args.peers:
                key = _settings(args, name, split, peer, None)
                if _identity(key) in done:
                    print(f"{name} split {split} {peer}: recorded already; skipped",
                          file=sys.stderr)
                    continue
                try:
                    extra, figures = run_peer(peer, data, args, args.seed + split)
                except (RuntimeError, ValueError) as err:  # a Cholesky failure: report, go on
                    failed += 1
                    print(f"{name} split {split} {peer} FAILED: {type(err).__name__}: {err}",
                          file=sys.stderr)
                    continue
                figures.update(_data_figures(name, data, args))
                if not args.no_record:
                    results.record(BENCHMARK, {**key, **extra}, figures)
                print(f"{name} split {split} {peer}: test log-lik {figures['test_loglik']:.3f}, "
                      f"RMSE {figures['rmse']:.4g}, standardised NLL {figures['nll_std']:.3f}, "
                      f"{figures['ms_per_step']:.1f} ms/step", file=sys.stderr)
    return int(failed > 0)


if __name__ == "__main__":
    raise SystemExit(main())
