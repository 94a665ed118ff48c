"""``fit``'s objective as an object or as its string shorthand: each name builds the
instance that ``make_objective``'s docstring states, so the two train the same."""

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.infer import AnalyticKL_ELBO, LocalAlpha, RenyiELBO, ReparamTrace_ELBO
from pyro_dgp.infer.objectives import default_num_particles

DT = torch.float64

SHORTHANDS = [
    # an ELBO's default: 10 vectorised draws per step (default_num_particles)
    ("analytic-kl", {}, lambda: AnalyticKL_ELBO(num_particles=10, vectorize_particles=True,
                                                max_plate_nesting=1)),
    ("elbo", {}, lambda: ReparamTrace_ELBO(num_particles=10, vectorize_particles=True,
                                           max_plate_nesting=1)),
    ("elbo", {"num_particles": 1}, lambda: ReparamTrace_ELBO(num_particles=1,
                                                             max_plate_nesting=1)),
    ("elbo", {"num_particles": 2}, lambda: ReparamTrace_ELBO(
        num_particles=2, vectorize_particles=True, max_plate_nesting=1)),
    ("renyi", {}, lambda: RenyiELBO(alpha=0.5, num_particles=2, max_plate_nesting=1)),
    ("alpha", {"alpha": 1.0, "num_particles": 3}, lambda: LocalAlpha(alpha=1.0, num_particles=3)),
]


def _losses(objective, collapsed=True, **kwargs):
    X = torch.linspace(-2, 2, 24, dtype=DT).unsqueeze(-1)
    y = torch.sin(2 * X[:, 0])
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
    guide = dgp.guides.MeanField(model, collapsed=collapsed)
    result = dgp.fit(model, guide, X, y, num_steps=4, batch_size=12, seed=3, progress=False,
                     objective=objective, final_elbo_particles=0, **kwargs)
    return result.losses


@pytest.mark.parametrize("name, kwargs, instance", SHORTHANDS,
                         ids=["analytic-kl", "elbo", "elbo-1", "elbo-2", "renyi", "alpha"])
def test_an_objective_and_its_shorthand_train_the_same(name, kwargs, instance):
    collapsed = name != "renyi"  # Renyi's bound needs per-draw weights: f drawn given u
    by_name = _losses(name, collapsed, **kwargs)
    by_object = _losses(instance(), collapsed,
                        **{k: v for k, v in kwargs.items() if k == "num_particles"})
    assert by_name == by_object  # the same draws and arithmetic: equal to the last bit
    assert len(by_name) == 4


@pytest.mark.parametrize("name, objective, draws", [
    ("meanfield", "auto", 10), ("coupled", "auto", 10), ("chain", "elbo", 10),
    ("ssivi", "auto", 10), ("autonormal", "auto", 10),
    ("meanfield", "analytic-kl", 10), ("meanfield", "alpha", 10), ("meanfield", "renyi", 1),
    ("mixture", "auto", 1), ("mixture", "stratified", 1)])
def test_default_draws_per_step_are_ten_for_an_elbo_and_one_for_a_mixture(name, objective,
                                                                          draws):
    """10 draws per step for an ELBO, whatever the family (and K = 10 per point of the alpha
    objective); one for a mixture's objectives, which draw every component in turn."""
    X = torch.linspace(-2, 2, 8, dtype=DT).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, torch.sin(X[:, 0]), num_layers=2, num_inducing=3)
    assert default_num_particles(objective, make_guide(name, model)) == draws


def test_fit_trains_an_elbo_with_ten_draws_per_step_by_default():
    assert _losses("auto") == _losses("auto", num_particles=10) != _losses("auto",
                                                                           num_particles=1)
