"""The guide protocol (``pyro_dgp.guides.protocol``): every registered family answers each of
its questions with the declared type on a small model, a plain Pyro guide is answered for,
and the family of ``docs/write-a-guide.md`` registers, trains and answers it too."""

import contextlib
import math
import re
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from registry_models import model_for

import pyro_dgp as dgp
from pyro_dgp.guides import registry
from pyro_dgp.guides.blocks import GaussianBlocks
from pyro_dgp.guides.draws import trace_draws
from pyro_dgp.guides.protocol import GuideProtocol, PlainGuide, protocol_of

DT = torch.float64
S = 3
PAGE = Path(__file__).resolve().parents[2] / "docs" / "write-a-guide.md"

#: each public name of the protocol and the check of its answer (a flag's type, a method's
#: return); a name added to the protocol must be added here
FLAGS = {"mean_field": bool, "per_draw_weights": bool, "no_weights_reason": str,
         "tractable_log_q": bool, "supports_local_inducing": bool, "is_layer_guide": bool,
         "is_set_up": bool, "draws_shared": bool, "only_its_objective": bool}
METHODS = {"default_objective", "num_components", "model", "layers_log_q",
           "natural_gradient_blocks",
           "export_attrs", "weighted_paths", "shared_draws", "sample_paths"}


def _data(N=12):
    X = torch.linspace(-1, 1, N, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X[:, 0])


def _check_protocol(guide, model, X):
    """Each answer of the protocol for ``guide`` (set up on ``model``) has its declared
    type."""
    answers = protocol_of(guide)
    assert answers is guide and answers.model is model
    for flag, kind in FLAGS.items():
        assert isinstance(getattr(answers, flag), kind), flag
    assert answers.is_layer_guide and answers.is_set_up and not answers.draws_shared
    assert answers.default_objective in ("elbo", "analytic-kl", "amortized", "stratified")
    assert answers.num_components is None or answers.num_components >= 1
    trace = trace_draws(guide, (X,), S)
    log_q = answers.layers_log_q(trace, S)
    assert log_q is None or (isinstance(log_q, torch.Tensor) and log_q.shape == (S,))
    blocks = answers.natural_gradient_blocks()
    assert blocks is None or isinstance(blocks, GaussianBlocks)
    attrs = answers.export_attrs()
    assert isinstance(attrs["guide"], str)
    assert all(isinstance(v, str | int) for v in attrs.values())
    with answers.weighted_paths() as weights:
        assert weights is None or (isinstance(weights, torch.Tensor) and weights.dim() == 1)
    with answers.shared_draws():
        assert answers.draws_shared
    try:
        paths = answers.sample_paths()
    except (TypeError, NotImplementedError):  # a family without sample paths says so
        return
    assert isinstance(paths, contextlib.AbstractContextManager)


def test_the_checks_cover_the_whole_protocol():
    public = {n for n in dir(GuideProtocol) if not n.startswith("_")}
    assert public == set(FLAGS) | METHODS


@pytest.mark.parametrize("name", sorted(registry.GUIDES))
def test_every_registered_family_answers_the_protocol(name):
    pyro.clear_param_store()
    X, y = _data()
    model = model_for(name, X, y, num_layers=2, num_inducing=3, hidden_dim=1)
    guide = registry.make_guide(name, model)
    guide(X)
    _check_protocol(guide, model, X)


def test_the_registry_sets_follow_the_families_declarations():
    for entry in registry.entries():
        assert issubclass(entry.family, dgp.guides.LayerGuide)
        assert (entry.name in registry.LOCAL_INDUCING_GUIDES) == \
            entry.family.supports_local_inducing
        assert (entry.name in registry.SEMI_IMPLICIT_GUIDES) == (not entry.family.tractable_log_q)
    with pytest.raises(ValueError, match="'meanfield' is registered already"):
        registry.register_guide("meanfield", "again")(dgp.guides.MeanField)


def test_a_plain_pyro_guide_is_answered_for():
    """An autoguide of the model: not a layer guide, its runs are importance weights, and it is
    set up once it has run."""
    pyro.clear_param_store()
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=3)
    guide = AutoNormal(dgp.inducing_only(model))
    answers = protocol_of(guide)
    assert isinstance(answers, PlainGuide) and not answers.is_layer_guide
    assert answers.per_draw_weights and answers.tractable_log_q and not answers.mean_field
    assert answers.default_objective == "elbo" and answers.model is None
    assert answers.natural_gradient_blocks() is None and answers.layers_log_q(None, S) is None
    assert answers.export_attrs() == {"guide": "AutoNormal"}
    assert not answers.is_set_up
    guide(X)
    assert answers.is_set_up
    with pytest.raises(TypeError, match="sample paths need a layer guide"):
        answers.sample_paths()


def _page_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "docs/write-a-guide.md holds one python block"
    return blocks[0]


def test_the_family_of_the_write_a_guide_page_registers_trains_and_answers(monkeypatch):
    # the page registers "diagonal" for the length of this test only
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))
    monkeypatch.setattr(registry, "GUIDES", dict(registry.GUIDES))
    namespace = {}
    exec(compile(_page_code(), str(PAGE), "exec"), namespace)
    pyro.clear_param_store()
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=3, hidden_dim=1)
    guide = registry.make_guide("diagonal", model)
    assert isinstance(guide, namespace["Diagonal"]) and "diagonal" in registry.GUIDES
    result = dgp.fit(model, guide, X, y, num_steps=5, progress=False)
    assert torch.isfinite(torch.tensor(result.losses)).all()
    _check_protocol(guide, model, X)
    assert guide.q("layer1").loc.shape == (3,)  # D_out = 1, M = 3
    assert float(guide.layer_kl("layer2")) >= 0
    renyi = dgp.infer.make_objective("renyi", guide)  # its runs are importance weights
    assert math.isfinite(renyi.loss(model, guide, X, y))
