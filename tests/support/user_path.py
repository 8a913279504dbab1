"""The user's path: the commands README.md and docs/ tell a user to run, read out of their ```bash blocks, and a clean
copy of the repository to run them in, as subprocesses, exactly as written.

Why a copy and a subprocess: twice a documented command failed on a fresh clone while every in-process test passed
(the images' import check; `make chart-pipeline`, whose script beside the chart shadowed the installed package). A
command run by `bash -c` from a copy of the tracked files meets what a user meets: the Makefile, sys.path as the
command sets it, files a fresh clone lacks. The copy shares the installed venv and tools (`.venv`, `.tools`, made by
`make install tools`) through symlinks, and keeps every file's mtime, so make sees the install as up to date and
never reinstalls into the shared venv from the copy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED_INSTALL = (".venv", ".tools")


@dataclass(frozen=True)
class DocCommand:
    """One documented command: the doc it is in (relative to the repository) and the command as written."""

    doc: str
    command: str


def doc_commands() -> list[DocCommand]:
    """The commands of every ```bash block of README.md, then docs/*.md in name order: continuation lines joined,
    comments (after whitespace) dropped, blank lines skipped."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
                if command:
                    out.append(DocCommand(str(doc.relative_to(ROOT)), command))
    return out


def _tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    return [f for f in listed.split("\0") if f and (ROOT / f).is_file()]  # a file deleted but not yet committed


def user_copy(dest: Path) -> Path:
    """A clean copy of the repository at `dest`: the tracked (and untracked, not ignored) files, mtimes kept, and
    the installed `.venv` and `.tools` linked in. Refuses if the install is out of date (make would reinstall, and
    point the shared venv's editable install at the copy)."""
    for rel in _tracked_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    for name in SHARED_INSTALL:
        if not (ROOT / name).exists():
            raise RuntimeError(f"{ROOT / name} is missing: run `make install tools` first")
        (dest / name).symlink_to(ROOT / name)
    stale = subprocess.run(["make", "-q", "install", "tools"], cwd=dest, capture_output=True)
    if stale.returncode != 0:
        raise RuntimeError("the installed venv is older than pyproject.toml: run `make install` first")
    return dest


@dataclass(frozen=True)
class Ran:
    command: str
    returncode: int
    output: str  # stdout and stderr, interleaved as a terminal shows them (not a tty: no colour)


def run_as_user(command: str, cwd: Path, timeout: float = 1800) -> Ran:
    """`command` exactly as written, by bash, in `cwd`, with the copy's venv first on PATH (a user who activated
    it; commands written `.venv/bin/flashdraft` do not need it)."""
    env = {**os.environ, "PATH": f"{cwd / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return Ran(command, done.returncode, done.stdout)
