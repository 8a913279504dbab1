"""The stage runner's rules (flashdraft/run/runner.py) on a local store, with stand-in stage bodies (`body=`) that
count their calls: a matching fingerprint reuses, a declared change carries on, any other change is refused in
one line before anything is overwritten, and `--from` clears exactly the stages it names."""

from __future__ import annotations

import pytest

from flashdraft.config import ConfigError, EvalConfig, load_config, preset_names
from flashdraft.run import registry, status
from flashdraft.run.overview import stage_statuses
from flashdraft.run.runner import StageInputsChanged, check_run, clear_from, config_inputs, run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


@pytest.fixture()
def cfg(tmp_path):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/store"})


class Body:
    """A stage body that records its calls and returns `result`."""

    def __init__(self, **result):
        self.calls, self.result = 0, result

    def __call__(self):
        self.calls += 1
        return dict(self.result)


class TrainBody(Body):
    """Training commits its own metrics (rank 0 of its ranks: Stage.commits_result)."""

    def __init__(self, cfg, **result):
        super().__init__(**result)
        self.store = open_store(cfg.storage, cfg.run_id)

    def __call__(self):
        out = super().__call__()
        self.store.commit_json(layout.metrics_key("train"), out)
        return out


def test_a_matching_fingerprint_is_reused_and_says_so(cfg):
    body = Body(kept=30, num_train=26, num_eval=4, quarantined=0)
    first = run_task(cfg, "prep", body=body)
    assert not first.skipped and body.calls == 1
    store = open_store(cfg.storage, cfg.run_id)
    assert store.get_json_verified(layout.metrics_key("prep"))["kept"] == 30, "the runner commits the result"
    again = run_task(cfg, "prep", body=body)
    assert again.skipped and again.kept == 30 and body.calls == 1
    record = status.read_record(store, "prep")
    assert record.reused and record.state == "done" and record.attempt == 2
    prep = next(s for s in stage_statuses(status.read_records(store)) if s.stage == "prep")
    assert status.describe(prep) == "reused: fingerprint matches"
    # a field declared as unable to change the prompts is not part of the fingerprint
    assert run_task(cfg.with_overrides({"data.expected_samples": 5000}), "prep", body=body).skipped
    assert run_task(cfg, "prep", body=body, force=True) and body.calls == 2, "--force runs anyway"


def test_a_changed_field_is_refused_in_one_line_naming_it_and_nothing_is_overwritten(cfg):
    body = Body(kept=30, num_train=26, num_eval=4, quarantined=0)
    run_task(cfg, "prep", body=body)
    store = open_store(cfg.storage, cfg.run_id)
    before = status.read_record(store, "prep")
    with pytest.raises(StageInputsChanged) as info:
        run_task(cfg.with_overrides({"data.max_samples": 30}), "prep", body=body)
    message = str(info.value)
    assert "\n" not in message and message.startswith("prep: ")
    assert "data.max_samples 40 -> 30" in message and "run_id" in message and "--from prep" in message
    assert body.calls == 1 and status.read_record(store, "prep") == before


def test_more_training_carries_on_other_training_changes_are_refused_and_evaluation_follows(cfg):
    train, evaluate = TrainBody(cfg, steps=10), Body(drafter={"tau": 1.5})
    run_task(cfg, "train", body=train)
    run_task(cfg, "evaluate", body=evaluate)
    assert run_task(cfg, "evaluate", body=evaluate).skipped and evaluate.calls == 1
    more = cfg.with_overrides({"training.max_steps": 50})
    run_task(more, "train", body=train)
    assert train.calls == 2, "more max_steps: the stage runs again (the trainer carries on from its checkpoint)"
    assert run_task(more, "train", body=train).skipped and train.calls == 2
    run_task(more, "evaluate", body=evaluate)
    assert evaluate.calls == 2, "a new checkpoint is evaluated again"
    run_task(more.with_overrides({"eval.max_new_tokens": 8}), "evaluate", body=evaluate)
    assert evaluate.calls == 3, "changed eval.* settings evaluate again"
    with pytest.raises(StageInputsChanged, match=r"^train: .*training.lr .* -> 0.1;.*--from train"):
        run_task(more.with_overrides({"training.lr": 0.1}), "train", body=train)
    # thread counts cannot change the result
    assert run_task(more.with_overrides({"training.num_threads": 1}), "train", body=train).skipped


