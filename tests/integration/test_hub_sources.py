"""hf: sources and eval suites against a real Hub-protocol server (olah on 127.0.0.1 serving local git repositories:
tests/support/hub_server.py), with HF_ENDPOINT pointed at it and no loader patched: the production preset's prep
as written (scaled down with --set), the commit it read in its record, a source that moved refusing reuse, the
plan task's one-line refusals (a wrong split, gsm8k without a config, a dataset that does not exist), an eval
suite read by config, and the gated-dataset error line (olah cannot gate a repository: a `_mock_` server answers
as the Hub does for that one)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.hub_server import CODEALPACA, GSM8K, NEMOTRON, TINY_MODEL, nemotron_v2_files, subprocess_env

from flashdraft.config import EvalSuite, SourceSpec, StorageConfig, load_config
from flashdraft.run import status
from flashdraft.storage.store import open_store

# The production preset, scaled down: its own data.sources and eval.suites, a tiny target of its architecture
# from the test Hub (its planning hints go with the model name), a few dozen samples.
SCALE_DOWN = [f"target.model={TINY_MODEL}", "target.dtype=float32", "data.max_samples=40", "data.eval_count=4",
              "data.num_shards=2", "data.max_response_tokens=24"]


def _flashdraft(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashdraft.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _prep_inputs(root: Path, run_id: str) -> dict:
    store = open_store(StorageConfig(root=f"file://{root}"), run_id)
    return status.read_record(store, "prep").inputs


def test_preset_prep_reads_the_hub_as_written_and_records_commits(hub_server, hub_model, tmp_path):
    """`flashdraft prep --preset qwen3.6-27b` with only scale-down overrides reads Nemotron v2's four splits and
    CodeAlpaca through HF_ENDPOINT and records the commit of each in its status record."""
    env = subprocess_env(hub_server, tmp_path / "hf")
    sets = [*SCALE_DOWN, f"storage.root=file://{tmp_path}/runs"]
    out = _flashdraft(["prep", "--preset", "qwen3.6-27b", *[a for s in sets for a in ("--set", s)]], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"| hf:{NEMOTRON} | 48 |" in out.stdout and f"| hf:{CODEALPACA} | 8 |" in out.stdout  # 4 x 12 rows; 8
    resolved = _prep_inputs(tmp_path / "runs", load_config(preset="qwen3.6-27b").run_id)["data.sources@resolved"]
    assert resolved == [{"uri": f"hf:{NEMOTRON}", "commit": hub_server.head(NEMOTRON)},
                        {"uri": f"hf:{CODEALPACA}", "commit": hub_server.head(CODEALPACA)}]


def test_a_source_that_moved_is_not_reused(hub_server, tmp_path):
    """The same config after a commit on the dataset's main: prep is refused naming the two commits (not
    "reused: fingerprint matches"); pinned to the first commit it is the old rows' prep again."""
    repo = "flashdraft-test/nemotron-moving"
    first = hub_server.copy(NEMOTRON, repo)
    env = subprocess_env(hub_server, tmp_path / "hf")
    sets = ["data.max_samples=20", "data.eval_count=2", "data.num_shards=1", f"storage.root=file://{tmp_path}/runs",
            f'data.sources=[{{uri: "hf:{repo}", splits: [code, math]}}]']
    args = ["prep", "--preset", "tiny", *[a for s in sets for a in ("--set", s)]]
    assert _flashdraft(args, env, tmp_path).returncode == 0
    moved = hub_server.commit(repo, {"data/code-00000-of-00001.parquet":
                                     nemotron_v2_files(rows_per_split=13)["data/code-00000-of-00001.parquet"]})
    again = _flashdraft(args, env, tmp_path)
    assert again.returncode != 0
    assert f"data.sources@resolved[0].commit \"{first[:34]}" in again.stderr and "--from prep" in again.stderr, \
        again.stderr[-2000:]
    assert _prep_inputs(tmp_path / "runs", "tiny")["data.sources@resolved"][0]["commit"] == first != moved


# The test Hub's tiny architecture-alike as the target, with its planning hints and the drafter at its geometry.
TINY_TARGET = {"target.model": TINY_MODEL, "target.num_layers": 8, "target.hidden_size": 128,
               "target.vocab_size": 248320, "drafter.hidden_size": None, "drafter.num_heads": None,
               "drafter.num_kv_heads": None, "drafter.head_dim": None, "drafter.intermediate_size": None}


