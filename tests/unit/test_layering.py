"""The layering docs/architecture.md states, checked on every import statement: module level, inside functions and
under TYPE_CHECKING alike (an import that only runs later still ties the two modules together).

Each package (a subpackage of flashdraft/, each stage package in components/, the registry module beside them,
pipelines/) sits at one place in `ORDER` and may import only packages before it. Inside a package, no module may
import itself back through others (no module cycle). A package missing from `ORDER` fails too: a new package is
placed deliberately, not by accident.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# folder in the repository -> the package it installs as (pyproject's package-dir mapping)
TREES = {"flashdraft": "flashdraft", "components": "flashdraft.components", "pipelines": "flashdraft.pipelines"}
# Bottom first. `flashdraft` is the root package's __init__ (the version); the stages follow pipeline order, so a
# stage may read an upstream stage's contract (its summary type) and never the reverse; `flashdraft.components` is
# components/stages.py, the registry of stage objects that the CLI and the pipeline import.
CORE = ["flashdraft", "config", "perf", "target", "storage", "features", "drafter", "tracking", "run", "cli"]
STAGES = ["plan", "prep", "generate", "extract", "stream_end", "train", "evaluate", "export", "report"]
ORDER = ([f"flashdraft.{p}" if p != "flashdraft" else p for p in CORE]
         + [f"flashdraft.components.{s}" for s in STAGES] + ["flashdraft.components", "flashdraft.pipelines"])


def modules() -> dict[str, tuple[Path, str]]:
    """Every module of the three trees: its file and its package (a subfolder of flashdraft/ or components/;
    a loose module of components/ belongs to `flashdraft.components`; all of pipelines/ is one package)."""
    out = {}
    for folder, name in TREES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            in_subfolder = len(parts) > 1 and name != "flashdraft.pipelines"
            package = f"{name}.{parts[0]}" if in_subfolder else name
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = (path, package)
    return out


def imports(module: str, path: Path, mods: dict[str, tuple[Path, str]]) -> list[tuple[str, int]]:
    """(imported flashdraft module, line) for every import statement in the file, wherever it sits."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in mods:  # `from pkg.mod import attr`: the module is the longest known prefix
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                out.append((name, node.lineno))
    return out


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """The module graph, and each import that points at a package not below the importer's."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    upward: set[str] = set()
    for module, (path, src) in mods.items():
        for target, line in imports(module, path, mods):
            edges[module].add(target)
            dst = mods[target][1]
            if src != dst and src in ORDER and dst in ORDER and ORDER.index(dst) > ORDER.index(src):
                upward.add(f"{path.relative_to(REPO)}:{line}: {src} imports {dst}, which is above it")
    return edges, sorted(upward)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_package_is_placed():
    unplaced = sorted({package for _, package in modules().values() if package not in ORDER})
    assert not unplaced, f"packages missing from test_layering.ORDER (place them in the layering): {unplaced}"


def test_no_import_points_up_the_layering():
    _, upward = graph()
    assert not upward, "imports against the layering (docs/architecture.md):\n" + "\n".join(upward)


def test_no_module_cycle():
    edges, _ = graph()
    assert cycles(edges) == []


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    """The checker itself: an import inside a function body, from the store up into the run layer, is reported,
    and two modules importing each other form a cycle."""
    fake = tmp_path / "flashdraft"
    (fake / "storage").mkdir(parents=True)
    (fake / "run").mkdir()
    for f in ("__init__.py", "storage/__init__.py", "run/__init__.py"):
        (fake / f).write_text("")
    (fake / "storage" / "store.py").write_text("def f():\n    from flashdraft.run import registry\n")
    (fake / "run" / "registry.py").write_text("from flashdraft.run import other\n")
    (fake / "run" / "other.py").write_text("if False:\n    from flashdraft.run.registry import x\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "TREES", {"flashdraft": "flashdraft"})
    edges, upward = graph()
    assert upward == ["flashdraft/storage/store.py:2: flashdraft.storage imports flashdraft.run, which is above it"]
    assert cycles(edges) == [["flashdraft.run.other", "flashdraft.run.registry"]]


def test_architecture_doc_states_this_order():
    """docs/architecture.md's layering paragraph names the packages in exactly this order."""
    text = " ".join((REPO / "docs" / "architecture.md").read_text().split())
    found = re.search(r"Layering, bottom first: (.*?)\.(\s|$)", text)
    assert found, "docs/architecture.md has no 'Layering, bottom first: ...' sentence"
    named = re.findall(r"`([\w./]+)`", found.group(1))
    assert named == [p.removeprefix("flashdraft.") if p != "flashdraft" else p for p in ORDER]