def test_the_pretrained_parent_s_weights_are_part_of_the_fingerprint(cfg, tmp_path):
    """drafter.init_from names a place; the weights found there are the identity: new weights under the same name
    are refused for training (a new run_id, or --from train) and evaluated again."""
    folder = tmp_path / "parent"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights one")
    pre = cfg.with_overrides({"drafter.init": "pretrained", "drafter.init_from": str(folder)})
    train, evaluate = TrainBody(pre, steps=1), Body(drafter={"tau": 1.5})
    run_task(pre, "train", body=train)
    run_task(pre, "evaluate", body=evaluate)
    assert run_task(pre, "train", body=train).skipped and run_task(pre, "evaluate", body=evaluate).skipped
    (folder / "model.safetensors").write_bytes(b"weights two")
    with pytest.raises(StageInputsChanged, match=r"^train: .*drafter.init_from@sha256 .*--from train"):
        run_task(pre, "train", body=train)
    assert not run_task(pre, "evaluate", body=evaluate).skipped and evaluate.calls == 2


def test_an_evaluate_only_run_has_no_training_task(cfg, tmp_path):
    only = cfg.with_overrides({"drafter.init": "pretrained", "drafter.init_from": str(tmp_path),
                               "training.max_steps": 0})
    for stage, shard in (("generate", 0), ("extract", 0), ("train", None)):
        with pytest.raises(ConfigError, match=rf"^{stage}: this run evaluates a pretrained drafter as is"):
            run_task(only, stage, shard, body=Body())


def test_a_changed_upstream_result_is_refused_downstream(cfg):
    prep, generate = Body(num_shards=1), Body(samples=3)
    run_task(cfg, "prep", body=prep)
    run_task(cfg, "generate", 0, body=generate)
    run_task(cfg, "prep", body=prep, force=True)  # prep recomputed by hand: same settings, a new record...
    assert run_task(cfg, "generate", 0, body=generate).skipped, "...but the same fingerprint: still reused"
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "prep")
    store.commit_json(status.status_key("prep"), record.model_copy(update={"fingerprint": "0" * 16}).model_dump())
    with pytest.raises(StageInputsChanged, match=r"^generate-shard-00000: .*the result of prep.*--from prep"):
        run_task(cfg, "generate", 0, body=generate)


def test_a_failed_or_killed_task_with_the_same_settings_runs_again(cfg):
    def boom():
        raise RuntimeError("preempted")

    with pytest.raises(RuntimeError):
        run_task(cfg, "prep", body=boom)
    body = Body(kept=1)
    assert not run_task(cfg, "prep", body=body).skipped and body.calls == 1


def test_check_run_refuses_before_any_stage_and_allows_what_can_carry_on(cfg):
    run_task(cfg, "prep", body=Body(kept=1))
    run_task(cfg, "generate", 0, body=Body(samples=1))
    run_task(cfg, "train", body=TrainBody(cfg, steps=10))
    check_run(cfg.with_overrides({"training.epochs": 9, "eval.max_new_tokens": 9}))
    with pytest.raises(StageInputsChanged, match=r"^prep: .*data.max_samples 40 -> 12"):
        check_run(cfg.with_overrides({"data.max_samples": 12, "training.epochs": 9}))
    with pytest.raises(StageInputsChanged, match=r"^generate-shard-00000: .*generation.temperature"):
        check_run(cfg.with_overrides({"generation.temperature": 0.5}))


