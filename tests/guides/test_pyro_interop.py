"""The library's models and guides with Pyro's own machinery: copies and pickles, Pyro's ELBOs
on hand-written models, seeded draws, abstract guides (review s9/review_pyro)."""

import copy
import io
import pickle

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp.infer.elbo import AnalyticKL_ELBO

DT = torch.float64


@pytest.fixture(scope="module")
def data():
    d = dgp.datasets.step(n_train=24, n_test=10, seed=1)
    return d.X_train, d.y_train, d.X_test


GUIDES = {
    "meanfield": lambda m: dgp.guides.MeanField(m),
    "meanfield-sampled": lambda m: dgp.guides.MeanField(m, collapsed=False),
    "coupled-lowrank": lambda m: dgp.guides.Coupled(m, rank=2),
    "chain": lambda m: dgp.guides.Chain(m),
    "autonormal": lambda m: dgp.complete(AutoNormal(dgp.inducing_only(m)), m),
}


def _model(X, y, inducing_scheme="per-layer"):
    return dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4,
                                  inducing_scheme=inducing_scheme)


def _train(model, guide, X, y, steps):
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(steps):
        svi.step(X, y)


def _loc(model, guide, Xt):
    return dgp.predict(model, guide, Xt, num_samples=5, seed=0).loc


def _round_trips():
    def pickled(obj):
        return pickle.loads(pickle.dumps(obj))

    def saved(obj):
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    return {"deepcopy": copy.deepcopy, "pickle": pickled, "torch.save": saved}


# ------------------------------------------------------------------- copies (review item 3)
@pytest.mark.parametrize("inducing_scheme, gname", [
    *[("per-layer", g) for g in GUIDES],
    ("propagated", "meanfield"),
    ("propagated", "autonormal"),
])
def test_trained_model_and_guide_copy_pickle_and_save_to_the_same_predictions(
        data, inducing_scheme, gname):
    """After training, the guides' (and the locations model's) per-run caches held the last
    step's autograd graph: deepcopy, pickle and torch.save of (model, guide) failed."""
    X, y, Xt = data
    model = _model(X, y, inducing_scheme)
    guide = GUIDES[gname](model)
    _train(model, guide, X, y, 2)
    # straight after a training step (a later no-grad run, e.g. predict, replaces the caches)
    copy.deepcopy(model)  # the model alone too (inducing_scheme="propagated" held f(Z))
    copies = {how: round_trip((model, guide)) for how, round_trip in _round_trips().items()}
    expected = _loc(model, guide, Xt)
    for how, (m2, g2) in copies.items():
        assert g2.model is m2, how
        # global store: the copy reads the same named parameters, so the same predictions
        torch.testing.assert_close(_loc(m2, g2, Xt), expected, msg=how)
    _train(model, guide, X, y, 1)  # the original still trains after being copied


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_completed_autoguide_that_has_not_run_still_runs_after_a_copy(data, how):
    """Pyro's ``AutoGuide.__getstate__`` drops the autoguide's model, from the original too:
    a completed guide copied before its first call then failed there, the original as well."""
    X, y, _ = data
    model = _model(X, y)
    guide = GUIDES["autonormal"](model)
    m2, g2 = _round_trips()[how]((model, guide))
    _train(m2, g2, X, y, 1)  # (shares the original's parameters by name: Pyro's store)
    assert g2.inner.model.args[-1].model is m2  # the autoguide's InducingOnly of the copy
    _train(model, guide, X, y, 1)
    assert guide.inner.model.args[-1].model is model


@pytest.mark.parametrize("gname", ["meanfield", "chain"])
def test_deepcopy_snapshot_with_module_local_params_is_independent(data, gname):
    """With module-local parameters a deepcopy taken after training is a snapshot: same
    predictions, unchanged when the original trains on (in the global param store a copy
    shares the store's parameters by name, Pyro's behaviour)."""
    X, y, Xt = data
    with pyro.settings.context(module_local_params=True):
        model = _model(X, y)
        guide = GUIDES[gname](model)
        _train(model, guide, X, y, 3)
        snap_model, snap_guide = copy.deepcopy((model, guide))
        before = _loc(model, guide, Xt)
        torch.testing.assert_close(_loc(snap_model, snap_guide, Xt), before)
        _train(model, guide, X, y, 5)
        torch.testing.assert_close(_loc(snap_model, snap_guide, Xt), before)
        assert not torch.allclose(_loc(model, guide, Xt), before)
        _train(snap_model, snap_guide, X, y, 1)  # the snapshot trains too


