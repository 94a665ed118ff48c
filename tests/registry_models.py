"""The model each registry guide fits, for the registry-wide tests.

Every guide of ``pyro_dgp.guides.registry`` but the amortized ones fits a model of
``GPLayer``s (global inducing outputs), built by ``DeepGP.regression``; the amortized guides
(``LOCAL_INDUCING_GUIDES``) fit only a model of ``AmortizedGPLayer``s (one ``u`` per data
point, Meng and Zhang 2024), built by ``avdgp_regression`` with the same depth, widths and
``M``, and train with their own objective over the ``S`` weighted paths (``AmortizedELBO``,
what ``fit``'s ``objective="auto"`` gives them).
"""

import pyro_dgp as dgp
from pyro_dgp.guides.registry import LOCAL_INDUCING_GUIDES


def model_for(name, X, y, num_layers=2, num_inducing=5, hidden_dim=None, likelihood="gaussian",
              **kwargs):
    """The model of ``(X, y)`` that guide ``name`` fits (module docstring)."""
    if name in LOCAL_INDUCING_GUIDES:
        hidden = hidden_dim if hidden_dim is not None else min(30, X.shape[-1])
        return dgp.gp.avdgp_regression(X, y, hidden_dims=(hidden,) * (num_layers - 1),
                                       num_inducing=num_inducing, likelihood=likelihood,
                                       **kwargs)
    return dgp.DeepGP.regression(X, y, num_layers=num_layers, num_inducing=num_inducing,
                                 hidden_dim=hidden_dim, likelihood=likelihood, **kwargs)

