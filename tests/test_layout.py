"""The package's shape: small modules and functions, no module reaching into another's
private names, comments and docstrings that speak of the method (not of the code's history)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pyro_dgp"
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


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_text_speaks_of_the_method(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if NARRATION.search(line) or OUTSIDE.search(line)]
    assert not hits, f"{_name(path)}:\n" + "\n".join(hits)