# ------------------------------------------------------- local latents (review item 7)
class _LocalLatent(PyroModule):
    """A hand-written model with its own per-point latent ``z`` inside the data plate."""

    def __init__(self):
        super().__init__()
        self.g = dgp.GPLayer(1, 1, inducing_points=torch.linspace(-1, 1, 4, dtype=DT)[:, None])

    def forward(self, x, y=None):
        f = self.g(x)
        with pyro.plate("data", x.shape[-2]):
            z = pyro.sample("z", dist.Normal(torch.zeros(x.shape[-2], dtype=DT), 0.3))
            return pyro.sample("y", dist.Normal(f.squeeze(-1) + z, 0.1), obs=y)


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")
@pytest.mark.parametrize("validation", [True, False])
@pytest.mark.parametrize("gname", ["meanfield", "autonormal"])
def test_analytic_kl_elbo_names_a_local_latent_no_guide_covers(gname, validation):
    """It raised a bare KeyError 'z'."""
    pyro.enable_validation(validation)
    x = torch.linspace(-1, 1, 12, dtype=DT)[:, None]
    model = _LocalLatent()
    guide = GUIDES[gname](model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), AnalyticKL_ELBO())
    with pytest.raises(ValueError, match=r"'z' is a local \(per-point\) latent .*'data'.*"
                                         r"Trace_ELBO knowingly"):
        svi.step(x, torch.sin(3 * x.squeeze(-1)))


# ---------------------------------------------------------- seeded draws (review item 8)
@pytest.mark.parametrize("gname", ["meanfield", "chain", "automvn"])
def test_seeded_draws_on_a_guide_not_set_up_yet_are_reproducible(data, gname):
    """The guide's set-up (its prototype trace) ran inside the seeded block and shifted the
    first call's draws against the second's."""
    X, y, Xt = data
    make = {
        "meanfield": lambda m: dgp.guides.MeanField(m, name="G"),
        "chain": lambda m: dgp.guides.Chain(m, name="G"),
        "automvn": lambda m: dgp.complete(AutoMultivariateNormal(dgp.inducing_only(m)), m,
                                          name="G"),
    }[gname]
    model = _model(X, y)
    _train(model, make(model), X, y, 10)  # trained values in the store, under the name "G"
    calls = {
        "predict": lambda g: _loc(model, g, Xt),
        "variational_pareto_k": lambda g: torch.as_tensor(dgp.variational_pareto_k(
            model, g, X, y, num_samples=30, seed=0).log_weights),
        "to_datatree": lambda g: torch.as_tensor(dgp.to_datatree(
            model, g, X, num_samples=5, seed=0, kl=False)["layers"]["layer1.f"].values),
    }
    differ = []
    for name, call in calls.items():
        guide = make(model)  # not set up: it reads the trained values at set-up
        state = torch.get_rng_state()
        first = call(guide)
        assert torch.equal(torch.get_rng_state(), state), name  # the caller's RNG untouched
        if not torch.equal(call(guide), first):
            differ.append(name)
    assert not differ


# ------------------------------------------------------- abstract guide (review item 10)
def test_joint_gaussian_base_refuses_construction_and_points_to_its_subclasses(data):
    X, y, _ = data
    model = _model(X, y)
    with pytest.raises(TypeError, match="abstract base.*Coupled.*Chain"):
        dgp.guides.JointGaussian(model)
    assert isinstance(dgp.guides.Chain(model), dgp.guides.JointGaussian)


