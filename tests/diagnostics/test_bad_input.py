"""The diagnostics' entry points (``to_datatree``, ``layer_summary``) given bad input, beside the
other entry points that refuse the same input."""

import pytest
from bad_input_data import untrained_meanfield

import pyro_dgp as dgp


@pytest.fixture
def fitted():
    return untrained_meanfield()


def test_zero_rows_are_refused_at_every_entry_point(fitted):
    model, guide, X, y = fitted
    dgp.fit(model, guide, X, y, num_steps=1, progress=False, final_elbo_particles=0)
    match = r"X has no rows \(shape \(0, 1\)\): at least one data point is needed"
    for call in (lambda: dgp.predict(model, guide, X[:0]),
                 lambda: dgp.layer_summary(dgp.to_datatree(model, guide, X[:0])),
                 lambda: dgp.to_datatree(model, guide, X[:0]),
                 lambda: dgp.fit(model, guide, X[:0], y[:0], num_steps=1, progress=False),
                 lambda: dgp.DeepGP.regression(X[:0], y[:0])):
        with pytest.raises(ValueError, match=match):
            call()
