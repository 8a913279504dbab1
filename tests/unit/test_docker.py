"""Static checks of the three images (no Docker engine runs here): build context, layering, dependencies (the
hadolint lint, a real binary: tests/integration/test_docker_lint.py).

The dependency check reads every stage's imports (ast) and asserts that the image the stage runs on installs a
distribution providing each one, directly or as a dependency of what it installs.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import pytest

from flashdraft.run import registry

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("base", "inference", "trainer")
# Where each component folder's stage runs: its declared pool's image (components/<stage>/stage.py; cpu -> base). Files
# named after a stage (e.g. components/<stage>/<other stage>.py) follow that stage instead of their folder.
POOL_IMAGE = {"cpu": "base", "inference": "inference", "trainer": "trainer"}
STAGE_IMAGE = {spec.name: POOL_IMAGE[spec.pool] for spec in registry.current()}
# What each image must provide for the stages it runs, beyond the base dependencies.
# datasets: prep and the plan gate (base) and evaluate (inference) read hf: datasets through it.
REQUIRED = {"base": {"kfp", "torch", "datasets"}, "inference": {"vllm", "torch", "kfp", "datasets"},
            "trainer": {"torch", "kfp"}}

_spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "docker" / "requirements.py")
_docker_requirements = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_docker_requirements)
requirements = _docker_requirements.requirements


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~\[;(]", req.strip(), maxsplit=1)[0])


def _commands(image: str) -> list:
    return list(dockerfile.parse_file(str(ROOT / "docker" / image / "Dockerfile")))


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dockerignore_excludes(rel: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    def regex(pattern: str) -> re.Pattern:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out + r"\Z")

    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rx = regex(line.lstrip("!").strip("/"))
        if any(rx.match(c) for c in candidates):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("image", IMAGES)
def test_copy_sources_exist_and_reach_the_build_context(image):
    copies = [c for c in _commands(image) if c.cmd.upper() in {"COPY", "ADD"}]
    assert copies, "no COPY in the Dockerfile"
    for cmd in copies:
        assert cmd.cmd.upper() == "COPY", f"line {cmd.start_line}: use COPY, not ADD"
        assert not any(f.startswith("--from") for f in cmd.flags), "single-stage images copy from the context only"
        for src in cmd.value[:-1]:
            path = ROOT / src
            assert path.exists(), f"{image} line {cmd.start_line}: COPY source {src} does not exist"
            assert not _dockerignore_excludes(src.strip("/")), f"{image}: .dockerignore excludes COPY source {src}"


def test_dockerignore_keeps_local_state_out():
    for rel in (".venv/bin/python", ".tools/helm", "runs/x/y", "build/pipeline.yaml", ".git/HEAD",
                "flashdraft/__pycache__/x.pyc", "model.safetensors"):
        assert _dockerignore_excludes(rel), f"{rel} would be sent to the Docker daemon"


ENTRYPOINT_SH = ROOT / "docker" / "entrypoint.sh"


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_is_the_shared_script_and_cmd_runs_the_cli(image):
    cmds = _commands(image)
    entry = [c for c in cmds if c.cmd.upper() == "ENTRYPOINT"][-1]
    assert entry.json and list(entry.value) == ["/opt/flashdraft/entrypoint.sh"], entry.original
    copied = {s for c in cmds if c.cmd.upper() == "COPY" for s in c.value[:-1]}
    assert "docker/entrypoint.sh" in copied, f"{image} does not copy the entrypoint"
    cmd = [c for c in cmds if c.cmd.upper() == "CMD"][-1]
    assert cmd.json and list(cmd.value) == ["--help"]


def _entrypoint(tmp_path: Path, *args: str) -> list[str]:
    """What docker/entrypoint.sh execs for these arguments, with `flashdraft` and `sh` stand-ins on PATH that
    print their argv (the script itself runs for real under /bin/sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("flashdraft", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$@"\n')
        (bin_dir / name).chmod(0o755)
    proc = subprocess.run(["/bin/sh", str(ENTRYPOINT_SH), *args], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, check=True)
    return proc.stdout.split()


def test_entrypoint_sends_options_and_sub_commands_to_flashdraft_and_runs_programs(tmp_path):
    assert _entrypoint(tmp_path) == ["flashdraft"]
    assert _entrypoint(tmp_path, "--version") == ["flashdraft", "--version"]
    assert _entrypoint(tmp_path, "plan", "--preset", "tiny") == ["flashdraft", "plan", "--preset", "tiny"]
    assert _entrypoint(tmp_path, "export") == ["flashdraft", "export"]  # a shell builtin's name, not a program
    assert _entrypoint(tmp_path, "python3", "-c", "x") == ["python3", "-c", "x"]
    # kfp.local's DockerRunner passes `sh -c ...` as the container's command
    assert _entrypoint(tmp_path, "sh", "-c", "echo ran $0", "kfp") == ["ran", "kfp"]


@pytest.mark.parametrize("image", IMAGES)
def test_non_root_pinned_cache_volume_and_no_secrets(image):
    cmds = _commands(image)
    users = [c.value[0] for c in cmds if c.cmd.upper() == "USER"]
    assert users and users[-1] not in {"root", "0"}, "the final USER must be non-root"
    args = dict(v.split("=", 1) for c in cmds if c.cmd.upper() == "ARG" for v in c.value if "=" in v)
    base_arg = [c for c in cmds if c.cmd.upper() == "FROM"][0].value[0].strip("${}")
    assert re.search(r":v?\d+\.\d+", args[base_arg]), f"base image {args[base_arg]} is not pinned to a version"
    assert args["TORCH_VERSION"] == next(
        r.split("==")[1] for r in _pyproject()["project"]["dependencies"] if _req_name(r) == "torch"
    ), "the image's torch must be the version pyproject pins"
    text = (ROOT / "docker" / image / "Dockerfile").read_text()
    assert "HF_HOME=/cache/huggingface" in text, "the HF cache must live on the mounted /cache volume"
    for c in cmds:
        if c.cmd.upper() in {"ENV", "ARG"}:
            assert not re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", " ".join(c.value), re.I), c.original


INSTALL_SH = ROOT / "docker" / "install.sh"


def _install_step(image: str, step: str) -> tuple[int, list[str]]:
    """Index of the RUN that calls `install.sh STEP ...` and that call's arguments."""
    for i, c in enumerate(_commands(image)):
        if c.cmd.upper() == "RUN" and f"install.sh {step}" in c.value[0]:
            return i, c.value[0].split(f"install.sh {step}", 1)[1].split("&&", 1)[0].split()
    raise AssertionError(f"{image}: no RUN calls docker/install.sh {step}")


def _install_sh_step(step: str) -> str:
    """The body of one `case` branch of docker/install.sh."""
    body = INSTALL_SH.read_text().split(f"\n  {step})\n", 1)[1]
    return body.split("\n    ;;", 1)[0]


@pytest.mark.parametrize("image", IMAGES)
def test_dependencies_install_before_code_is_copied(image):
    cmds = _commands(image)
    code_copy = next(i for i, c in enumerate(cmds) if c.cmd.upper() == "COPY" and "flashdraft" in c.value[:-1])
    dep_install, _ = _install_step(image, "deps")
    assert dep_install < code_copy
    early = {s for c in cmds[:dep_install] if c.cmd.upper() == "COPY" for s in c.value[:-1]}
    assert early <= {"pyproject.toml", "docker/requirements.py", "docker/install.sh", "docker/entrypoint.sh"}, (
        f"code copied before the dependency layer: {early}")
    app_install, _ = _install_step(image, "app")
    assert app_install > code_copy
    assert "--no-deps" in _install_sh_step("app"), "the code layer must not resolve dependencies again"


def test_install_sh_is_valid_bash_and_refuses_unknown_steps(tmp_path):
    subprocess.run(["bash", "-n", str(INSTALL_SH)], check=True)
    proc = subprocess.run(["bash", str(INSTALL_SH), "deps", "keep-nothing"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "MODE must be keep-torch or keep-all, got 'keep-nothing'" in proc.stderr
    proc = subprocess.run(["bash", str(INSTALL_SH), "bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown step 'bogus'" in proc.stderr


def _image_extras(image: str) -> tuple[list[str], list[str]]:
    """Extras an image installs (`install.sh deps MODE EXTRA...`) and what install.sh leaves to the image."""
    _, argv = _install_step(image, "deps")
    assert argv[0] in {"keep-torch", "keep-all"}, f"{image}: unknown deps mode {argv[0]}"
    call = next(line for line in _install_sh_step("deps").splitlines() if "requirements.py" in line)
    args = call.split("requirements.py", 1)[1].split(">", 1)[0].split()
    assert args[:2] == ["pyproject.toml", '"$@"']
    skip = [args[i + 1] for i, a in enumerate(args) if a == "--skip"]
    return argv[1:], skip


def _closure(names: set[str]) -> set[str]:
    """The given distributions plus everything they require, as far as this environment knows them."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_req_name(r) for r in reqs if "extra ==" not in r and "extra==" not in r]
    return seen


def _third_party_imports(path: Path) -> set[str]:
    """Top-level modules imported anywhere in the file, except optional imports guarded by `except ImportError`."""
    tree = ast.parse(path.read_text())
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"} for h in node.handlers
        ):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    mods = set()
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "flashdraft" and m != "requirements"}


def _files_for(image: str) -> list[Path]:
    files = sorted((ROOT / "flashdraft").rglob("*.py")) + sorted((ROOT / "pipelines").rglob("*.py"))
    for folder in sorted(p for p in (ROOT / "components").iterdir() if p.is_dir()):
        for f in sorted(folder.rglob("*.py")):
            stage = f.stem if f.stem in STAGE_IMAGE else folder.name
            if STAGE_IMAGE.get(stage) == image:
                files.append(f)
    return files


@pytest.mark.parametrize("image", IMAGES)
def test_image_installs_what_its_stages_import(image):
    extras, skip = _image_extras(image)
    project = _pyproject()["project"]
    assert set(skip) <= {"torch", "vllm"}, "only torch and vllm may be left to the base image's own install"
    installed = {_req_name(r) for r in requirements(str(ROOT / "pyproject.toml"), extras, [])}
    assert REQUIRED[image] <= installed, f"{image} misses {REQUIRED[image] - installed} (extras {extras})"
    assert set(extras) <= set(project.get("optional-dependencies", {}))
    provided = _closure(installed)
    dists = {mod: [_norm(d) for d in ds] for mod, ds in md.packages_distributions().items()}
    missing = []
    for f in _files_for(image):
        for mod in _third_party_imports(f):
            candidates = dists.get(mod, [_norm(mod)])
            if not any(d in provided for d in candidates):
                missing.append(f"{f.relative_to(ROOT)} imports {mod} ({'/'.join(candidates)})")
    assert not missing, f"the {image} image does not install: " + "; ".join(missing)


def test_make_images_tags_and_exports_registry_and_tag_to_compile():
    make = ["make", "-C", str(ROOT), "REGISTRY=registry.example/team", "TAG=abc123"]
    dry = subprocess.run([*make, "-n", "images", "push"], capture_output=True, text=True, check=True).stdout
    dry = re.sub(r" +", " ", dry.replace("\\\n", " "))  # make -n echoes a recipe's continuation lines as written
    for image in IMAGES:
        build = re.search(rf"docker buildx build --platform linux/amd64 --load .* -f docker/{image}/Dockerfile "
                          rf"-t registry.example/team/flashdraft-{image}:abc123 \.", dry)
        assert build, f"{image}: built for linux/amd64 and tagged for the registry (make images): {dry}"
        assert f"docker push registry.example/team/flashdraft-{image}:abc123" in dry
    env = subprocess.run([*make, "-s", "--eval", "print-image-env: ; @echo $$FLASHDRAFT_IMAGE_REGISTRY "
                          "$$FLASHDRAFT_IMAGE_TAG", "print-image-env"], capture_output=True, text=True, check=True)
    assert env.stdout.split() == ["registry.example/team", "abc123"]