def test_copies_of_a_guide_used_with_trace_mean_field_elbo_train_on(data):
    """A copy made mid-training (TraceMeanField_ELBO, joint guide) resumes from the same loss
    as its original for the same random draws."""
    X, y, _ = data
    with pyro.settings.context(module_local_params=True):
        model = _model(X, y)
        guide = dgp.guides.Coupled(model)
        elbo = TraceMeanField_ELBO()
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), elbo)
        for _ in range(2):
            svi.step(X, y)
        m2, g2 = copy.deepcopy((model, guide))
        pyro.set_rng_seed(5)
        a = elbo.loss(model, guide, X, y)
        pyro.set_rng_seed(5)
        b = elbo.loss(m2, g2, X, y)
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("Auto", [AutoNormal, AutoMultivariateNormal])
def test_trace_mean_field_with_a_completed_autoguide_warns_of_order_only_and_is_trace_elbo(
    data, Auto
):
    """Pyro's TraceMeanField_ELBO checks the guide's site order: a completed autoguide draws
    every ``.u`` before the model's first ``.f``, so Pyro warns "Failed to verify mean field
    restriction". The warning concerns nothing in the estimate: Pyro's autoguides hand each
    ``.u`` over as a ``Delta`` site (the density sits on an auxiliary site), which has no
    registered KL, so TraceMeanField_ELBO scores ``log p - log q`` there as Trace_ELBO does: on
    the same draws the two losses are equal, for a joint autoguide too."""
    import warnings

    X, y, _ = data
    model = _model(X, y)
    guide = dgp.complete(Auto(dgp.inducing_only(model), init_scale=0.3), model)
    _train(model, guide, X, y, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TraceMeanField_ELBO().loss(model, guide, X, y)
    assert [str(w.message).split(".")[0] for w in caught] == [
        "Failed to verify mean field restriction on the guide"
    ]
    with torch.no_grad(), pyro.validation_enabled(False):
        for seed in range(5):
            pyro.set_rng_seed(seed)
            mean_field = TraceMeanField_ELBO().loss(model, guide, X, y)
            pyro.set_rng_seed(seed)
            assert mean_field == pytest.approx(Trace_ELBO().loss(model, guide, X, y), rel=1e-12)


# ------------------------------------ a guide of another model under plain SVI (issue 37: 6, 7)
def _svi_step(model, guide, X, y, elbo):
    SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), elbo).step(X, y)


_ANOTHER_MODEL = r"was built for the model DeepGP '{}'.*layer '{}'.*guides\.MeanField\(model\)"


@pytest.mark.filterwarnings("ignore:Failed to verify mean field restriction")
@pytest.mark.parametrize("elbo", [TraceMeanField_ELBO, Trace_ELBO])
@pytest.mark.parametrize("gname", ["meanfield", "autonormal"])
def test_svi_refuses_a_guide_built_on_another_instance_of_the_model_class(data, elbo, gname):
    """The guide ran (and so trained) its own model: of the SVI model's 9 parameters only the
    likelihood's changed, and the loss fell all the same."""
    X, y, _ = data
    built_on, passed = _model(X, y), _model(X, y)
    guide = GUIDES[gname](built_on)
    before = {k: v.detach().clone() for k, v in passed.named_parameters()}
    pattern = _ANOTHER_MODEL.format(built_on._pyro_name, "layer1")
    with pytest.raises(TypeError, match=pattern) as info:
        _svi_step(passed, guide, X, y, elbo())
    assert passed.layers[0]._pyro_name in str(info.value)  # the model passed, by its layer
    assert "Trace Shapes" not in str(info.value)
    for k, v in passed.named_parameters():
        assert torch.equal(v, before[k]), k
    _svi_step(built_on, guide, X, y, elbo())  # the guide's own model trains


def test_svi_refuses_an_amortized_guide_of_another_avdgp_instance(data):
    """The amortized layers (per-point inducing outputs) make the same check as GPLayer."""
    X, y, _ = data
    built_on = dgp.gp.avdgp_regression(X, y, num_inducing=4, hidden_dims=(2,))
    passed = dgp.gp.avdgp_regression(X, y, num_inducing=4, hidden_dims=(2,))
    guide = dgp.guides.Amortized(built_on, rule="AR1")
    elbo = Trace_ELBO()
    with pytest.raises(TypeError, match="this guide was built for the model"):
        _svi_step(passed, guide, X, y, elbo)
    _svi_step(built_on, guide, X, y, elbo)


