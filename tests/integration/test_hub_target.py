"""The run's one pinned target against a real Hub-protocol server (olah on 127.0.0.1, tests/support/hub_server.py):
`target.revision` resolved to the commit sha once, a branch that moves on the server mid-run refused at the next
start, another commit named by the user refused, and the snapshot fetched from the Hub once and read from the
run's store by every later task (with the Hub unreachable); the model card and the report name the commit and the
weights' digest."""

from __future__ import annotations

import pytest
from support.evaluate_fixtures import commit_drafter
from support.hub_server import TINY_MODEL

from flashdraft.components.report.report import run_report
from flashdraft.config import load_config
from flashdraft.run.runner import run_task
from flashdraft.run.target_pin import PIN_KEY, TargetMovedError, pinned_target, read_pin, snapshot_prefix
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.target.snapshot import PickleOnlyTargetError, file_sha256, weights_digest

SMALL = {"data.max_samples": 12, "data.eval_count": 2, "data.max_response_tokens": 8,
         "target.num_layers": 8, "target.hidden_size": 128}  # the plan's hints: it reads no weights


def _cfg(tmp_path, repo: str, **sets):
    return load_config(preset="tiny-qwen35", overrides={
        "storage.root": f"file://{tmp_path}/runs", "target.source": "hf", "target.model": repo, **SMALL, **sets})


def test_revision_resolves_to_the_commit_sha_once(hub_env, hub_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "cache"))
    repo = "flashdraft-test/pin-resolve"
    sha = hub_env.copy(TINY_MODEL, repo, repo_type="model")
    hub_env.tag(repo, "v1", repo_type="model")
    for revision in (None, "main", "v1"):
        cfg = _cfg(tmp_path, repo, run_id=f"resolve-{revision}", **{"target.revision": revision})
        run_task(cfg, "plan")
        pin = read_pin(open_store(cfg.storage, cfg.run_id))
        assert (pin.model, pin.revision, pin.sha) == (repo, revision, sha)
        assert "model.safetensors" in pin.files and pin.digest is None  # not fetched yet


def test_a_branch_moving_mid_run_is_refused_naming_both_commits(hub_env, hub_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "cache"))
    repo = "flashdraft-test/pin-moving"
    old = hub_env.copy(TINY_MODEL, repo, repo_type="model")
    cfg = _cfg(tmp_path, repo)
    run_task(cfg, "plan")
    new = hub_env.commit(repo, {"NOTE.md": "new weights would go here"}, repo_type="model")
    with pytest.raises(TargetMovedError) as exc:  # the resumed run's gate asks again: main moved
        run_task(cfg, "plan")
    message = str(exc.value)
    assert "\n" not in message and old in message and new in message and f"target.revision={old}" in message
    with pytest.raises(TargetMovedError):  # a later stage asked for the new commit by name: refused too
        run_task(cfg.with_overrides({"target.revision": new}), "prep")
    pinned = cfg.with_overrides({"target.revision": old})  # the fix the message names: go on with the pin
    run_task(pinned, "plan")
    assert read_pin(open_store(cfg.storage, cfg.run_id)).sha == old


def test_a_pickle_only_commit_is_refused_before_any_download(hub_env, hub_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "cache"))
    repo = "flashdraft-test/pin-pickle"
    hub_env.copy(TINY_MODEL, repo, repo_type="model")
    hub_env.commit(repo, {"pytorch_model.bin": b"\x80\x04not-loaded"}, delete=["model.safetensors"],
                   repo_type="model")
    with pytest.raises(PickleOnlyTargetError) as exc:
        run_task(_cfg(tmp_path, repo), "plan")
    assert "\n" not in str(exc.value) and "pytorch_model.bin" in str(exc.value)
    assert not (tmp_path / "cache" / "targets").exists()


def test_the_snapshot_is_fetched_once_and_every_later_task_reads_the_store(hub_env, hub_model, tmp_path,
                                                                          monkeypatch):
    import huggingface_hub.constants as hub_constants

    repo = "flashdraft-test/pin-fetch"
    sha = hub_env.copy(TINY_MODEL, repo, repo_type="model")
    cfg = _cfg(tmp_path, repo)
    store = open_store(cfg.storage, cfg.run_id)
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "pod-prep"))
    run_task(cfg, "plan")
    run_task(cfg, "prep")  # the first task that loads the target: the one Hub download, into the run's store
    manifest = store.read_commit(f"{snapshot_prefix(sha)}/manifest.json")
    files = store.get_json_verified(f"{snapshot_prefix(sha)}/manifest.json")["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    weights = hub_model.source / "model.safetensors"
    digest = weights_digest({"model.safetensors": file_sha256(weights)})
    assert read_pin(store).digest == digest
    with pinned_target(cfg, store, fetch=True):  # the test's stand-in for train, as a train task holds it
        commit_drafter(cfg, seed=3)

    dead = "http://127.0.0.1:9"  # a later pod: the Hub unreachable, a fresh local cache
    monkeypatch.setenv("HF_ENDPOINT", dead)
    monkeypatch.setattr(hub_constants, "ENDPOINT", dead)
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "pod-generate"))
    run_task(cfg, "generate", 0)
    local = tmp_path / "pod-generate" / "targets" / sha
    assert file_sha256(local / "model.safetensors") == file_sha256(weights)
    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "pod-export"))
    run_task(cfg, "export")  # the drafter reads the target's embedding and head: the store's copy
    assert (tmp_path / "pod-export" / "targets" / sha / "model.safetensors").is_file()
    assert store.read_commit(f"{snapshot_prefix(sha)}/manifest.json") == manifest  # written once
    assert store.is_committed(PIN_KEY) and len(store.list_committed("target/")) == 2  # pin + manifest

    card = store.get("export/zlab/README.md").decode()
    assert f"commit `{sha}`" in card and f"weights sha256 `{digest}`" in card
    assert f"commit: {sha}" in card and f"weights_sha256: {digest}" in card  # the card's metadata
    run_report(cfg)
    summary = store.get_verified(layout.REPORT_MARKDOWN).decode()
    assert f"{repo} at commit {sha}, weights sha256 {digest}" in summary
