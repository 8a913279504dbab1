"""Generation on the tiny target: every shard committed, reruns are reused, a killed run resumes to the same
result, config drift is refused (by the runner), and multi-turn loss masks cover every regenerated turn."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flashdraft.config import load_config
from flashdraft.run import status
from flashdraft.run.records import iter_responses, response_chunk_keys
from flashdraft.run.runner import StageInputsChanged, run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.integration

# Small enough for 2 cores; chunk_size 1 gives a kill plenty of chunk boundaries to land between.
SMALL = {"data.max_samples": 12, "data.eval_count": 2, "data.num_shards": 2, "data.max_response_tokens": 10,
         "generation.chunk_size": 1, "generation.batch_size": 4}


def _cfg(root, **over):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{root}", **SMALL, **over})


def run_prep(cfg):
    return run_task(cfg, "prep")


def run_generate(cfg, shard):
    return run_task(cfg, "generate", shard)


def _rows(cfg, shard):
    return list(iter_responses(open_store(cfg.storage, cfg.run_id), shard))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted prep + generate of every shard."""
    cfg = _cfg(tmp_path_factory.mktemp("ref"))
    prep = run_prep(cfg)
    done = [run_generate(cfg, shard) for shard in range(prep.num_shards)]
    return cfg, prep, done


def test_every_shard_has_committed_responses(reference):
    cfg, prep, done = reference
    store = open_store(cfg.storage, cfg.run_id)
    for shard, d in enumerate(done):
        rows = _rows(cfg, shard)
        assert len(rows) == prep.shard_rows[shard] == d.samples == d.num_chunks
        assert store.is_committed(layout.responses_done_key(shard))
        assert d.tokens_per_s > 0 and d.empty + d.truncated <= d.samples
        # hf on a CPU: the forward's FLOPs against this CPU's measured GEMM rate (a 64-wide model: far below it)
        assert d.forward_flops > 0 and d.gemm_flops_per_s > 0 and 0 < d.gemm_share < 1
        assert d.truncated == sum(r["finish_reason"] == "length" for r in rows)
        assert sum(sum(r["loss_mask"]) for r in rows) == d.generated_tokens
        for r in rows:
            assert len(r["input_ids"]) == len(r["loss_mask"]) and 0 < r["prompt_len"] < len(r["input_ids"])
            assert not any(r["loss_mask"][:r["prompt_len"]]) and r["loss_mask"][-1] == 1
        assert store.is_committed(layout.metrics_key(f"generate-{layout.shard_name(shard)}"))


def test_rerun_of_a_committed_shard_is_a_noop(reference):
    cfg, _, done = reference
    store = open_store(cfg.storage, cfg.run_id)
    before = {k: store.read_commit(k).sha256 for k in response_chunk_keys(store, 0)}
    again = run_generate(cfg, 0)
    assert again.skipped is True and again.generated_tokens == done[0].generated_tokens
    assert {k: store.read_commit(k).sha256 for k in response_chunk_keys(store, 0)} == before


def test_killed_generation_resumes_and_matches_an_uninterrupted_run(reference, tmp_path):
    ref_cfg, _, _ = reference
    cfg = _cfg(tmp_path / "killed")
    run_prep(cfg)
    store = open_store(cfg.storage, cfg.run_id)
    total = len(_rows(ref_cfg, 0))
    args = [sys.executable, "-m", "flashdraft.cli.main", "generate", "--preset", "tiny", "--shard", "0"]
    for key, value in {"storage.root": cfg.storage.root, **SMALL}.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while not store.is_committed(layout.response_chunk_key(0, 0)):
        assert proc.poll() is None, "generation exited before its first chunk"
        assert time.time() < deadline, "no chunk committed within 240 s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = len(response_chunk_keys(store, 0))
    assert 1 <= committed < total, "the kill must land mid-shard"
    assert not store.is_committed(layout.responses_done_key(0))

    resumed = run_generate(cfg, 0)
    assert resumed.chunks_generated_now == total - committed
    assert _rows(cfg, 0) == _rows(ref_cfg, 0)


