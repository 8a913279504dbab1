"""Which flashdraft (version, git commit), which libraries and which target weights made a result: written into
every export's model card and metrics, and shown by the report, so a drafter found on disk months later says what
produced it. The target's commit and weight digest come from the run's pin (flashdraft/run/target_pin.py).

The commit comes from `$FLASHDRAFT_COMMIT` (an image build passes it, a checkout without git can set it), else from
`git` when flashdraft runs from a checkout ("+dirty" when tracked files differ from it), else it is unknown (None):
an installed wheel has no history to ask.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, Field

from flashdraft import __version__

COMMIT_ENV = "FLASHDRAFT_COMMIT"
LIBRARIES = ("torch", "transformers", "safetensors", "kfp", "vllm")


class Provenance(BaseModel):
    """flashdraft's version and commit, Python's and the key libraries' versions (absent ones left out)."""

    flashdraft: str = Field(description="flashdraft.__version__")
    commit: str | None = Field(None, description="git commit of flashdraft (+dirty for uncommitted changes); None "
                                                 "when unknown")
    python: str = Field(description="Python version")
    libraries: dict[str, str] = Field(default_factory=dict, description="installed version of each key library")
    target_sha: str | None = Field(None, description="the Hub commit of the target every stage loaded (the run's "
                                                     "target/pin.json); None for a local folder or an older run")
    target_weights_sha256: str | None = Field(None, description="sha256 over the target's safetensors files' names "
                                                                "and sha256s (the run's pin)")

    @property
    def short_commit(self) -> str:
        """The commit's first 12 hex digits (+dirty), or "unknown"."""
        if not self.commit:
            return "unknown"
        return self.commit[:12] + ("+dirty" if self.commit.endswith("+dirty") else "")

    def line(self) -> str:
        """`flashdraft 0.1.0 (commit 6e030b940518), Python 3.11.9, torch 2.13.0, ...`: one line for a page."""
        libs = ", ".join(f"{k} {v}" for k, v in self.libraries.items())
        return f"flashdraft {self.flashdraft} (commit {self.short_commit}), Python {self.python}" + (
            f", {libs}" if libs else "")


def git_commit() -> str | None:
    """$FLASHDRAFT_COMMIT, else the checkout's HEAD (+dirty), else None."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV].strip()
    return _git_head(str(Path(__file__).resolve().parent))


def _git_head(folder: str) -> str | None:
    try:
        head = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", folder, "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=30).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if head and dirty else head or None


def current(target_sha: str | None = None, target_weights_sha256: str | None = None) -> Provenance:
    """This process's provenance, with the run's pinned target weights when the caller knows them."""
    libs = {}
    for name in LIBRARIES:
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return Provenance(flashdraft=__version__, commit=git_commit(), python=sys.version.split()[0], libraries=libs,
                      target_sha=target_sha, target_weights_sha256=target_weights_sha256)
