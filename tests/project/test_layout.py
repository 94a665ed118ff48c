"""The package's shape: small modules and functions, no module reaching into another's
private names, comments and docstrings that speak of the method (not of the code's history)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pyro_dgp"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: history of the code, or papers named by a file instead of author and year
NARRATION = re.compile(r"\bsession \d|\bseed 00\d|\bperiod \d", re.IGNORECASE)
OUTSIDE = re.compile(r"REFERENCE\.md|DESIGN\.md|seeds/")


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_is_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(path)}: {lines} lines"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_functions_are_small(path):
    tree = ast.parse(path.read_text())
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{_name(path)}: {long}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_private_names_of_other_modules(path):
    """``from .x import _y`` reaches into another module's internals."""
    tree = ast.parse(path.read_text())
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path).rsplit(
        ".", 1)[0]
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                "pyro_dgp")):
            bad += [f"{'.' * node.level}{node.module}.{a.name}" for a in node.names
                    if a.name.startswith("_")]
    assert not bad, f"{_name(path)} (package {package}) imports private names {bad}"


#: private names of third-party objects the package reads, each with the reason no public way
#: exists; every other ``x._name`` with ``x`` not ``self``, ``cls`` or ``super()`` must name
#: something this module defines
THIRD_PARTY_PRIVATES = {
    "_pyro_name": "PyroModule's parameter prefix; read in one helper, validation.pyro_name",
    "_pyro_params": "PyroModule's registry of PyroParams (the declared constraints)",
    "_pyro_samples": "PyroModule's registry of PyroSamples",
    "_unbroadcasted_scale_tril": "torch MultivariateNormal's Cholesky factor without a copy "
                                 "per batch entry",
    "_validate_args": "torch Distribution.expand's own pattern for a new instance",
    "_unconstrained_shapes": "Pyro AutoNormal's shapes of its sites (no public accessor)",
    "_get_loc_and_scale": "Pyro AutoNormal's loc and scale of a site in constrained space",
    "_mask": "Pyro MaskedDistribution's mask (False: the site is masked out entirely)",
    "_model": "Pyro AutoGuide's model, which its __getstate__ drops on every copy (no setter)",
}
#: the third-party privates read in one module only: the helper that wraps them
READ_ONLY_IN = {"_pyro_name": "pyro_dgp/validation.py",
                "_model": "pyro_dgp/guides/families/completed.py"}


def _defined_here(tree: ast.AST) -> set[str]:
    """The names this module defines: functions, classes, assignments, and attributes set on
    ``self`` or ``cls``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return names


def _private_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, expression, name)`` of each ``x._name`` (or ``getattr(x, "_name")``, and
    ``hasattr``/``setattr``) whose ``x`` is not ``self``, ``cls`` or ``super()``; dunders
    excluded."""
    found = []
    for node in ast.walk(tree):
        target, name = None, None
        if isinstance(node, ast.Attribute):
            target, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            target, name = node.args[0], node.args[1].value
        if name is None or not name.startswith("_") or (name.startswith("__")
                                                         and name.endswith("__")):
            continue
        if isinstance(target, ast.Name) and target.id in ("self", "cls"):
            continue
        if (isinstance(target, ast.Call) and isinstance(target.func, ast.Name)
                and target.func.id == "super"):
            continue
        found.append((node.lineno, ast.unparse(node), name))
    return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_private_attributes_of_other_modules(path):
    """``obj._x`` where ``obj`` is defined in another module reaches into its internals: make
    it a documented method or property there (third-party privates: the allow-list)."""
    tree = ast.parse(path.read_text())
    own = _defined_here(tree)
    bad = [f"{line}: {expr}" for line, expr, name in _private_reads(tree)
           if name not in own and (name not in THIRD_PARTY_PRIVATES
                                   or READ_ONLY_IN.get(name, _name(path)) != _name(path))]
    assert not bad, f"{_name(path)} reads private names of other modules' objects: {bad}"


def test_the_private_attribute_check_catches_a_reach():
    """The check above sees attribute reads and ``getattr`` of another object's private name,
    and leaves ``self``, ``super()``, dunders and the module's own names alone."""
    source = ("class A:\n    def f(self, layer):\n        self._own = 1\n"
              "        return layer._factor(self._own), getattr(layer, '_prefix'), "
              "super()._g(), layer.__dict__, layer._own\n")
    tree = ast.parse(source)
    own = _defined_here(tree)
    bad = [name for _, _, name in _private_reads(tree) if name not in own]
    assert sorted(bad) == ["_factor", "_prefix"]


#: the classes of ``pyro_dgp.guides`` that code outside it must not test a guide against
GUIDE_CLASSES = {"LayerGuide", "MeanField", "Coupled", "Chain", "Completed", "SemiImplicit",
                 "Amortized", "JointGaussian", "GaussianBlocks", "PlainGuide"}


def _guide_switches(tree: ast.AST) -> list[str]:
    """``isinstance(x, <a guide class>)``, and ``getattr``/``hasattr`` of an object named
    ``guide``: the questions that the guide protocol answers instead."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        if node.func.id == "isinstance" and len(node.args) == 2:
            classes = [n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                       for n in ast.walk(node.args[1])]
            if GUIDE_CLASSES & set(classes):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (node.func.id in ("getattr", "hasattr") and isinstance(node.args[0], ast.Name)
              and node.args[0].id == "guide"):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", [p for p in MODULES if "guides" not in p.parts], ids=_name)
def test_no_guide_family_switches_outside_guides(path):
    """Outside ``pyro_dgp/guides/`` a guide is asked through ``protocol_of(guide)``, never
    tested for its class or probed for an attribute."""
    found = _guide_switches(ast.parse(path.read_text()))
    assert not found, f"{_name(path)} switches on guide families: {found}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_text_speaks_of_the_method(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if NARRATION.search(line) or OUTSIDE.search(line)]
    assert not hits, f"{_name(path)}:\n" + "\n".join(hits)
