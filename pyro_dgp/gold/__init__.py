"""The gold standard for small deep GPs: NUTS with the hyperparameters held fixed on the deep
GP's posterior (:mod:`.posterior`) or on the ELBO's optimal ``q(U)`` (:mod:`.target`), its
chains grouped and weighed by stacking (:mod:`.chains`, :mod:`.nuts`), the distances of a
guide's predictive to its (:mod:`.distance`), the two-mode toy of Havasi et al. 2018 and a
smooth symmetric toy (:mod:`.toys`), the masses of a first layer's modes by importance sampling
(:mod:`.modes`) and the reflection symmetry of such toys (:mod:`.symmetry`).

>>> model, X, y = gold.two_mode_model()
>>> reference = gold.run_nuts(model, X, y, num_chains=8)  # target="posterior"
>>> reference.groups, reference.weights, reference.chain_groups.r_hat
>>> gold.compare_to_gold(reference, {"meanfield": guide}, X_grid)["meanfield"].w1
"""

from .chains import ChainGroups, GoldMixingWarning, combine_chains
from .distance import (
    PredictiveDistance,
    compare_to_gold,
    draws_w1,
    guide_layer_values,
    mixture_moments,
    predictive_distance,
)
from .modes import ModeMasses, importance_mode_masses, rising
from .nuts import GoldStandard, run_nuts
from .posterior import PosteriorTarget
from .symmetry import (
    check_reflection_symmetric,
    reflect_draws,
    reflection_permutation,
    symmetrised,
)
from .target import GoldTarget, expected_log_likelihood, fixed_hyperparameters
from .toys import (
    TWO_MODE_INPUT,
    mode_masses,
    symmetric_model,
    two_mode_model,
    two_mode_posterior_predictive,
)

__all__ = [
    "ChainGroups",
    "GoldMixingWarning",
    "GoldStandard",
    "GoldTarget",
    "ModeMasses",
    "PosteriorTarget",
    "PredictiveDistance",
    "TWO_MODE_INPUT",
    "check_reflection_symmetric",
    "combine_chains",
    "compare_to_gold",
    "draws_w1",
    "expected_log_likelihood",
    "fixed_hyperparameters",
    "guide_layer_values",
    "importance_mode_masses",
    "mixture_moments",
    "mode_masses",
    "predictive_distance",
    "reflect_draws",
    "reflection_permutation",
    "rising",
    "run_nuts",
    "symmetric_model",
    "symmetrised",
    "two_mode_model",
    "two_mode_posterior_predictive",
]
