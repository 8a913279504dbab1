"""The plan gate's free-space check (components/plan/space.py): the comparison, and what it measures on a real
folder. The refusal on a real small filesystem: tests/integration/test_faults.py (a tmpfs)."""

from __future__ import annotations

from flashdraft.components.plan.planner import make_plan
from flashdraft.components.plan.space import FreeSpace, free_space, space_gate
from flashdraft.config import load_config
from flashdraft.storage import layout


def test_the_gate_compares_the_planned_bytes_less_those_stored_with_the_free_space():
    space = FreeSpace(path="/mnt/runs", free_bytes=2_000_000, stored_bytes=0)
    assert space_gate(2_000_000, space, "at rest") is None, "exactly full fits"
    msg = space_gate(5_773_996, space, "at rest with codec bf16-zstd")
    assert msg == ("the plan needs 5.8 MB (5,773,996 B) at rest with codec bf16-zstd but the filesystem of "
                   "/mnt/runs has 2.0 MB (2,000,000 B) free: free space there or point storage.root at a larger "
                   "filesystem")
    # a resumed run: what it already stored counts as held, so only the rest must fit
    resumed = FreeSpace(path="/mnt/runs", free_bytes=2_000_000, stored_bytes=4_000_000)
    assert space_gate(5_773_996, resumed, "at rest") is None
    short = FreeSpace(path="/mnt/runs", free_bytes=1_000_000, stored_bytes=4_000_000)
    assert "4.0 MB (4,000,000 B) of it already stored" in space_gate(5_773_996, short, "at rest")
    assert space_gate(10**15, None, "at rest") is None, "no filesystem to measure (s3://, memory://)"


def test_free_space_measures_the_nearest_existing_folder_and_the_features_already_stored(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store", "run_id": "r1"})
    space = free_space(cfg)
    assert space.path == str(tmp_path) and space.free_bytes > 0 and space.stored_bytes == 0
    part = tmp_path / "store" / "r1" / layout.feature_part_key(0, 0)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 1234)
    (tmp_path / "store" / "r1" / "responses").mkdir()
    (tmp_path / "store" / "r1" / "responses" / "chunk").write_bytes(b"y" * 99)  # not features: not counted
    space = free_space(cfg)
    assert space.path == str(tmp_path / "store" / "r1") and space.stored_bytes == 1234
    assert free_space(cfg.with_overrides({"storage.root": "memory://plan-space"})) is None
    assert free_space(cfg.with_overrides({"storage.root": "s3://bucket/runs"})) is None


def test_a_plan_that_fits_the_disk_passes_and_one_that_does_not_is_gated(tmp_path):
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})
    assert make_plan(cfg).gate is None  # 5.8 MB planned; the test's disk has room
    huge = make_plan(cfg.with_overrides({"data.expected_samples": 10**12}))
    assert "the plan needs" in huge.gate and f"the filesystem of {tmp_path}" in huge.gate
    # streaming holds only its window: the same data fits through a small one, not through one larger than the disk
    streaming = cfg.with_overrides({"data.expected_samples": 10**12, "mode.kind": "streaming"})
    assert make_plan(streaming.with_overrides({"mode.window_bytes": 10**6})).gate is None
    assert "for the streaming window" in make_plan(streaming.with_overrides({"mode.window_bytes": 10**15})).gate
