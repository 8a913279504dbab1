"""Every Python package folder ships in the wheel (pyproject lists them explicitly because of package-dir)."""

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
