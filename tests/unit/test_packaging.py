"""Every Python package folder ships in the wheel (pyproject lists them explicitly because of package-dir)."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"flashdraft": "flashdraft", "flashdraft.components": "components", "flashdraft.pipelines": "pipelines"}


def test_every_package_folder_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = set()
    for pkg, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if rel.parts and rel.parts[0] in {"components", "pipelines"} and pkg == "flashdraft":
                continue
            on_disk.add(".".join([pkg, *rel.parts]))
    assert on_disk - listed == set(), f"add these to [tool.setuptools] packages in pyproject.toml: {on_disk - listed}"
    assert listed - on_disk == set(), f"listed but missing on disk: {listed - on_disk}"


def _module_imports() -> dict[str, set[str]]:
    """Module -> the flashdraft modules it imports when it is imported (module level, outside TYPE_CHECKING;
    imports inside functions run later and are not edges of the import graph)."""
    modules = {}
    for pkg, folder in MAPPING.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            if pkg == "flashdraft" and parts and parts[0] in {"components", "pipelines"}:
                continue
            modules[".".join([pkg, *parts])] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            for n in ast.walk(node):
                if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("flashdraft"):
                    edges |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
                elif isinstance(n, ast.Import):
                    edges |= {a.name for a in n.names}
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def test_no_import_cycle_and_the_core_imports_no_stage_or_pipeline_module():
    """The module-level import graph has no cycle (none held together by function-level imports either: those
    run only when called), and core `flashdraft/` reaches stages only through the registry's lazy references."""
    graph = _module_imports()
    assert len(graph) > 80, "the walk found the project's modules"
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, name, dep])
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    core = {n: {d for d in deps if d.startswith(("flashdraft.components", "flashdraft.pipelines"))}
            for n, deps in graph.items() if not n.startswith(("flashdraft.components", "flashdraft.pipelines"))}
    assert not {n: d for n, d in core.items() if d}, "core modules importing a stage or pipeline module"


def test_nothing_under_helm_is_python():
    """A script run from helm/ puts helm/ first on sys.path, where the chart folder helm/flashdraft/ imports as a
    namespace package and shadows the installed flashdraft (issue 39: `make chart-pipeline` failed on a fresh clone
    with "cannot import name '__version__' from 'flashdraft'"). The chart's config step is `flashdraft
    chart-config`; the chart folder holds no Python."""
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "helm").rglob("*.py"))
    assert not scripts, f"Python under helm/ (make it a `flashdraft` command instead): {scripts}"


def test_license_file_matches_the_declared_licence():
    """pyproject.toml declares Apache-2.0; the LICENSE file at the top level is that licence's text."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    text = (ROOT / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
