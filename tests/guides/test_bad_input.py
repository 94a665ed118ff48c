"""Guide constructors and ``make_guide`` given bad arguments: a clear error naming the argument."""

import math

import pytest
import torch
from bad_input_data import line_data

import pyro_dgp as dgp
from pyro_dgp.guides import Chain, Coupled, MeanField
from pyro_dgp.guides.registry import make_guide


@pytest.fixture
def data():
    return line_data()


@pytest.mark.parametrize("guide", [MeanField, Coupled, Chain])
@pytest.mark.parametrize("model", ["bogus", None])
def test_guides_reject_a_non_callable_model(guide, model):
    with pytest.raises(TypeError, match=f"{guide.__name__}: model must be a callable"):
        guide(model)


def test_make_guide_with_swapped_arguments(data):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(TypeError, match="make_guide: name must be a str") as exc:
        make_guide(model, "meanfield")
    assert "GPLayer(" not in str(exc.value)


@pytest.mark.parametrize("guide", [MeanField, Coupled, Chain])
def test_inf_inner_variance_is_rejected(data, guide):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(ValueError, match=f"{guide.__name__}: inner_variance must be positive "
                                         "and finite, got inf"):
        guide(model, inner_variance=math.inf)


@pytest.mark.parametrize("rank, error", [(2.5, ValueError), (True, TypeError),
                                         ("a", TypeError), (math.nan, ValueError)], ids=repr)
def test_coupled_rank_must_be_a_positive_integer(data, rank, error):
    model = dgp.DeepGP.regression(*data, num_inducing=5)
    with pytest.raises(error, match="Coupled: rank must be a positive integer"):
        Coupled(model, rank=rank)


def test_complete_and_inducing_only_need_callables():
    X = torch.linspace(-1, 1, 10, dtype=torch.float64).unsqueeze(-1)
    model = dgp.DeepGP.regression(X, X[:, 0], num_layers=1, num_inducing=4)
    with pytest.raises(TypeError, match="inducing_only: model must be a callable"):
        dgp.inducing_only("model")
    with pytest.raises(TypeError, match="complete: guide must be a callable"):
        dgp.complete(None, model)