def test_a_field_added_to_a_section_later_is_unchanged_while_it_keeps_its_default(cfg):
    run_task(cfg, "evaluate", body=Body(drafter={"tau": 1.0}))
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "evaluate")
    older = {k: v for k, v in record.inputs.items() if k != "eval.lossless_tie_margin"}  # as if it did not exist
    store.commit_json(status.status_key("evaluate"), record.model_copy(update={"inputs": older}).model_dump())
    check_run(cfg)
    run_task(cfg.with_overrides({"training.num_threads": 1}), "prep", body=Body(kept=1))
    prep_record = status.read_record(store, "prep")
    store.commit_json(status.status_key("prep"), prep_record.model_copy(update={
        "inputs": {k: v for k, v in prep_record.inputs.items() if k != "data.seed"}}).model_dump())
    with pytest.raises(StageInputsChanged, match=r"data.seed 0 -> 3"):
        check_run(cfg.with_overrides({"data.seed": 3}))


def test_a_field_added_to_a_source_later_is_unchanged_while_it_keeps_its_default(cfg):
    run_task(cfg, "prep", body=Body(kept=1))
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "prep")
    older = [{k: v for k, v in src.items() if k != "heldout"} for src in record.inputs["data.sources"]]
    assert older != record.inputs["data.sources"]  # the record held the field: removing it makes an older record
    store.commit_json(status.status_key("prep"), record.model_copy(
        update={"inputs": {**record.inputs, "data.sources": older}}).model_dump())
    assert run_task(cfg, "prep", body=Body(kept=1)).skipped is True
    train_only = [{**src, "heldout": False} for src in older]
    with pytest.raises(StageInputsChanged, match=r"^prep: .*data.sources\[0\]\.heldout true -> false"):
        check_run(cfg.with_overrides({"data.sources": train_only}))


def test_from_clears_the_stage_and_everything_after_it_only(cfg):
    for name, shard, result in (("prep", None, {"kept": 1}), ("generate", 0, {"samples": 1}),
                                ("extract", 0, {"samples": 1}), ("train", None, {"steps": 1}),
                                ("evaluate", None, {"num_prompts": 1})):
        run_task(cfg, name, shard, body=Body(**result))
    store = open_store(cfg.storage, cfg.run_id)
    store.commit_json(f"{layout.CHECKPOINTS}/latest.json", {"step": 1})
    store.commit_json(layout.EVAL_PROMPTS + ".keep", {})  # a prep output
    cleared = clear_from(cfg, "train")
    assert cleared == ["train", "evaluate", "export"]
    assert not store.list(layout.CHECKPOINTS + "/") and not store.exists(layout.metrics_key("evaluate"))
    assert status.read_record(store, "train") is None and status.read_record(store, "evaluate") is None
    assert status.read_record(store, "extract", 0) is not None and store.is_committed(layout.EVAL_PROMPTS + ".keep")
    with pytest.raises(Exception, match="--from nope: unknown stage"):
        clear_from(cfg, "nope")


def test_a_section_is_fingerprinted_whole_less_its_declared_exclusions(cfg):
    inputs = config_inputs(registry.current().get("evaluate"), cfg)
    assert {k for k in inputs if k.startswith("eval.")} == {f"eval.{name}" for name in EvalConfig.model_fields}
    train = config_inputs(registry.current().get("train"), cfg)
    assert "training.lr" in train and "training.num_threads" not in train and "training.checkpoint_every" not in train
    for preset in preset_names():  # every declared path resolves on every preset
        loaded = load_config(preset=preset)
        for spec in registry.current():
            assert config_inputs(spec, loaded) is not None


def test_streaming_training_cannot_carry_on_from_a_finished_stream(cfg):
    streaming = cfg.with_overrides({"mode.kind": "streaming", "training.max_steps": 5})
    run_task(streaming, "train", body=TrainBody(streaming, steps=5))
    with pytest.raises(StageInputsChanged, match=r"^train: .*training.max_steps 5 -> 9"):
        run_task(streaming.with_overrides({"training.max_steps": 9}), "train", body=TrainBody(streaming, steps=9))


