"""One pinned target per run on local folders (no Hub): the weight digest recorded once, a changed folder refused
in one line naming both digests, pickle-only folders refused before any load, trust_remote_code only with a
40-hex revision, and the vLLM engine arguments every stage builds (the Hub side: tests/integration/test_hub_target.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flashdraft.config import ConfigError, TargetConfig, load_config
from flashdraft.run.runner import run_task
from flashdraft.run.target_pin import PIN_KEY, TargetMovedError, pin_target, read_pin
from flashdraft.storage.store import ObjectStore, open_store
from flashdraft.target.model import (
    TARGET_DIR_ENV,
    TARGET_ID_ENV,
    load_causal_lm,
    resolve_model_dir,
    vllm_target_args,
)
from flashdraft.target.snapshot import PickleOnlyTargetError, file_sha256, weights_digest

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def target_folder(tmp_path) -> Path:
    """The tiny preset's checkpoint copied to a folder of this test's own (a `source: hf` local target)."""
    built = Path(resolve_model_dir(load_config(preset="tiny").target))
    folder = tmp_path / "model"
    shutil.copytree(built, folder)
    return folder


def _folder_cfg(tmp_path: Path, folder: Path):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", "target.source": "hf",
                                                 "target.model": str(folder)})


def test_local_folder_is_pinned_by_its_weight_digest_and_a_changed_file_is_refused(tmp_path, target_folder):
    cfg = _folder_cfg(tmp_path, target_folder)
    store = open_store(cfg.storage, cfg.run_id)
    pin = pin_target(cfg, store)
    expected = weights_digest({"model.safetensors": file_sha256(target_folder / "model.safetensors")})
    assert (pin.sha, pin.digest) == (None, expected)
    assert read_pin(store) == pin and store.is_committed(PIN_KEY)
    assert pin_target(cfg, store, recheck=True) == pin  # unchanged folder: the same pin

    weights = target_folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one weight byte flipped in place
    weights.write_bytes(bytes(data))
    assert pin_target(cfg, store) == pin  # a later task asking for the same target trusts the pin...
    with pytest.raises(TargetMovedError) as exc:  # ...the plan gate (every start and resume) hashes again
        pin_target(cfg, store, recheck=True)
    message = str(exc.value)
    assert "\n" not in message and expected in message and file_sha256(weights) not in message
    assert weights_digest({"model.safetensors": file_sha256(weights)}) in message


def test_the_plan_gate_task_pins_the_target_in_the_runs_store(tmp_path, target_folder):
    cfg = _folder_cfg(tmp_path, target_folder)
    store = open_store(cfg.storage, cfg.run_id)
    assert read_pin(store) is None
    run_task(cfg, "plan")
    pin = read_pin(store)
    assert pin is not None and pin.model == str(target_folder) and pin.digest


def test_a_pickle_only_folder_is_refused_in_one_line_before_any_load(tmp_path, target_folder):
    (target_folder / "model.safetensors").rename(target_folder / "pytorch_model.bin")
    target = TargetConfig(model=str(target_folder), source="hf", dtype="float32")
    for load in (lambda: load_causal_lm(target), lambda: vllm_target_args(target),
                 lambda: pin_target(_folder_cfg(tmp_path, target_folder), ObjectStore(f"file://{tmp_path}/s"))):
        with pytest.raises(PickleOnlyTargetError) as exc:
            load()
        assert "\n" not in str(exc.value) and "pytorch_model.bin" in str(exc.value)
        assert "safetensors" in str(exc.value)


@pytest.mark.parametrize("revision", [None, "main", "v1.0", SHA[:12]])
def test_trust_remote_code_needs_a_40_hex_revision(revision):
    sets = {"target.source": "hf", "target.model": "org/model", "target.trust_remote_code": True,
            "target.revision": revision}
    with pytest.raises(ConfigError) as exc:
        load_config(preset="tiny", overrides=sets)
    assert "target.revision" in str(exc.value) and "40-hex" in str(exc.value)
    assert load_config(preset="tiny", overrides={**sets, "target.revision": SHA}).target.revision == SHA


def test_vllm_engines_load_the_pinned_commit_as_safetensors(monkeypatch, target_folder):
    hub = TargetConfig(model="org/model", revision="main")
    assert vllm_target_args(hub) == {"model": "org/model", "tokenizer": "org/model", "load_format": "safetensors",
                                     "trust_remote_code": False, "revision": "main", "tokenizer_revision": "main"}
    monkeypatch.setenv(TARGET_ID_ENV, f"org/model@{SHA}")  # a task of a run that pinned SHA, snapshot not fetched
    args = vllm_target_args(hub)
    assert (args["revision"], args["tokenizer_revision"], args["load_format"]) == (SHA, SHA, "safetensors")
    monkeypatch.setenv(TARGET_DIR_ENV, str(target_folder))  # the pinned snapshot's local copy
    args = vllm_target_args(hub)
    assert args["model"] == args["tokenizer"] == str(target_folder) and "revision" not in args
    other = TargetConfig(model="org/other", revision="main")  # another model (a peer's target) is not redirected
    assert vllm_target_args(other)["revision"] == "main"


def test_the_plan_prices_the_one_fetch_of_a_hub_target():
    from flashdraft.components.plan.planner import make_plan

    cfg = load_config(preset="qwen3.6-27b")
    fetch = make_plan(cfg).target_fetch
    shards = cfg.data.num_shards
    assert fetch is not None and fetch.pods == 1 + 2 * shards + 3  # prep, the shards, train, evaluate, export
    assert 50e9 < fetch.bytes < 60e9  # ~27B parameters in bf16
    assert fetch.minutes == pytest.approx(fetch.bytes / (cfg.plan.hub_bandwidth_gbps * 1e9) / 60, abs=0.1)
    assert fetch.hub_bytes_saved == (fetch.pods - 1) * fetch.bytes
    assert make_plan(load_config(preset="tiny")).target_fetch is None  # built here: nothing to fetch
