"""One vocabulary: every renamed keyword, value and function works under its old spelling with a
``PyroDGPDeprecationWarning`` that names the new one, gives the same result as the new
spelling, and refuses both spellings at once."""

from functools import partial

import pandas as pd
import pytest
import torch
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal

import pyro_dgp as dgp
from pyro_dgp.cli.parser import build_parser
from pyro_dgp.deprecation import PyroDGPDeprecationWarning
from pyro_dgp.diagnostics.layers import layer_variance
from pyro_dgp.infer.alpha import LocalAlpha
from pyro_dgp.infer.objectives import make_objective

DT = torch.float64


def _data(n=16):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 1, generator=g, dtype=DT) * 4 - 2
    return X, torch.sin(2 * X[:, 0])


def _fitted():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=2, progress=False, final_elbo_particles=0)
    return model, guide, X, y


def _old(new: str):
    """The warning an old spelling gives: it names the new spelling."""
    return pytest.warns(PyroDGPDeprecationWarning, match=new)


def _fit_losses(**kwargs) -> list[float]:
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4)
    guide = dgp.guides.MeanField(model)
    return dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0,
                   **kwargs).losses


def test_fit_num_samples_is_num_particles():
    new = _fit_losses(objective="alpha", num_particles=3)
    with _old(r"fit\(num_particles=...\)"):
        old = _fit_losses(objective="alpha", num_samples=3)
    assert old == new
    # the default: 10 per-point draws for alpha, as num_samples' default was
    assert _fit_losses(objective="alpha") == _fit_losses(objective="alpha", num_particles=10)
    with pytest.raises(TypeError, match="both num_samples= and num_particles="):
        _fit_losses(objective="alpha", num_samples=3, num_particles=3)


def test_objective_meanfield_is_analytic_kl():
    new = _fit_losses(objective="analytic-kl")
    with _old("objective='analytic-kl'"):
        old = _fit_losses(objective="meanfield")
    assert old == new
    guide = dgp.guides.MeanField(dgp.DeepGP.regression(*_data(), num_inducing=4))
    with _old("objective='analytic-kl'"):
        objective = make_objective("meanfield", guide)
    assert type(objective) is type(make_objective("analytic-kl", guide))


def test_local_alpha_and_make_objective_take_num_particles():
    model, guide, X, y = _fitted()
    with _old(r"LocalAlpha\(num_particles=...\)"):
        old = LocalAlpha(0.5, num_samples=4)
    new = LocalAlpha(0.5, num_particles=4)
    assert old.num_particles == new.num_particles == 4
    torch.manual_seed(1)
    a = old.loss(model, guide, X, y)
    torch.manual_seed(1)
    assert new.loss(model, guide, X, y) == a
    with _old(r"make_objective\(num_particles=...\)"):
        assert make_objective("alpha", guide, num_samples=3).num_particles == 3
    with pytest.raises(TypeError, match="pass only num_particles"):
        LocalAlpha(0.5, 4, num_samples=4)  # the new one given by position


def test_predict_batch_size_is_chunk_rows_and_seed_defaults_to_zero():
    model, guide, X, _ = _fitted()
    new = dgp.predict(model, guide, X, num_samples=5, chunk_rows=7)
    with _old(r"predict\(chunk_rows=...\)") as caught:
        old = dgp.predict(model, guide, X, num_samples=5, batch_size=7)
    assert caught[0].filename == __file__  # attributed to the caller's line
    assert torch.equal(old.mean, new.mean) and torch.equal(old.variance, new.variance)
    # seed=0 by default: the same draws twice, whatever the global random state
    torch.manual_seed(123)
    once = dgp.predict(model, guide, X, num_samples=5)
    torch.manual_seed(456)
    again = dgp.predict(model, guide, X, num_samples=5)
    assert torch.equal(again.mean, once.mean)
    with pytest.raises(TypeError, match="both batch_size= and chunk_rows="):
        dgp.predict(model, guide, X, 5, 7, batch_size=7)


def test_to_datatree_seed_defaults_to_zero():
    model, guide, X, y = _fitted()
    torch.manual_seed(5)
    a = dgp.to_datatree(model, guide, X, num_samples=3, kl=False)
    torch.manual_seed(6)
    b = dgp.to_datatree(model, guide, X, num_samples=3, kl=False)
    assert a.equals(b)


