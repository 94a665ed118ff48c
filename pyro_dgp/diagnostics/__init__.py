"""ArviZ export and diagnostics of variational fits: per-layer summaries, PSIS, plots."""

from .export import (
    compare_guides,
    load_datatree,
    loo,
    save_datatree,
    to_datatree,
    variational_pareto_k,
)
from .layers import (
    layer_kl,
    layer_summary,
    layer_variance,
    plot_diagnostics,
    plot_hyperparameters,
    plot_layer_paths,
    plot_layer_variance,
)

__all__ = [
    "compare_guides",
    "layer_kl",
    "layer_summary",
    "layer_variance",
    "load_datatree",
    "loo",
    "plot_diagnostics",
    "plot_hyperparameters",
    "plot_layer_paths",
    "plot_layer_variance",
    "save_datatree",
    "to_datatree",
    "variational_pareto_k",
]
