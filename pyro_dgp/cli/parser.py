"""The argument parser of the ``pyro-dgp`` command line."""

from __future__ import annotations

import argparse

from ..guides.registry import GUIDES
from ..infer.objectives import OBJECTIVE_NAMES
from ..train.saved import DEFAULT_MODEL, MODELS
from .commands import DEFAULT_INDUCING, DEFAULT_LAYERS, cmd_demo, cmd_evaluate, cmd_fit, note
from .data import DEFAULT_TEST_FRACTION, DTYPES, check_device

__all__ = ["build_parser"]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default after its help, unless the help already says it or there
    is none to show (``None``: the help says what happens)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _RenamedOption(argparse.Action):
    """An option's old name: stores its value as the new option does, with a note on stderr
    naming the new one (the old name works for one more release)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        note(f"{option_string} is deprecated and will be removed in the next release; use "
             f"{self.new}")
        setattr(namespace, self.dest, values)


#: the old names of ``--objective``'s values
_OLD_OBJECTIVES = {"meanfield": "analytic-kl"}


def _objective(text: str) -> str:
    """``--objective``'s value, an old name (``meanfield``) noted and spelled anew."""
    if text in _OLD_OBJECTIVES:
        note(f"--objective {text} is deprecated and will be removed in the next release; use "
             f"--objective {_OLD_OBJECTIVES[text]}")
        return _OLD_OBJECTIVES[text]
    return text


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text}")
    return value


def _device(text: str) -> str:
    try:
        return check_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyro-dgp", description="Deep Gaussian processes on Pyro",
                                formatter_class=_HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_fit(sub)
    _add_evaluate(sub)
    return p


def _add_demo(sub) -> None:
    d = sub.add_parser("demo", help="fit GP and DGP models with two guides on built-in data",
                       formatter_class=_HelpFormatter)
    d.add_argument("--steps", type=_positive_int, default=1500, help="SVI steps per model")
    d.add_argument("--n-train", type=_positive_int, default=100,
                   help="training points of the step function")
    d.add_argument("--num-inducing", type=_positive_int, default=20,
                   help="inducing points M per layer")
    d.add_argument("--seed", type=int, default=0, help="seed of data, initialisation, training")
    d.add_argument("--output", default="out/demo", help="folder for results, fits, plots")
    d.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    _threads_arg(d)
    d.set_defaults(func=cmd_demo)


def _data_args(q, for_fit: bool) -> None:
    """The options that say which data a fit is of (saved with the fit; ``evaluate`` reads
    them from it unless given). Each help ends with the one default that applies: ``fit``'s
    own, or for ``evaluate`` the saved value."""

    def default(fit_default: str | None = None) -> str:
        if not for_fit:
            return " (default: the fit's)"
        return "" if fit_default is None else f" (default: {fit_default})"

    q.add_argument("--data", required=for_fit,
                   help="a UCI name (boston, energy, ...), a built-in set, or a CSV path"
                        + default())
    q.add_argument("--target",
                   help="target column of a CSV file (required for CSV, an error for "
                        "named sets, whose target is fixed)" + default())
    q.add_argument("--split", type=int, default=None,
                   help="which train/test split: for a UCI set the index of the standard "
                        "split, for a built-in set its seed, for a CSV file the seed of its "
                        "random split" + default("0; for a CSV file, --seed"))
    q.add_argument("--test-fraction", type=float, default=None,
                   help="CSV files only: fraction of rows held out for testing"
                        + default(str(DEFAULT_TEST_FRACTION)))
    q.add_argument("--data-dir",
                   help="folder with uci/" + default("$PYRO_DGP_DATA, else the cache"))
    q.add_argument("--device", type=_device, default="cpu" if for_fit else None,
                   help="torch device (cpu, cuda, cuda:1, ...)" + default("cpu"))
    q.add_argument("--dtype", choices=sorted(DTYPES),
                   default="float64" if for_fit else None,
                   help="floating-point type" + default("float64"))
    q.add_argument("--samples", type=_positive_int, default=100 if for_fit else None,
                   help="predictive samples S" + default("100"))
    q.add_argument("--seed", type=int, default=0 if for_fit else None,
                   help="seed of initialisation, training and prediction" + default("0"))


