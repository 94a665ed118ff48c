"""PSIS needs at least MIN_PSIS_DRAWS draws: loo, compare_guides and variational_pareto_k
say so, naming num_samples, before ArviZ fails inside; at the minimum they work."""

import warnings

import pytest

import pyro_dgp as dgp
from pyro_dgp.diagnostics.psis import MIN_PSIS_DRAWS


@pytest.fixture(scope="module")
def fitted():
    data = dgp.datasets.step(n_train=40, seed=0)
    X, y = data.X_train, data.y_train
    fits = {}
    for name in ("meanfield", "coupled"):
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=5)
        guide = dgp.guides.registry.make_guide(name, model)
        dgp.fit(model, guide, X, y, num_steps=10, progress=False, final_elbo_particles=0)
        fits[name] = (model, guide)
    return fits, X, y


def _trees(fitted, num_samples):
    fits, X, y = fitted
    return {name: dgp.to_datatree(m, g, X, y, num_samples=num_samples, seed=0)
            for name, (m, g) in fits.items()}


def test_the_minimum_is_where_arviz_can_smooth(fitted):
    assert MIN_PSIS_DRAWS == 25
    trees = _trees(fitted, MIN_PSIS_DRAWS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(dgp.compare_guides(trees)) == 2
        dgp.diagnostics.loo(trees["meanfield"])
        fits, X, y = fitted
        dgp.variational_pareto_k(*fits["meanfield"], X, y, num_samples=MIN_PSIS_DRAWS, seed=0)


@pytest.mark.parametrize("num_samples", [5, 20, MIN_PSIS_DRAWS - 1])
def test_too_few_draws_name_num_samples_and_the_minimum(fitted, num_samples):
    trees = _trees(fitted, num_samples)
    want = rf"needs at least 25 draws .*got {num_samples}: use num_samples >= 25"
    with pytest.raises(ValueError, match="loo of a DataTree " + want + " in to_datatree"):
        dgp.diagnostics.loo(trees["coupled"])
    with pytest.raises(ValueError, match="compare_guides, 'meanfield': loo of a DataTree " + want):
        dgp.compare_guides(trees)
    fits, X, y = fitted
    with pytest.raises(ValueError, match="variational_pareto_k " + want):
        dgp.variational_pareto_k(*fits["meanfield"], X, y, num_samples=num_samples, seed=0)


@pytest.mark.filterwarnings("ignore:Estimated shape parameter")
def test_points_without_a_tail_to_smooth_need_no_minimum():
    """One layer with a collapsed guide: every draw gives the same log p(y_i), the weights
    are uniform and nothing is smoothed, so few draws suffice."""
    data = dgp.datasets.step(n_train=30, seed=0)
    X, y = data.X_train, data.y_train
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False, final_elbo_particles=0)
    dgp.diagnostics.loo(dgp.to_datatree(model, guide, X, y, num_samples=4, seed=0))