def test_elbo_is_evaluate_elbo():
    model, guide, X, y = _fitted()
    with _old("pyro_dgp.evaluate_elbo"):
        old = dgp.elbo
    assert old is dgp.evaluate_elbo
    assert "elbo" not in dgp.__all__ and "evaluate_elbo" in dgp.__all__
    with pytest.raises(AttributeError, match="no attribute 'elbow'"):
        dgp.elbow  # noqa: B018


def test_inducing_is_inducing_scheme():
    X, y = _data()
    new = dgp.DeepGP.regression(X, y, num_inducing=4, inducing_scheme="propagated")
    with _old("inducing_scheme"):
        old = dgp.DeepGP.regression(X, y, num_inducing=4, inducing="locations")
    assert old.inducing_scheme == new.inducing_scheme == "propagated"
    assert [(n, p.shape) for n, p in old.named_parameters()] == [
        (n, p.shape) for n, p in new.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters(),
                                                  strict=True))
    with _old("DeepGP.inducing_scheme"):
        assert new.inducing == "locations"
    with _old("inducing_scheme='per-layer'"):
        assert dgp.DeepGP([dgp.GPLayer(1, 1, num_inducing=3)], dgp.likelihoods.Gaussian(),
                          inducing_scheme="fixed").inducing_scheme == "per-layer"
    with pytest.raises(TypeError, match="pass only inducing_scheme"):
        dgp.DeepGP.regression(X, y, inducing="locations", inducing_scheme="propagated")
    with pytest.raises(ValueError, match="inducing_scheme must be 'per-layer' or 'propagated'"):
        dgp.DeepGP.regression(X, y, inducing_scheme="learned")


def test_layer_summary_takes_a_datatree():
    model, guide, X, _ = _fitted()
    tree = dgp.to_datatree(model, guide, X, num_samples=4, seed=2)
    new = dgp.layer_summary(tree)
    with _old(r"layer_summary\(to_datatree\(model, guide, X, ...\)\)"):
        old = dgp.layer_summary(model, guide, X, num_samples=4, seed=2)
    pd.testing.assert_frame_equal(old, new)
    with _old(r"layer_variance\(to_datatree"):
        old_var = layer_variance((model, guide, X), num_samples=4, seed=2)
    assert old_var.equals(layer_variance(tree))
    with pytest.raises(TypeError, match=r"layer_summary takes a DataTree"):
        dgp.layer_summary(model)
    with pytest.raises(TypeError, match=r"\['seed'\] are arguments of to_datatree"):
        dgp.layer_summary(tree, seed=1)


def test_complete_takes_an_autoguide_class():
    model, _, X, y = _fitted()

    def elbo_of(guide):
        return dgp.evaluate_elbo(model, guide, X, y, num_particles=2, seed=3).value

    built = dgp.complete(AutoNormal(dgp.inducing_only(model)), model)
    from_class = dgp.complete(AutoNormal, model)
    assert isinstance(from_class.inner, AutoNormal)
    assert elbo_of(from_class) == elbo_of(built)
    low_rank = dgp.complete(partial(AutoLowRankMultivariateNormal, rank=2), model)
    assert low_rank.inner.rank == 2 and isinstance(elbo_of(low_rank), float)


def test_cli_num_inducing_and_old_spellings(capsys):
    parser = build_parser()
    args = parser.parse_args(["fit", "--data", "step", "--num-inducing", "7"])
    assert args.num_inducing == 7 and args.particles is None and args.objective == "auto"
    capsys.readouterr()
    old = parser.parse_args(["fit", "--data", "step", "--inducing", "7", "--objective",
                             "meanfield"])
    assert old.num_inducing == 7 and old.objective == "analytic-kl"
    err = capsys.readouterr().err
    assert "--inducing is deprecated" in err and "use --num-inducing" in err
    assert "use --objective analytic-kl" in err


def test_warnings_of_renaming_entry_points_point_at_the_callers_line():
    """The renames sit in the entry points' one wrapper (or count frames): their own warnings
    still name the caller's line."""
    X, y = _data()
    with pytest.warns(UserWarning, match="full-batch") as caught:
        _fit_losses(batch_size=100)
    assert caught[0].filename.endswith("test_vocabulary.py")
    with pytest.warns(UserWarning, match="assume standardised data") as caught:
        dgp.DeepGP.regression(X, 100 * y, num_inducing=4, inducing_scheme="per-layer")
    assert caught[0].filename == __file__
    joint = dgp.complete(AutoNormal, dgp.DeepGP.regression(X, y, num_inducing=4))
    with pytest.warns(UserWarning, match="factorises like the model") as caught:
        make_objective("analytic-kl", joint)
    assert caught[0].filename == __file__
