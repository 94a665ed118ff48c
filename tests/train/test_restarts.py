"""``fit(..., restarts=R)``: R independent fits from seeds ``seed + k``, restart 0 the plain
fit, the others on copies that share no parameter (Pyro's store holds parameters by module
name), combined by stacking; sequential and process-parallel runs agree."""

import math

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.guides.registry import make_guide
from pyro_dgp.train import Restarts
from pyro_dgp.validation import pyro_name

DT = torch.float64
FAST = dict(num_steps=12, batch_size=16, lr=0.05, progress=False, lr_schedule="constant")


@pytest.fixture(scope="module")
def data():
    return dgp.datasets.step(n_train=40, n_test=30, seed=0)


def _pair(data, family="meanfield"):
    pyro.set_rng_seed(0)
    model = dgp.DeepGP.regression(data.X_train, data.y_train, num_layers=2, num_inducing=6)
    return model, make_guide(family, model)


def _state(model, guide) -> dict:
    return {**{"m." + k: v.detach().clone() for k, v in model.state_dict().items()},
            **{"g." + k: v.detach().clone() for k, v in guide.state_dict().items()}}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_restart_is_the_plain_fit_bit_for_bit(data):
    model, guide = _pair(data)
    plain = dgp.fit(model, guide, data.X_train, data.y_train, seed=3, **FAST)
    expected = _state(model, guide)
    model, guide = _pair(data)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, seed=3, restarts=1, **FAST)
    assert isinstance(runs, Restarts) and len(runs) == 1
    assert runs[0].model is model and runs[0].guide is guide and runs[0].seed == 3
    assert _same(_state(model, guide), expected)
    assert runs[0].result.losses == plain.losses
    assert runs[0].result.final_elbo == plain.final_elbo


@pytest.mark.parametrize("family", ["meanfield", "autonormal"])
def test_restart_k_is_the_plain_fit_from_seed_plus_k(data, family):
    """A renamed copy computes what the original would: restart 1 of seed 3 equals a plain
    fit of the same start from seed 4."""
    model, guide = _pair(data, family)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, seed=3, restarts=2, **FAST)
    model, guide = _pair(data, family)
    plain = dgp.fit(model, guide, data.X_train, data.y_train, seed=4, **FAST)
    assert runs[1].seed == 4 and runs[1].result.losses == plain.losses
    assert _same(_state(runs[1].model, runs[1].guide), _state(model, guide))


@pytest.mark.parametrize("family", ["meanfield", "autonormal"])
def test_restarts_train_copies_of_their_own(data, family):
    """Each restart's guide is a guide of its own model, under names no other restart has,
    the restarts end apart, and training one moves no other."""
    model, guide = _pair(data, family)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, seed=0, restarts=3, **FAST)
    assert runs[0].model is model and [r.seed for r in runs] == [0, 1, 2]
    names = {pyro_name(m) for r in runs for m in (r.model, r.guide)}
    assert len(names) == 6
    for r in runs:
        assert r.guide.model is r.model
        assert r.model.num_data == data.X_train.shape[0]
    states = [_state(r.model, r.guide) for r in runs]
    assert not _same(states[0], states[1]) and not _same(states[1], states[2])
    dgp.fit(runs[1].model, runs[1].guide, data.X_train, data.y_train, seed=9, **FAST)
    assert _same(_state(runs[0].model, runs[0].guide), states[0])
    assert _same(_state(runs[2].model, runs[2].guide), states[2])
    assert not _same(_state(runs[1].model, runs[1].guide), states[1])


def test_restarts_differ_and_stack_into_one_mixture(data):
    model, guide = _pair(data)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, seed=0, restarts=3, **FAST)
    elbos = runs.final_elbos
    assert len(set(elbos)) == 3 and all(math.isfinite(e) for e in elbos)
    assert runs.best.result.final_elbo == max(elbos)
    stacked = dgp.stack(runs, data.X_test, data.y_test, num_samples=16)
    assert isinstance(stacked, dgp.diagnostics.ensemble.Stacked)
    assert stacked.fits == runs.pairs and stacked.method == "validation"
    assert torch.isclose(stacked.weights.sum(), torch.tensor(1.0, dtype=DT))
    assert stacked.predict(data.X_test, num_samples=4).mean.shape == data.y_test.shape


def test_each_restart_writes_its_own_checkpoint(data, tmp_path):
    model, guide = _pair(data)
    dgp.fit(model, guide, data.X_train, data.y_train, seed=0, restarts=2,
            checkpoint=tmp_path / "fit-{restart}.pt", **FAST)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit-0.pt", "fit-1.pt"]


def test_seed_none_draws_consecutive_seeds_from_the_global_stream(data):
    model, guide = _pair(data)
    torch.manual_seed(4)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, seed=None, restarts=2, **FAST)
    first = runs[0].seed
    assert isinstance(first, int) and [r.seed for r in runs] == [first, first + 1]


def test_best_needs_final_elbos(data):
    model, guide = _pair(data)
    runs = dgp.fit(model, guide, data.X_train, data.y_train, restarts=2,
                   final_elbo_particles=0, **FAST)
    with pytest.raises(ValueError, match="final_elbo_particles > 0"):
        _ = runs.best


@pytest.mark.slow
def test_parallel_restarts_equal_sequential_ones(data):
    """Two processes (restart 0 here, restart 1 in a spawned worker) give the parameters,
    losses and final ELBOs of the same restarts run one after another."""
    runs = {}
    for jobs in (1, 2):
        model, guide = _pair(data)
        runs[jobs] = dgp.fit(model, guide, data.X_train, data.y_train, seed=5, restarts=2,
                             jobs=jobs, **FAST)
    for a, b in zip(runs[1], runs[2], strict=True):
        assert _same(_state(a.model, a.guide), _state(b.model, b.guide))
        assert a.result.losses == b.result.losses and a.result.final_elbo == b.result.final_elbo
    assert pyro_name(runs[2][1].guide) != pyro_name(runs[2][0].guide)
