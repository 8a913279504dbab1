"""A real Hugging Face Hub-protocol server for tests: olah (PyPI `olah`, a self-hosted Hub mirror) on 127.0.0.1 in
offline mode, serving local git repositories from its `mirrors-path`, so `datasets.load_dataset`,
`huggingface_hub.snapshot_download`, `HfApi.dataset_info` and transformers' `from_pretrained` talk HTTP to it as they
would to huggingface.co (with `HF_ENDPOINT` pointed at it). olah runs from its own venv (`make olah-venv`: it pins
psutil<6, older than .venv's). Nothing here reaches the internet: olah's offline mode never calls upstream.

What olah serves (0.5.4): a repository is `<mirrors>/<datasets|models>/<org>/<name>`, a plain git repository whose
commits are the Hub revisions (branches, tags and 40-hex commits resolve); a repository without a README.md card is
not found. It answers `/api/<type>s/<id>/revision/<rev>` (`HfApi.dataset_info(id, revision=...)`,
`model_info(id, revision=...)`) but not the bare `/api/models/<id>`; a repository an access rule hides answers 401
RepositoryNotFound (it cannot express a gated repository: see test_hub_sources.py's `_mock_` test for that error).
For a file or folder a local repository lacks it answers 401 RepositoryNotFound where the Hub answers 404
EntryNotFound (transformers probes optional files such as tokenizer.model and takes only a 404 as "absent"):
olah_hub.py runs olah's own CLI with that one answer corrected.

Fixtures (registered by tests/conftest.py's `pytest_plugins`):

* `hub_server` (session): olah started on a free port over a fresh mirrors folder holding every dataset the
  `qwen3.6-27b` preset reads, laid out as their Hub cards describe (tiny row counts, PRESET_DATASETS):
  `nvidia/Nemotron-Post-Training-Dataset-v2` (one default config, splits chat, code, math, stem, multilingual_*,
  `data/<split>-*.parquet` of `messages` rows, `extra_gated_fields` in its card), `sahil2801/CodeAlpaca-20k` (one
  JSON file, split train), `openai/gsm8k` (configs main and socratic, splits train and test, `question` column, no
  default config), `HuggingFaceH4/MATH-500` (test.jsonl, `problem`), `google-research-datasets/mbpp` (configs full
  (default) and sanitized, `text` / `prompt` columns) and `tatsu-lab/alpaca` (split train, alpaca rows). Yields a
  `HubServer`; stopped at the end of the session.
* `hub_model` (session): `TINY_MODEL`, a model repository on `hub_server` holding the `tiny-qwen35` preset's
  checkpoint (Qwen3_5ForConditionalGeneration, the Qwen3.5/3.6 tokenizer, safetensors), built on first use. Yields a
  `HubModel` (repo id, first commit sha, the local folder it was copied from).
* `hub_env` (function): this test's environment pointed at `hub_server` (`HubServer.env`: HF_ENDPOINT set,
  HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / HF_TOKEN unset, HF_HOME under tmp_path), for subprocesses and in process
  (huggingface_hub and datasets read HF_ENDPOINT and their cache folders at import: their copies are patched too).
  Returns the `HubServer`.

Helpers on `HubServer` (a test that changes a repository works on its own: `copy` a shared one to a new id first,
so other tests sharing the session's server see the repositories as built):

* `create(repo_id, files, repo_type="dataset")` -> commit sha: a new repository (files: path -> bytes | str | Path;
  README.md required, `dataset_card(...)` writes one).
* `commit(repo_id, files=..., delete=..., repo_type=...)` -> sha: a new commit on main (a revision moving mid-run).
* `copy(repo_id, new_id, repo_type=...)` -> sha: the repository's files at main, committed afresh under `new_id`.
* `head(repo_id, ref="main", repo_type=...)`, `tag(repo_id, name, repo_type=...)`, `repo_dir(...)`.
* `env(hf_home)`: the variables a subprocess needs to use this server (merge into a copy of os.environ).

Module helpers: `parquet_bytes(rows)`, `jsonl_bytes(rows)`, `dataset_card(configs, splits=..., extra=...)`, and the
repository builders `nemotron_v2_files()`, `gsm8k_files()`, ... that PRESET_DATASETS maps ids to.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .s3 import free_port, wait_for_port

REPO = Path(__file__).resolve().parents[2]
OLAH_VENV = REPO / ".venv-olah"
GIT_AUTHOR = ["-c", "user.name=flashdraft-tests", "-c", "user.email=tests@flashdraft.invalid",
              "-c", "core.compression=0", "-c", "core.looseCompression=0", "-c", "commit.gpgsign=false"]

NEMOTRON = "nvidia/Nemotron-Post-Training-Dataset-v2"
CODEALPACA = "sahil2801/CodeAlpaca-20k"
GSM8K = "openai/gsm8k"
MATH500 = "HuggingFaceH4/MATH-500"
MBPP = "google-research-datasets/mbpp"
ALPACA = "tatsu-lab/alpaca"
TINY_MODEL = "flashdraft-test/tiny-qwen3.6"
NEMOTRON_SPLITS = ("stem", "chat", "math", "code", "multilingual_ja", "multilingual_de", "multilingual_it",
                   "multilingual_es", "multilingual_fr")
ROWS_PER_SPLIT = 12  # Nemotron's English splits; the multilingual ones hold 3


FileContent = bytes | str | Path


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """`rows` as one Parquet file, as the Hub's parquet-converted datasets hold them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def dataset_card(configs: list[dict[str, Any]] | None = None, splits: Mapping[str, Mapping[str, int]] | None = None,
                 extra: Mapping[str, Any] | None = None, title: str = "test dataset") -> str:
    """A README.md dataset card: YAML front matter (`configs` as the Hub's data_files, `dataset_info` split sizes
    per config from `splits` {config: {split: rows}}, anything in `extra`) and a title."""
    meta: dict[str, Any] = {"license": "cc-by-4.0", **(extra or {})}
    if splits:
        meta["dataset_info"] = [{"config_name": name, "splits": [
            {"name": split, "num_bytes": 100 * rows, "num_examples": rows} for split, rows in per_split.items()]}
            for name, per_split in splits.items()]
    if configs:
        meta["configs"] = configs
    return f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n# {title}\n"


