"""A run that reads another run's committed results (`data.features_from`; flashdraft/run/source.py and the
runner's `check_source`), on a local store with stand-in stage bodies (as tests/unit/test_runner.py): the source's
recorded settings are checked field by field, the reader is recorded in the source, `--from` on the source needs a
confirmation, and a source recomputed after the reader started is refused at the reader's next task."""

from __future__ import annotations

import pytest

from flashdraft.config import ConfigError, load_config
from flashdraft.run import registry, source, status
from flashdraft.run.runner import check_run, clear_from, run_task
from flashdraft.storage import layout
from flashdraft.storage.source import data_store
from flashdraft.storage.store import open_store


def finished_source(tmp_path):
    """The tiny config of run `base` with its prep, generate and extract committed (stand-in bodies)."""
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", "run_id": "base"})
    run_task(cfg, "prep", body=lambda: {"kept": 40, "num_train": 36, "num_eval": 4, "quarantined": 0})
    for shard in range(cfg.data.num_shards):
        run_task(cfg, "generate", shard, body=lambda: {"samples": 18})
        run_task(cfg, "extract", shard, body=lambda: {"samples": 18, "tokens": 1600})
    return cfg


def reader_of(cfg, run_id="lr", **overrides):
    return cfg.with_overrides({"run_id": run_id, "data.features_from": cfg.storage.root + "/base", **overrides})


def test_a_reader_with_other_training_settings_starts_and_is_recorded_in_both_stores(tmp_path):
    base = finished_source(tmp_path)
    reader = reader_of(base, **{"training.lr": 3e-4, "drafter.block_size": 4, "eval.max_new_tokens": 9})
    check_run(reader)
    src, own = open_store(base.storage, "base"), open_store(reader.storage, "lr")
    record = source.read_source(own)
    assert record is not None and record.source == reader.data.features_from and record.run_id == "lr"
    assert set(record.fingerprints) == {"prep", "generate", "extract"}
    assert [r.run_id for r in source.readers(src)] == ["lr"]
    assert data_store(reader).root == reader.data.features_from, "prompts, responses and features: the source's"
    assert [s.name for s in registry.current() if s.skipped_for(reader)] == ["prep", "generate", "extract"]
    with pytest.raises(ConfigError, match="reads its extract results in place from data.features_from"):
        run_task(reader, "extract", 0, body=lambda: {})
    # train's upstream is the source's extract result: its fingerprint is recorded on the reader's train task
    def train() -> dict:  # training commits its own metrics (Stage.commits_result)
        own.commit_json(layout.metrics_key("train"), {"steps": 1})
        return {"steps": 1}

    run_task(reader, "train", body=train)
    train = own.get_json_verified(layout.status_key("train"))
    assert train["upstream"]["extract"] is not None
    assert not own.list(f"{layout.FEATURES}/") and not own.list(f"{layout.PROMPTS}/"), "nothing copied"


@pytest.mark.parametrize(("field", "value"), [("features.codec", "fp8-zstd"), ("target.revision", "other"),
                                              ("data.max_samples", 30), ("generation.temperature", 0.7)])
def test_a_reader_whose_features_would_differ_is_refused_in_one_line_naming_the_field(tmp_path, field, value):
    base = finished_source(tmp_path)
    with pytest.raises(source.SourceChanged) as info:
        check_run(reader_of(base, **{field: value}))
    message = str(info.value)
    assert "\n" not in message and field in message and base.storage.root + "/base" in message
    assert not source.readers(open_store(base.storage, "base")), "a refused reader is not recorded"


def test_an_unfinished_or_missing_source_is_refused(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", "run_id": "base"})
    with pytest.raises(source.SourceChanged, match="no run there"):
        check_run(reader_of(cfg))
    run_task(cfg, "prep", body=lambda: {"kept": 40})
    with pytest.raises(source.SourceChanged, match="its generate has not finished there"):
        check_run(reader_of(cfg))


def test_from_on_a_source_names_its_readers_and_a_recomputed_source_is_refused_at_the_readers_next_task(tmp_path):
    base = finished_source(tmp_path)
    reader = reader_of(base)
    check_run(reader)
    with pytest.raises(ConfigError) as info:
        clear_from(base, "extract")
    assert "lr (" in str(info.value) and "--confirm-readers" in str(info.value)
    assert status.read_record(open_store(base.storage, "base"), "extract", 0), "nothing was cleared"
    assert clear_from(base, "train") == ["train", "evaluate", "export"], "stages no reader reads: no question"
    clear_from(base, "extract", confirm_readers=True)
    with pytest.raises(source.SourceChanged, match="has not finished there"):
        run_task(reader, "train", body=lambda: {"steps": 1})
    for shard in range(base.data.num_shards):  # the same settings, recomputed: other results
        run_task(base, "extract", shard, body=lambda: {"samples": 18, "tokens": 1600})
    with pytest.raises(source.SourceChanged, match="extract changed there"):
        run_task(reader, "train", body=lambda: {"steps": 1})


def test_a_streaming_reader_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="data.features_from .* mode.kind=offline"):
        load_config(preset="tiny", overrides={"data.features_from": "file:///x/base", "mode.kind": "streaming"})
