"""data.responses=dataset end to end: `run-local` (preset tiny) on a file of conversations in the three formats runs
no generate task, quarantines the reply-less rows with their reason, trains on the dataset's replies, evaluates
lossless with the target, and its report and model card say where the responses came from; then the mixed recipe
(docs/training.md) trains on from its export on target-generated replies."""

from __future__ import annotations

import html
import json

import pytest

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.export.card import CARD_FILE
from flashdraft.components.prep.summary import RESPONSES_SOURCE, PrepSummary
from flashdraft.config import load_config
from flashdraft.pipelines.local import run_local
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Farah", "Goran", "Hana", "Ivo", "Jun"]


def conversations() -> list[dict]:
    """Rows in the three formats, each with its own replies (multi-turn in two of them), and two without one."""
    rows: list[dict] = []
    for i, name in enumerate(NAMES * 3):
        a, b = 3 + i, 7 + 2 * i
        if i % 3 == 0:
            rows.append({"messages": [{"role": "user", "content": f"{name} has {a} apples, buys {b} more. How many?"},
                                      {"role": "assistant", "content": f"{name} has {a} + {b} = {a + b} apples."},
                                      {"role": "user", "content": "And after eating one?"},
                                      {"role": "assistant", "content": f"Then {a + b - 1} apples are left."}]})
        elif i % 3 == 1:
            rows.append({"conversations": [{"from": "human", "value": f"Say hello to {name} in {a} words."},
                                           {"from": "gpt", "value": f"Hello {name}, good to see you" + " here" * a}]})
        else:
            rows.append({"instruction": f"Add {a} and {b}.", "input": f"Name: {name}",
                         "output": f"{a} plus {b} makes {a + b}, {name}."})
    rows.append({"messages": [{"role": "user", "content": "A question nobody answered."}]})
    rows.append({"conversations": [{"from": "human", "value": "Anyone there?"}, {"from": "gpt", "value": ""}]})
    return rows


@pytest.fixture(scope="module")
def dataset_run(tmp_path_factory):
    """The dataset-replies run: (its config, run_local's result, its folder)."""
    tmp_path = tmp_path_factory.mktemp("dataset-replies")
    src = tmp_path / "conversations.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in conversations()))
    cfg = load_config(preset="tiny", overrides={
        "run_id": "dataset-replies", "storage.root": f"file://{tmp_path}/runs", "data.sources": [{"uri": str(src)}],
        "data.responses": "dataset", "data.max_response_tokens": 48})
    return cfg, run_local(cfg, str(tmp_path / "kfp"), exports_dir=tmp_path / "exports"), tmp_path


@pytest.mark.integration
def test_a_dataset_responses_run_trains_on_the_dataset_s_replies_without_generating(dataset_run):
    cfg, result, tmp_path = dataset_run
    assert result["state"] == "SUCCEEDED", result["error"]
    states = {s.stage: s.state for s in result["statuses"]}
    assert states["generate"] == "not run", states
    assert all(states[s] == "done" for s in ("plan", "prep", "extract", "train", "evaluate", "export")), states

    store = open_store(cfg.storage, cfg.run_id)
    assert not store.list(f"{layout.STATUS}/generate"), "no generate task ran"
    prep = PrepSummary.model_validate(store.get_json_verified(layout.metrics_key("prep")))
    assert prep.responses == "dataset" and prep.bad_rows["no_reply"] == 2 and prep.quarantined == 2
    quarantined = [json.loads(x) for x in store.get_verified(layout.PROMPTS_QUARANTINE).decode().splitlines()]
    assert sorted(q["row"] for q in quarantined) == [31, 32] and {q["reason"] for q in quarantined} == {"no_reply"}
    for shard in range(cfg.data.num_shards):
        assert store.get_json_verified(layout.responses_done_key(shard))["responses"] == "dataset"

    evaluation = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    assert evaluation.lossless.passed and evaluation.drafter.tau >= 1.0
    report = open(result["report"]).read()
    assert html.escape(RESPONSES_SOURCE["dataset"]) in report
    assert f"responses: {RESPONSES_SOURCE['dataset']}" in store.get(layout.REPORT_MARKDOWN).decode(), "flagged"
    card = (tmp_path / "exports" / cfg.run_id / "zlab" / CARD_FILE).read_text()
    assert "the dataset's own assistant turns, not generated (data.responses=dataset)" in card


@pytest.mark.integration
def test_the_mixed_recipe_trains_on_from_the_dataset_run_on_target_replies(dataset_run, tmp_path):
    """docs/training.md's worked example at tiny size: the dataset run's export as the parent of a run on replies
    the target generates for fewer prompts of the same file."""
    first, result, folder = dataset_run
    assert result["state"] == "SUCCEEDED", result["error"]
    parent = folder / "exports" / first.run_id / "zlab"
    cfg = first.with_overrides({"run_id": "mixed", "storage.root": f"file://{tmp_path}/runs",
                                "data.responses": "target", "data.max_samples": 12, "drafter.init": "pretrained",
                                "drafter.init_from": str(parent), "training.max_steps": 2})
    mixed = run_local(cfg, str(tmp_path / "kfp"), exports_dir=tmp_path / "exports")
    assert mixed["state"] == "SUCCEEDED", mixed["error"]
    states = {s.stage: s.state for s in mixed["statuses"]}
    assert states["generate"] == states["train"] == "done", states
    store = open_store(cfg.storage, cfg.run_id)
    evaluation = EvaluateSummary.model_validate(store.get_json_verified(layout.metrics_key("evaluate")))
    assert evaluation.baseline_init == "pretrained" and evaluation.parent.source == str(parent)
    assert evaluation.lossless.passed
    card = (tmp_path / "exports" / cfg.run_id / "zlab" / CARD_FILE).read_text()
    assert "responses generated by the target itself" in card and "## Parent" in card