class _OtherSites(PyroModule):
    """A hand-written model whose one layer's sites are ``layer.u`` and ``layer.f``."""

    def __init__(self):
        super().__init__()
        self.layer = dgp.GPLayer(2, 1, num_inducing=4, inducing_points=torch.zeros(4, 2,
                                                                                   dtype=DT))

    def forward(self, X, y=None):
        plate = pyro.plate("data", X.shape[-2], dim=-1)
        f = self.layer(X, plate=plate)
        with plate:
            return pyro.sample("y", dist.Normal(f.squeeze(-1), 0.1), obs=y)


@pytest.mark.parametrize("other", ["deeper", "shallower", "other sites"])
def test_svi_refuses_a_guide_of_a_model_of_another_depth_or_site_set(data, other):
    """A deeper model failed with "ValueError: layer 'layer3' input has 1 columns, expected
    2" and a Pyro trace dump; a shallower one, or one whose sites the guide lacks, trained
    silently on nothing of the guide."""
    X1, y, _ = data
    X = torch.cat([X1, X1 ** 2], -1)  # two inputs: inner layers of width 2
    guide = dgp.guides.MeanField(dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4))
    model = {
        "deeper": lambda: dgp.DeepGP.regression(X, y, num_layers=3, num_inducing=4),
        "shallower": lambda: dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=4),
        "other sites": _OtherSites,
    }[other]()
    layer = "layer" if other == "other sites" else "layer1"
    pattern = _ANOTHER_MODEL.format(guide.model._pyro_name, layer)
    with pytest.raises(TypeError, match=pattern) as info:
        _svi_step(model, guide, X, y, Trace_ELBO())
    assert "Trace Shapes" not in str(info.value)


# ---------------------------------------------- Pyro's parameter store round trip (issue 37: 6)
@pytest.mark.parametrize("gname", ["meanfield", "autonormal"])
def test_param_store_loaded_into_a_rebuilt_model_warns_and_the_saved_names_restore(
        data, gname, tmp_path):
    """A model and guide rebuilt in the same process get new names, so loading the store
    restored nothing (predictions were the untrained ones) without a word."""
    import warnings

    X, y, Xt = data
    model = _model(X, y)
    guide = GUIDES[gname](model)
    _train(model, guide, X, y, 10)
    trained = _loc(model, guide, Xt)
    path = str(tmp_path / "params.pt")
    pyro.get_param_store().save(path)
    saved = {"model": model._pyro_name, "guide": guide._pyro_name}

    pyro.clear_param_store()
    rebuilt = _model(X, y)
    rebuilt_guide = GUIDES[gname](rebuilt)
    pyro.get_param_store().load(path)
    own = rf"name='{saved['model']}'" if gname == "autonormal" else (
        rf"the guide with name='{saved['guide']}' and the model with name='{saved['model']}'")
    with pytest.warns(UserWarning, match=rf"the load restores nothing: rebuild .*{own}.*"
                                         r"state_dict\(\)"):
        untrained = _loc(rebuilt, rebuilt_guide, Xt)
    assert not torch.allclose(untrained, trained)

    pyro.clear_param_store()  # as the warning says: the saved names restore them
    named = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=4, name=saved["model"])
    named_guide = (dgp.guides.MeanField(named, name=saved["guide"]) if gname == "meanfield"
                   else dgp.complete(AutoNormal(dgp.inducing_only(named)), named,
                                     name=saved["guide"]))
    pyro.get_param_store().load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(_loc(named, named_guide, Xt), trained)
        another = _model(X, y)  # what the restored pair reads is no load for another pair
        _loc(another, GUIDES[gname](another), Xt)


def test_models_fitted_one_after_another_are_not_warned_about_the_store(data):
    """Parameters an earlier model and guide of the process trained (the store not cleared
    in between) are theirs, not a load for the next pair."""
    import warnings

    X, y, Xt = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for gname in ("meanfield", "meanfield", "chain"):
            model = _model(X, y)
            guide = GUIDES[gname](model)
            _train(model, guide, X, y, 2)
            _loc(model, guide, Xt)
