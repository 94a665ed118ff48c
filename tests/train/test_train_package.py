"""The training engine's package, ``pyro_dgp.train``, and the engine's former names in
``pyro_dgp.infer``: still found there, with a warning naming their new place."""

import pytest

import pyro_dgp
import pyro_dgp.infer
import pyro_dgp.train

MOVED = ["FitResult", "StepInfo", "TrainingDivergedError", "TrainingInstabilityWarning", "fit",
         "load_fit", "save_fit"]


@pytest.mark.parametrize("name", MOVED)
def test_an_engine_name_of_infer_warns_and_is_trains(name):
    moved = rf"pyro_dgp\.infer\.{name} is deprecated.*use pyro_dgp\.train\.{name}"
    with pytest.warns(DeprecationWarning, match=moved):
        found = getattr(pyro_dgp.infer, name)
    assert found is getattr(pyro_dgp.train, name)


def test_the_top_level_names_are_the_engines():
    assert pyro_dgp.fit is pyro_dgp.train.fit
    assert pyro_dgp.FitResult is pyro_dgp.train.FitResult


def test_an_unknown_name_of_infer_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pyro_dgp.infer.no_such_name  # noqa: B018