def _add_fit(sub) -> None:
    f = sub.add_parser(
        "fit", help="fit a DGP to a UCI set or a CSV file", formatter_class=_HelpFormatter,
        description="Fit a DGP to a UCI set or a CSV file. Started by torchrun "
                    "(torchrun --nproc-per-node 2 -m pyro_dgp.cli fit ...), the processes "
                    "train data-parallel: each evaluates its part of every batch, gradients "
                    "are summed, process 0 writes the checkpoint, the fit and its scores "
                    "(gloo on CPU, nccl with --device cuda).")
    _data_args(f, for_fit=True)
    _size_args(f)
    f.add_argument("--model", choices=list(MODELS), default=DEFAULT_MODEL,
                   help="dsvi: layers with global inducing points (--layers, --hidden-dim, "
                        "--num-inducing); avdgp: per-point inducing points, the architecture of "
                        "Meng and Zhang 2024 (widths 16, 4; M = 8, 4, 4; Matern-5/2), for "
                        "the amortized-* guides")
    f.add_argument("--guide", choices=sorted(GUIDES), default="meanfield",
                   help="variational family (amortized-*: with --model avdgp only)")
    f.add_argument("--objective", choices=OBJECTIVE_NAMES, type=_objective, default="auto",
                   help="auto: the analytic-KL ELBO (analytic-kl) where the guide factorises "
                        "like the model, the amortized guides' weighted-path objective for "
                        "amortized-*, else Trace_ELBO; renyi: RenyiELBO(alpha=0.5), with a guide "
                        "that samples u (meanfield-sampled or an auto* guide); alpha: the "
                        "local alpha-divergence objective with --alpha (power EP with tied "
                        "factors; alpha -> 0 is the ELBO, 1 the predictive log-likelihood)")
    f.add_argument("--alpha", type=_unit_interval, default=None,
                   help="alpha in (0, 1] of --objective alpha (default: 0.5)")
    f.add_argument("--natural-gradient", type=_unit_interval, default=None, metavar="GAMMA",
                   help="natural-gradient steps of size GAMMA in (0, 1] for the last layer's "
                        "Gaussian q(u), warmed up from 1e-4 over 5 steps (warmup_gamma; "
                        "Salimbeni, Eleftheriadis and Hensman 2018), Adam for the other "
                        "parameters; guides meanfield, meanfield-sampled, coupled, "
                        "coupled-per-point; 0.02 is the README's recipe (default: Adam for "
                        "all)")
    f.add_argument("--particles", type=_positive_int, default=None,
                   help="draws of the guide per step and point (fit's num_particles; "
                        "default: 10 for --objective alpha and for an ELBO, 1 for the "
                        "amortized and mixture guides' objectives)")
    f.add_argument("--steps", type=_positive_int, default=20000, help="SVI steps")
    f.add_argument("--batch-size", type=_positive_int, default=10000,
                   help="minibatch size B, fit's batch_size (B >= training points: full "
                        "batch; fit's own default is the full batch)")
    f.add_argument("--lr", type=_positive_float, default=0.01, help="Adam's learning rate")
    f.add_argument("--classification", action="store_true",
                   help="binary labels, probit likelihood")
    f.add_argument("--checkpoint", help="checkpoint file (default OUTPUT/checkpoint.pt)")
    f.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    f.add_argument("--output", default="out/fit",
                   help="folder for fit.pt, metrics.json and the checkpoint")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.add_argument("--cuda-graph", action="store_true",
                   help="with --device cuda: record each step's kernels once as a CUDA graph "
                        "and replay it (steps launch-bound on a GPU run several times faster)")
    f.add_argument("--timeout", type=_positive_float, default=300.0,
                   help="under torchrun (data-parallel, one process per rank): seconds a "
                        "process waits for the others before it stops with an error")
    _threads_arg(f)
    f.set_defaults(func=cmd_fit)


def _add_evaluate(sub) -> None:
    e = sub.add_parser(
        "evaluate", help="score a saved fit on its test split", formatter_class=_HelpFormatter,
        description="Score a saved fit on the test split it was fitted with. The data set, "
                    "split, dtype, device, seed and number of samples are read from the fit; "
                    "an argument given here overrides the saved value.")
    e.add_argument("fit", help="fit.pt written by 'pyro-dgp fit'")
    _data_args(e, for_fit=False)
    e.add_argument("--plots", metavar="DIR",
                   help="also write the ArviZ DataTree and the diagnostic PNGs that apply "
                        "here: layer paths (1-D inputs), per-layer variances, the predictive "
                        "mean and sd (inputs of 2 or more dims), hyperparameters; those "
                        "skipped are named on stderr")
    _threads_arg(e)
    e.set_defaults(func=cmd_evaluate)


def _size_args(f) -> None:
    """``fit``'s options of the model's sizes and kernels (for ``--model dsvi``)."""
    f.add_argument("--layers", type=_positive_int, default=DEFAULT_LAYERS, help="GP layers")
    f.add_argument("--hidden-dim", type=_positive_int,
                   help="width of the inner layers (default: min(30, input dims))")
    _num_inducing_args(f)
    f.add_argument("--kernel-per-output", action="store_true",
                   help="dsvi: each inner GP its own kernel hyperparameters (default: one "
                        "kernel per layer)")


def _num_inducing_args(f) -> None:
    """``--num-inducing``, and its old name ``--inducing`` (hidden, noted when used)."""
    f.add_argument("--num-inducing", type=_positive_int, default=DEFAULT_INDUCING,
                   help="inducing points M per layer (at most the training points)")
    f.add_argument("--inducing", type=_positive_int, dest="num_inducing", action=_RenamedOption,
                   new="--num-inducing", help=argparse.SUPPRESS)


def _threads_arg(q) -> None:
    q.add_argument("--threads", type=_positive_int, default=None,
                   help="torch threads (default: one for small problems, where more only "
                        "spin; one more per 3e8 multiply-adds per step, up to the cores)")
