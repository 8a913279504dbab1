"""Streaming mode through the local pipeline: extraction and training run at once through a bounded window.

Measures total feature bytes produced vs the peak held in the store, and checks the bound; a producer killed hard
must end the run with a clear error instead of a trainer waiting forever.
"""

from __future__ import annotations

import pytest

from flashdraft.config import load_config
from flashdraft.pipelines.local import run_local
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

# One tiny-target sample is ~100-150 KB of features and a part holds one extraction batch, so 128-token batches
# make parts of one or two samples; a 1 MB window then holds a few of the ~2.4 MB the run produces.
STREAMING = {"mode.kind": "streaming", "mode.window_bytes": 1_000_000, "mode.window_shards": 4, "mode.reuse": 2,
             "features.shard_bytes": 65536, "features.batch_tokens": 128, "data.max_samples": 18,
             "data.eval_count": 2, "data.max_response_tokens": 16, "eval.num_prompts": 2, "eval.max_new_tokens": 16}


def _cfg(tmp_path, **extra):
    return load_config(preset="tiny", overrides={**STREAMING, "storage.root": f"file://{tmp_path}/store", **extra})


@pytest.mark.slow
def test_streaming_peak_stored_bytes_stay_within_the_window(tiny_streaming_run):
    """The session's tiny_streaming_run: docs/local-run.md's streaming `run-local` command, as written, by bash
    (tests/support/shared_runs.py; test_readme_commands.py checks its console); its result is what the store holds."""
    cfg, result, folder = tiny_streaming_run.cfg, tiny_streaming_run["result"], tiny_streaming_run.folder
    assert result["state"] == "SUCCEEDED", result["error"]
    stats = result["streaming"]
    # The docs' window binds in bytes (3 MB; its 64 parts are more than the run makes): parts trained on are
    # deleted while it runs, so the store never holds them all. The window binding in parts (more parts produced
    # than window_shards) is test_faults.py's streaming kill loop (window_shards 3).
    assert stats["produced_parts"] > stats["peak_stored_parts"], "parts are released while the run goes on"
    assert stats["produced_bytes"] > cfg.mode.window_bytes, "the run must produce more than the window holds"
    assert 0 < stats["peak_stored_bytes"] <= cfg.mode.window_bytes
    assert stats["peak_stored_parts"] <= cfg.mode.window_shards
    assert result["tau"] is not None and result["tau"] >= 1.0
    store = open_store(cfg.storage, cfg.run_id)
    assert store.get_json_verified(layout.metrics_key("stream")) == stats
    # the export, copied where run-local says: the store's folder as is (model card included, no commit records)
    zlab = folder / "exports" / cfg.run_id / "zlab"
    assert {k: (folder / v).resolve() for k, v in result["exports"].items()} == {"zlab": zlab.resolve()}
    assert store.get_json_verified(layout.metrics_key("export"))["formats"]["zlab"]["local"] == \
        result["exports"]["zlab"], "metrics/export.json names the folder run-local wrote"
    assert [f"export/zlab/{f.name}" for f in sorted(zlab.iterdir())] == store.list("export/zlab/")
    assert (zlab / "README.md").is_file() and not any(f.name.endswith(".commit") for f in zlab.iterdir())
    assert (f"drafter (zlab, serve the folder as is; its README.md has the command): {result['exports']['zlab']}"
            in tiny_streaming_run["console"])


@pytest.mark.slow
def test_streaming_producer_killed_ends_the_run_with_a_clear_error(tmp_path, monkeypatch):
    # The extraction producer dies like an OOM kill at its third part: no Python exception, no marker of its own.
    monkeypatch.setenv("FLASHDRAFT_FAULT_EXTRACT_KILL_AT_PART", "2")
    cfg = _cfg(tmp_path)
    result = run_local(cfg, str(tmp_path / "kfp"))
    assert result["state"] == "FAILED"
    assert "train" in result["error"]
    failed = open_store(cfg.storage, cfg.run_id).get_json(layout.STREAM_FAILED)
    assert "exited with status 137" in failed["message"]