def _chat_row(split: str, i: int) -> dict[str, Any]:
    question = {"code": f"Write a Python function that returns the sum of the first {i + 2} square numbers.",
                "math": f"What is {i + 3} times {i + 7}, plus {2 * i + 1}?",
                "stem": f"Explain in two sentences why a metal spoon {i + 1} cm long feels colder than wood.",
                "chat": f"Give me {i % 4 + 2} tips for a calm morning routine, number {i}."}.get(
        split, f"Réponds brièvement ({split}, {i}): quelle est la capitale de la France?")
    return {"uuid": f"{split}-{i:05d}", "license": "CC BY 4.0", "generator": "test", "version": "v2",
            "category": split.split("_")[0], "reasoning": "off",
            "messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": f"An answer to {split} question {i}."}]}


def nemotron_v2_files(rows_per_split: int = ROWS_PER_SPLIT) -> dict[str, FileContent]:
    """nvidia/Nemotron-Post-Training-Dataset-v2 as its card lays it out: one default config whose nine splits
    are `data/<split>-*.parquet` of `messages` rows, `dataset_info` row counts, and the gating fields."""
    rows = {s: rows_per_split if "_" not in s else 3 for s in NEMOTRON_SPLITS}
    files: dict[str, FileContent] = {
        f"data/{s}-00000-of-00001.parquet": parquet_bytes([_chat_row(s, i) for i in range(n)])
        for s, n in rows.items()}
    configs = [{"config_name": "default", "data_files": [{"split": s, "path": f"data/{s}-*"} for s in rows]}]
    files["README.md"] = dataset_card(configs, {"default": rows}, title="Nemotron-Post-Training-Dataset-v2",
                                      extra={"extra_gated_fields": {"Company": "text",
                                                                    "Institutional Email": "text"}})
    return files