@pytest.fixture()
def plan_task(hub_env, hub_model, tmp_path):
    """The plan task of a config (the qwen3.6-27b preset with `overrides`, its target the test Hub's tiny
    architecture-alike: the task pins the target's commit too) run as the pipeline runs it, in this process with the
    environment pointed at the test Hub; returns the refusal line, or None."""
    from flashdraft.components.plan.hub_gate import _view
    from flashdraft.components.plan.planner import PlanGateError
    from flashdraft.run.runner import run_task
    from flashdraft.storage.hub_datasets import resolve_commit

    resolve_commit.cache_clear(), _view.cache_clear()  # other tests' repositories: this server, this process

    def run(overrides: dict) -> tuple[str | None, list[dict] | None]:
        cfg = load_config(preset="qwen3.6-27b", overrides={
            "storage.root": f"memory://{tmp_path.name}", "run_id": f"r{len(overrides)}", **TINY_TARGET, **overrides})
        try:
            summary = run_task(cfg, "plan")
        except PlanGateError as exc:
            return str(exc), None
        return None, summary.hub_datasets

    return run


def test_plan_task_opens_every_hf_entry_and_refuses_in_one_line(plan_task, hub_env):
    refused, seen = plan_task({})  # the preset as written
    assert refused is None
    nemotron = next(d for d in seen if d["uri"] == f"hf:{NEMOTRON}")
    assert nemotron["rows"] == {"chat": 12, "code": 12, "math": 12, "stem": 12}
    assert nemotron["commit"] == hub_env.head(NEMOTRON)
    assert [d["entry"] for d in seen if d["uri"] == f"hf:{GSM8K}"] == ["eval.suites[3] (gsm8k)",
                                                                        "eval.suites[4] (gsm8k-think)"]
    # the entries the preset had before: no split train, gsm8k without a config; and a dataset that is not there
    refused, _ = plan_task({"data.sources": [{"uri": f"hf:{NEMOTRON}"}, {"uri": "hf:nobody/absent"}],
                            "eval.suites": [{"source": f"hf:{GSM8K}", "split": "test", "prompt_field": "question"}]})
    assert "\n" not in refused
    first, absent, gsm8k = refused.split(" | ")
    assert first == (f"data.sources[0] hf:{NEMOTRON}: no split train in config default; it has stem, chat, math, "
                     "code, multilingual_ja, multilingual_de, multilingual_it, multilingual_es, multilingual_fr")
    assert absent == (f"data.sources[1] hf:nobody/absent: nobody/absent not found on {hub_env.endpoint} (a private "
                      "or gated dataset needs HF_TOKEN set)")
    assert gsm8k.startswith(f"eval.suites[0] (gsm8k) hf:{GSM8K}: {GSM8K}: Config name is missing.")
    assert "['main', 'socratic']" in gsm8k
    assert plan_task({"data.sources": [{"uri": f"hf:{NEMOTRON}"}], "plan.check_sources": False})[0] is None


def test_an_eval_suite_reads_its_config_and_split(hub_env, tmp_path):
    from flashdraft.components.evaluate.suites import load_suite
    from flashdraft.target.model import load_tokenizer

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs"})
    tok = load_tokenizer(cfg.target)
    spec = EvalSuite(source=f"hf:{GSM8K}", name="gsm8k", config="socratic", split="train", prompt_field="question",
                     num_prompts=3)
    suite = load_suite(spec, cfg, open_store(cfg.storage, cfg.run_id), tok)
    assert [p.prompt_id for p in suite.prompts] == ["gsm8k-1", "gsm8k-2", "gsm8k-3"]
    assert "Ann has 4 apples" in tok.decode(suite.prompts[0].input_ids)


class _GatedHub(http.server.BaseHTTPRequestHandler):
    """What huggingface.co answers for a gated repository to a client without access (HTTP 401 and its error
    code headers); olah has no gated repositories, hence this mock."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"error": "Access to dataset is restricted."}).encode()
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", "Access to dataset nvidia/x is restricted. You must have access to it "
                                            "and be authenticated to access it. Please log in.")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_gated_source_mock_hub_names_hf_token(monkeypatch, tmp_path):
    from flashdraft.components.prep.sources import SourceError, source_identity
    from flashdraft.storage.hub_datasets import resolve_commit

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    resolve_commit.cache_clear()
    spec = SourceSpec(uri="hf:nvidia/x", splits=["chat"])
    try:
        with pytest.raises(SourceError) as no_token:
            source_identity(spec, StorageConfig())
        monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
        resolve_commit.cache_clear()
        with pytest.raises(SourceError) as not_granted:
            source_identity(spec, StorageConfig())
    finally:
        server.shutdown()
    assert str(no_token.value) == (f"source hf:nvidia/x (split chat): nvidia/x is gated on "
                                   f"http://127.0.0.1:{server.server_address[1]}: set HF_TOKEN to a token of an "
                                   "account that accepted its terms")
    assert "HF_TOKEN's account has not been granted access" in str(not_granted.value)
    assert "hf_not_granted" not in str(not_granted.value)
