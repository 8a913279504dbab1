"""Print the pip requirements of flashdraft (base + the named extras), one per line.

Images install these in a layer that depends only on pyproject.toml, then copy the code and install the package
itself with --no-deps, so a code change does not rebuild the dependency layers. What the base image brings is left
out with `--skip NAME` (torch: each image installs its CPU/CUDA build of the pinned version first; vllm: the vLLM
image's own). `--local-models` prints `[tool.flashdraft] local-models` instead: the small real models of the local
presets, installed --no-deps by images and `make install` alike.

Usage: python requirements.py PYPROJECT [EXTRA ...] [--skip NAME ...]
       python requirements.py PYPROJECT --local-models
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(pyproject: str, extras: list[str], skip: list[str]) -> list[str]:
    project = tomllib.load(open(pyproject, "rb"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"{pyproject}: no optional-dependencies named {unknown}; have {sorted(optional)}")
    reqs = list(project["dependencies"]) + [r for e in extras for r in optional[e]]
    skipped = {s.lower() for s in skip}
    return [r for r in reqs if re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() not in skipped]


def local_models(pyproject: str) -> list[str]:
    tool = tomllib.load(open(pyproject, "rb")).get("tool", {}).get("flashdraft", {})
    if "local-models" not in tool:
        raise SystemExit(f"{pyproject}: no [tool.flashdraft] local-models")
    return list(tool["local-models"])


def main(argv: list[str]) -> None:
    args, skip = list(argv), []
    if "--local-models" in args:
        args.remove("--local-models")
        print("\n".join(local_models(args[0])))
        return
    while "--skip" in args:
        i = args.index("--skip")
        skip.append(args[i + 1])
        del args[i : i + 2]
    print("\n".join(requirements(args[0], args[1:], skip)))


if __name__ == "__main__":
    main(sys.argv[1:])