def codealpaca_files() -> dict[str, FileContent]:
    """sahil2801/CodeAlpaca-20k: one JSON list of alpaca rows, no configs in the card (split train)."""
    rows = [{"instruction": f"Write a function that reverses a list of {i + 2} numbers.", "input": "",
             "output": "def rev(xs):\n    return xs[::-1]"} for i in range(8)]
    return {"code_alpaca_20k.json": json.dumps(rows).encode(), "README.md": dataset_card(title="CodeAlpaca-20k")}


def gsm8k_files() -> dict[str, FileContent]:
    """openai/gsm8k: configs main and socratic (no default: a load without a config name fails), splits train and
    test of `question` / `answer` rows."""
    files: dict[str, FileContent] = {}
    for config in ("main", "socratic"):
        for split, n in (("train", 6), ("test", 10)):
            files[f"{config}/{split}-00000-of-00001.parquet"] = parquet_bytes([
                {"question": f"Ann has {i + 4} apples and buys {i + 1} more. How many apples does she have?",
                 "answer": f"{i + 4} + {i + 1} = {2 * i + 5}\n#### {2 * i + 5}"} for i in range(n)])
    configs = [{"config_name": c, "data_files": [{"split": s, "path": f"{c}/{s}-*"} for s in ("train", "test")]}
               for c in ("main", "socratic")]
    return {**files, "README.md": dataset_card(configs, {c: {"train": 6, "test": 10} for c in ("main", "socratic")},
                                               title="gsm8k")}


def math500_files() -> dict[str, FileContent]:
    """HuggingFaceH4/MATH-500: test.jsonl of `problem` rows, no configs in the card (split test)."""
    rows = [{"problem": f"Compute ${i + 2}^2 + {i}$.", "solution": "...", "answer": str((i + 2) ** 2 + i),
             "subject": "Algebra", "level": 1, "unique_id": f"test/algebra/{i}.json"} for i in range(8)]
    return {"test.jsonl": jsonl_bytes(rows), "README.md": dataset_card(title="MATH-500")}


def mbpp_files() -> dict[str, FileContent]:
    """google-research-datasets/mbpp: configs full (default; `text`) and sanitized (`prompt`), splits train, test,
    validation, prompt."""
    files: dict[str, FileContent] = {}
    sizes = {"train": 4, "test": 8, "validation": 2, "prompt": 2}
    for config, column in (("full", "text"), ("sanitized", "prompt")):
        for split, n in sizes.items():
            files[f"{config}/{split}-00000-of-00001.parquet"] = parquet_bytes([
                {"task_id": i, column: f"Write a function to find the {i + 1}th smallest element of a list.",
                 "code": "def f(xs, k):\n    return sorted(xs)[k - 1]", "test_list": ["assert f([3, 1], 1) == 1"]}
                for i in range(n)])
    configs = [{"config_name": "full", "data_files": [{"split": s, "path": f"full/{s}-*"} for s in sizes],
                "default": True},
               {"config_name": "sanitized", "data_files": [{"split": s, "path": f"sanitized/{s}-*"} for s in sizes]}]
    return {**files, "README.md": dataset_card(configs, {"full": sizes, "sanitized": sizes}, title="mbpp")}


def alpaca_files() -> dict[str, FileContent]:
    """tatsu-lab/alpaca: data/train-*.parquet of alpaca rows (instruction, input, output, text)."""
    rows = [{"instruction": f"Name {i + 2} primary colors.", "input": "", "output": "Red, blue.", "text": "..."}
            for i in range(8)]
    configs = [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    return {"data/train-00000-of-00001.parquet": parquet_bytes(rows),
            "README.md": dataset_card(configs, {"default": {"train": len(rows)}}, title="alpaca")}


# Every hf: dataset the qwen3.6-27b preset reads (data.sources and eval.suites), built by these functions.
PRESET_DATASETS: dict[str, Callable[[], dict[str, FileContent]]] = {
    NEMOTRON: nemotron_v2_files, CODEALPACA: codealpaca_files, GSM8K: gsm8k_files, MATH500: math500_files,
    MBPP: mbpp_files, ALPACA: alpaca_files}


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *GIT_AUTHOR, *args], cwd=repo, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {out.stderr.strip()}")
    return out.stdout.strip()


