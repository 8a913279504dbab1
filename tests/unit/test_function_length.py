"""Small functions (the project's standard, issue 48): none over 80 lines in flashdraft/, components/ and
pipelines/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
TREES = ("flashdraft", "components", "pipelines")


def long_functions(root: Path, tree: str) -> list[str]:
    """`path:line name lines` of every function under root/tree (def or async def, methods and nested ones too)
    over MAX_LINES, the path relative to `root`."""
    out = []
    for path in sorted((root / tree).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} {lines}")
    return out


def test_no_function_is_over_80_lines():
    found = [f for tree in TREES for f in long_functions(ROOT, tree)]
    assert found == [], "split by meaning: " + "; ".join(found)


def test_the_check_sees_a_long_method(tmp_path):
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))  # with its def line: MAX_LINES + 1
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n")
    assert long_functions(tmp_path, "pkg") == [f"pkg/m.py:6 long {MAX_LINES + 1}"]
