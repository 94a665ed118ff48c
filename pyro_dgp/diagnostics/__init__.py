"""ArviZ export and diagnostics of variational fits: per-layer summaries, PSIS, plots, and
the stacking of several fits."""

from .compare import GuideComparisonWarning, predictive_scores
from .ensemble import Stacked, stack
from .export import load_datatree, save_datatree, to_datatree
from .kl import layer_kl
from .layers import layer_summary, layer_variance
from .plots import (
    MAX_INPUT_PANELS,
    plot_diagnostics,
    plot_hyperparameters,
    plot_layer_paths,
    plot_layer_variance,
    plot_predictive,
    skipped_plots,
)
from .psis import compare_guides, loo, variational_pareto_k

__all__ = [
    "MAX_INPUT_PANELS",
    "GuideComparisonWarning",
    "Stacked",
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
    "plot_predictive",
    "predictive_scores",
    "save_datatree",
    "skipped_plots",
    "stack",
    "to_datatree",
    "variational_pareto_k",
]