def _write(path: Path, content: FileContent) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        shutil.copyfile(content, path)
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)


@dataclass
class HubServer:
    """A running olah and the mirrors folder it serves (see the module docstring for the helpers)."""

    endpoint: str
    mirrors: Path

    def repo_dir(self, repo_id: str, repo_type: str = "dataset") -> Path:
        return self.mirrors / f"{repo_type}s" / repo_id

    def create(self, repo_id: str, files: Mapping[str, FileContent], repo_type: str = "dataset") -> str:
        """A new repository holding `files` (README.md among them: olah finds no repository without a card)."""
        if "README.md" not in files:
            raise ValueError(f"{repo_id}: a Hub repository needs a README.md card (olah finds none without one)")
        repo = self.repo_dir(repo_id, repo_type)
        if repo.exists():
            raise FileExistsError(f"{repo_id} already exists on the test Hub: copy it to a new id instead")
        repo.mkdir(parents=True)
        _git(repo, "init", "-q", "-b", "main")
        return self.commit(repo_id, files, repo_type=repo_type, message="initial commit")

    def commit(self, repo_id: str, files: Mapping[str, FileContent] | None = None, delete: Iterable[str] = (),
               repo_type: str = "dataset", message: str = "update") -> str:
        """Write `files`, remove `delete`, commit on main; returns the new commit sha."""
        repo = self.repo_dir(repo_id, repo_type)
        for name, content in (files or {}).items():
            _write(repo / name, content)
        for name in delete:
            (repo / name).unlink()
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", message)
        return self.head(repo_id, repo_type=repo_type)

    def copy(self, repo_id: str, new_id: str, repo_type: str = "dataset") -> str:
        """`repo_id`'s files at main committed afresh as `new_id` (a repository this test may change)."""
        src = self.repo_dir(repo_id, repo_type)
        files = {p.relative_to(src).as_posix(): p for p in src.rglob("*") if p.is_file() and ".git" not in p.parts}
        return self.create(new_id, files, repo_type=repo_type)

    def head(self, repo_id: str, ref: str = "main", repo_type: str = "dataset") -> str:
        return _git(self.repo_dir(repo_id, repo_type), "rev-parse", ref)

    def tag(self, repo_id: str, name: str, repo_type: str = "dataset") -> None:
        _git(self.repo_dir(repo_id, repo_type), "tag", name)

    def env(self, hf_home: Path) -> dict[str, str]:
        """The variables a process needs to use this server: merge into a copy of os.environ and drop
        UNSET_VARIABLES."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1"}


# Variables that would stop a process from using the server or change what it may read.
UNSET_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE",
                   "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE")


def subprocess_env(server: HubServer, hf_home: Path, **extra: str) -> dict[str, str]:
    """os.environ pointed at `server` (and `extra` set), for a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET_VARIABLES}
    return {**env, **server.env(hf_home), **extra}


def _olah_config(folder: Path, port: int) -> Path:
    config = folder / "olah.toml"
    config.write_text(
        "[basic]\n"
        f'host = "127.0.0.1"\nport = {port}\n'
        f'repos-path = "{folder / "cache"}"\nmirrors-path = ["{folder / "mirrors"}"]\n'
        "metadata-cache-ttl = 0\n"
        "[accessibility]\noffline = true\n")
    return config