def test_a_reused_task_keeps_the_duration_of_the_run_that_made_it(cfg, monkeypatch):
    """`flashdraft status`, the console and the report show how long a reused result took, not 0 s; a stage whose
    shards were partly reused is timed by the shards that ran now, not from the first run to this one."""
    from flashdraft.cli.console import record_line

    clock = [100.0, 160.5, 900.0, 1000.0, 1010.0, 1040.0, 1100.0, 2010.0, 2030.0, 2045.0]
    monkeypatch.setattr(status, "now", lambda: clock.pop(0))
    body = Body(kept=30, num_train=26, num_eval=4, quarantined=0)
    run_task(cfg, "prep", body=body)  # started 100, ended 160.5
    assert run_task(cfg, "prep", body=body).skipped  # reused at 900
    store = open_store(cfg.storage, cfg.run_id)
    record = status.read_record(store, "prep")
    assert record.reused and record.duration_s == 60.5 and record.reused_at == 900.0
    assert "prep" in record_line(record) and " reused    60.5 s " in record_line(record)
    gen = Body(samples=13, generated_tokens=300, generation_seconds=3.0)
    run_task(cfg, "generate", 0, body=gen)  # 1000 -> 1010
    run_task(cfg, "generate", 1, body=gen)  # 1040 -> 1100
    assert run_task(cfg, "generate", 0, body=gen).skipped  # reused at 2010
    run_task(cfg, "generate", 1, body=gen, force=True)  # runs again: 2030 -> 2045
    assert not clock, "every clock reading was taken"
    by_stage = {s.stage: s for s in stage_statuses(status.read_records(store))}
    assert by_stage["prep"].duration_s == 60.5 and status.describe(by_stage["prep"]) == status.REUSED
    assert by_stage["generate"].duration_s == 15.0, "timed by the shard that ran now"


def test_a_dataset_responses_run_has_no_generate_task_and_extract_reads_prep(cfg):
    dataset = cfg.with_overrides({"data.responses": "dataset"})
    with pytest.raises(ConfigError, match=r"^generate: data.responses=dataset: prep writes the dataset's own"):
        run_task(dataset, "generate", 0, body=Body())
    with pytest.raises(ConfigError, match=r"^--from generate: data.responses=dataset.*--from prep"):
        clear_from(dataset, "generate")
    reg = registry.current()
    assert reg.upstream_in(reg.get("extract"), dataset) == ("prep",)
    assert reg.upstream_in(reg.get("extract"), cfg) == ("generate",)
    streaming = dataset.with_overrides({"mode.kind": "streaming", "training.max_steps": 10})
    assert reg.upstream_in(reg.get("train"), streaming) == ("prep",)
    # extract's fingerprint follows prep's result, so a recomputed prep is refused downstream
    run_task(dataset, "prep", body=Body(num_shards=1))
    run_task(dataset, "extract", 0, body=Body(samples=3))
    store = open_store(dataset.storage, dataset.run_id)
    assert status.read_record(store, "extract", 0).upstream == {"prep": status.read_record(store, "prep").fingerprint}


def test_a_switch_of_data_responses_on_an_existing_run_is_refused_in_one_line(cfg):
    run_task(cfg, "prep", body=Body(num_shards=1))
    run_task(cfg, "generate", 0, body=Body(samples=3))
    dataset = cfg.with_overrides({"data.responses": "dataset"})
    for check in (lambda: check_run(dataset), lambda: run_task(dataset, "prep", body=Body(num_shards=1))):
        with pytest.raises(StageInputsChanged) as refused:
            check()
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith('prep: changed since its committed result: data.responses "target" -> "dataset"')
        assert "`--from prep` (prep, generate, extract" in message
    # the reply length limit decides which rows a dataset prep keeps; a target prep ignores it
    assert "data.max_response_tokens" in config_inputs(registry.current().get("prep"), dataset)
    assert "data.max_response_tokens" not in config_inputs(registry.current().get("prep"), cfg)
    # recomputed with --from prep: the target-mode generate results are cleared with it, never mixed in
    assert clear_from(dataset, "prep")[:2] == ["prep", "generate"]
    store = open_store(cfg.storage, cfg.run_id)
    assert status.read_record(store, "generate", 0) is None
    check_run(dataset)
