"""The README's examples run as written (on this machine's kernel device)."""

import pathlib
import re

import gradkern

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    gradkern.disable()


def test_readme_names_every_tune_group():
    """The README's list of `scripts/tune.py` groups is the script's GROUPS (it once left out `flat`)."""
    import ast

    listed = re.search(r"\(GROUP: ([^)]*)\)", README.read_text()).group(1)
    tree = ast.parse((README.parent / "scripts" / "tune.py").read_text())
    groups = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "GROUPS" for t in node.targets))
    assert sorted(g.strip() for g in listed.split(",")) == sorted(k.value for k in groups.keys)