def _wait_ready(endpoint: str, proc: subprocess.Popen, timeout_s: float = 60) -> bool:
    """True once olah answers a Hub API request (the port opens before the app is up)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{endpoint}/api/datasets/{GSM8K}/revision/main", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def start_olah(folder: Path) -> tuple[HubServer, subprocess.Popen]:
    """olah serving `folder`/mirrors on a free port (the repositories must exist before: readiness asks gsm8k)."""
    python = OLAH_VENV / "bin" / "python"
    if not (OLAH_VENV / "bin" / "olah-cli").exists():
        pytest.fail(f"{OLAH_VENV}/bin/olah-cli is missing: run `make olah-venv` (make test builds it)")
    port = free_port()
    log = (folder / "olah.log").open("wb")
    proc = subprocess.Popen([str(python), str(Path(__file__).with_name("olah_hub.py")), "-c",
                             str(_olah_config(folder, port)), "--host", "127.0.0.1",
                             "--port", str(port), "--metadata-cache-ttl", "0", "--log-path", str(folder / "logs")],
                            cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    server = HubServer(endpoint=f"http://127.0.0.1:{port}", mirrors=folder / "mirrors")
    if not (wait_for_port(port, proc, timeout_s=60) and _wait_ready(server.endpoint, proc)):
        proc.kill()
        pytest.fail(f"olah did not start: {(folder / 'olah.log').read_text()[-2000:]}")
    return server, proc


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """olah on 127.0.0.1 serving the qwen3.6-27b preset's datasets (PRESET_DATASETS); yields a HubServer."""
    folder = tmp_path_factory.mktemp("hub")
    builder = HubServer(endpoint="", mirrors=folder / "mirrors")
    for repo_id, files in PRESET_DATASETS.items():
        builder.create(repo_id, files())
    server, proc = start_olah(folder)
    yield server
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass(frozen=True)
class HubModel:
    """The tiny Qwen3.5/3.6-architecture model repository on the test Hub."""

    repo_id: str
    sha: str  # its first commit
    source: Path  # the local folder its files were copied from (the tiny-qwen35 preset's build)


@pytest.fixture(scope="session")
def hub_model(hub_server) -> HubModel:
    """TINY_MODEL on `hub_server`: the `tiny-qwen35` preset's random checkpoint (its config, safetensors weights,
    Qwen3.5/3.6 tokenizer and chat template) with a model card."""
    from flashdraft.config import load_config
    from flashdraft.target.model import resolve_model_dir

    source = Path(resolve_model_dir(load_config(preset="tiny-qwen35").target))
    files: dict[str, FileContent] = {p.name: p for p in source.iterdir() if p.is_file()}
    files["README.md"] = ("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n"
                          "# tiny Qwen3.6-architecture model\n")
    sha = hub_server.create(TINY_MODEL, files, repo_type="model")
    return HubModel(repo_id=TINY_MODEL, sha=sha, source=source)


def _point_imported_clients(mp: pytest.MonkeyPatch, server: HubServer, hf_home: Path) -> None:
    """huggingface_hub and datasets copy HF_ENDPOINT, the offline flags and their cache folders into module
    constants at import; a test process that imported them before this fixture gets those copies pointed here."""
    import sys

    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        mp.setattr(hub, "ENDPOINT", server.endpoint)
        mp.setattr(hub, "HUGGINGFACE_CO_URL_TEMPLATE", server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setattr(hub, "HF_HUB_OFFLINE", False)
        mp.setattr(hub, "HF_HOME", str(hf_home))
        mp.setattr(hub, "HF_HUB_CACHE", str(hf_home / "hub"))
        mp.setattr(hub, "HF_TOKEN_PATH", str(hf_home / "token"))
    ds = sys.modules.get("datasets.config")
    if ds is not None:
        mp.setattr(ds, "HF_ENDPOINT", server.endpoint)
        mp.setattr(ds, "HUB_DATASETS_URL", server.endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}")
        mp.setattr(ds, "HF_HUB_OFFLINE", False)
        mp.setattr(ds, "HF_DATASETS_OFFLINE", False)
        mp.setattr(ds, "HF_CACHE_HOME", str(hf_home))
        mp.setattr(ds, "HF_DATASETS_CACHE", hf_home / "datasets")


@pytest.fixture()
def hub_env(hub_server, tmp_path, monkeypatch) -> HubServer:
    """This test's environment (and already-imported Hub clients) pointed at `hub_server`, no token, HF_HOME in
    tmp_path; returns the server."""
    hf_home = tmp_path / "hf-home"
    for name in UNSET_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in hub_server.env(hf_home).items():
        monkeypatch.setenv(name, value)
    _point_imported_clients(monkeypatch, hub_server, hf_home)
    return hub_server
