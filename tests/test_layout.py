"""The layers stay visible: imports flow downward, shared constants are defined once, no function takes more than
32 parameters (kernel arguments travel as tuples and constexpr groups), and tuned constants live in config
objects. Static checks over the source tree (no kernel runs)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "gradkern"
MAX_PARAMS = 32

# package -> the gradkern packages and top-level modules it must not import (data flows downward)
FORBIDDEN = {
    "launch": ("engines", "kernels", "routing", "tools", "plan", "registry"),
    "engines": ("kernels", "routing", "tools", "plan"),
    "kernels": ("tools", "plan"),  # (kernels declare their routes with routing.autograd and call stock through it)
    "routing": ("tools",),
    "config.py": ("launch", "engines", "kernels", "routing", "tools", "plan", "registry"),
}


def _modules() -> list[pathlib.Path]:
    return sorted(SRC.rglob("*.py"))


def _imported(path: pathlib.Path) -> set[str]:
    """The gradkern modules `path` imports, as dotted names below gradkern (relative imports resolved)."""
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("gradkern"):
                mod = node.module.removeprefix("gradkern").lstrip(".")
            else:
                continue
            out.add(mod)
            out.update(f"{mod}.{a.name}".lstrip(".") for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix("gradkern.") for a in node.names if a.name.startswith("gradkern."))
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_flow_downward(path):
    rel = path.relative_to(SRC)
    owner = rel.parts[0]
    forbidden = FORBIDDEN.get(owner, ())
    bad = sorted(m for m in _imported(path) for f in forbidden if m == f or m.startswith(f + "."))
    assert not bad, f"{rel} imports {bad}: a lower layer must not import {forbidden}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_function_takes_more_than_32_parameters(path):
    too_many = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            if n > MAX_PARAMS:
                too_many.append(f"{getattr(node, 'name', 'lambda')} ({n})")
    assert not too_many, f"{path.relative_to(SRC)}: {too_many} take more than {MAX_PARAMS} parameters"


# a shared constant or helper, and the one module that defines it
SHARED = {
    r"^\s*_?I32_MAX\s*=": "_runtime.py",
    r"^\s*_?\w*TL\w*\s*=\s*\{\s*torch\.float32\s*:\s*tl\.float32": "launch/tl_helpers.py",
    r"return 1 << max\(": "_runtime.py",
}


@pytest.mark.parametrize("pattern", list(SHARED))
def test_shared_constants_are_defined_once(pattern):
    where = [str(p.relative_to(SRC)) for p in _modules() if re.search(pattern, p.read_text(), re.M)]
    assert where == [SHARED[pattern]], f"{pattern!r} is defined in {where}, not only in {SHARED[pattern]}"