def test_configuration_drift_is_an_error(reference, tmp_path):
    ref_cfg, _, _ = reference
    with pytest.raises(StageInputsChanged, match=r"generate-shard-00000: .*generation.temperature 0.0 -> 0.7"):
        run_generate(ref_cfg.with_overrides({"generation.temperature": 0.7}), 0)
    # a partially generated shard (killed: its record still says running) is checked the same way
    cfg = _cfg(tmp_path / "partial", **{"data.num_shards": 1})
    run_prep(cfg)
    run_generate(cfg, 0)
    store = open_store(cfg.storage, cfg.run_id)
    store.uncommit(layout.responses_done_key(0))
    record = status.read_record(store, "generate", 0)
    store.commit_json(status.status_key("generate", 0), record.model_copy(update={"state": "running"}).model_dump())
    with pytest.raises(StageInputsChanged, match=r"target.model \"tiny-qwen3\" -> \"other-tiny\""):
        run_generate(cfg.with_overrides({"target.model": "other-tiny"}), 0)
    assert run_generate(cfg, 0).chunks_generated_now == 0  # the same settings resume (nothing left to do)
    with pytest.raises(ValueError, match="out of range"):
        run_generate(cfg, 5)


def test_multi_turn_turns_are_generated_in_order_and_all_masked(tmp_path):
    src = tmp_path / "chat.jsonl"
    conv = {"messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple"},
                         {"role": "user", "content": "And a vegetable?"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": "Now a colour."}]}
    src.write_text(json.dumps(conv) + "\n" + json.dumps({"prompt": "Say hi."}) + "\n")
    cfg = _cfg(tmp_path / "mt", **{"data.sources": [{"uri": str(src)}], "data.eval_count": 0,
                                   "data.num_shards": 1, "data.max_response_tokens": 6})
    run_prep(cfg)
    done = run_generate(cfg, 0)
    assert done.turns == 4
    rows = {len(r["input_ids"]): r for r in _rows(cfg, 0)}
    multi = rows[max(rows)]
    spans, inside = 0, False  # count masked runs: one per regenerated assistant turn
    for m in multi["loss_mask"]:
        spans += bool(m) and not inside
        inside = bool(m)
    assert spans == 3 and sum(r["loss_mask"].count(1) for r in rows.values()) == done.generated_tokens
    from flashdraft.target.model import load_tokenizer

    text = load_tokenizer(cfg.target).decode(multi["input_ids"])
    assert text.index("Name a fruit.") < text.index("And a vegetable?") < text.index("Now a colour.")
    assert "Apple" not in text  # the dataset's own answers are replaced by the target's


def test_seeded_sampling_is_reproducible_across_runs_and_resumes(reference, tmp_path):
    ref_cfg, _, _ = reference
    sampled = {"generation.temperature": 0.9, "generation.top_p": 0.95, "generation.seed": 7,
               "data.max_samples": 8}  # same shuffle, so shard 0 holds the first 3 of the reference's shard 0
    a, b = _cfg(tmp_path / "a", **sampled), _cfg(tmp_path / "b", **sampled)
    for cfg in (a, b):
        run_prep(cfg)
        run_generate(cfg, 0)
    store = open_store(b.storage, b.run_id)
    for key in [layout.responses_done_key(0)] + response_chunk_keys(store, 0)[2:]:
        store.uncommit(key)  # as if the pod died after two chunks (its record still says running)
    record = status.read_record(store, "generate", 0)
    store.commit_json(status.status_key("generate", 0), record.model_copy(update={"state": "running"}).model_dump())
    assert run_generate(b, 0).chunks_generated_now == len(_rows(a, 0)) - 2
    assert _rows(a, 0) == _rows(b, 0)
    greedy = {r["sample_id"]: r["input_ids"] for r in _rows(ref_cfg, 0)}
    assert all(r["sample_id"] in greedy for r in _rows(a, 0))
    assert any(r["input_ids"] != greedy[r["sample_id"]] for r in _rows(a, 0))


def test_generation_dtype_loads_the_target_in_it_and_is_checked_on_resume(reference, tmp_path):
    import torch

    from flashdraft.components.generate.backends import HFBackend
    from flashdraft.target.model import load_tokenizer

    cfg = _cfg(tmp_path / "bf16", **{"generation.dtype": "bfloat16", "data.num_shards": 1})
    assert cfg.target.dtype == "float32"
    backend = HFBackend(cfg, load_tokenizer(cfg.target))
    assert backend.model.dtype == torch.bfloat16
    run_prep(cfg)
    run_generate(cfg, 0)
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "generate", 0)
    assert record.inputs["generation.dtype"] == "bfloat16"
    assert store.get_json_verified(layout.responses_done_key(0))["fingerprint"] == record.fingerprint
    with pytest.raises(StageInputsChanged, match=r"generation.dtype \"bfloat16\" -> null"):
        run_generate(cfg.with_overrides({"generation.dtype": None}), 0)
