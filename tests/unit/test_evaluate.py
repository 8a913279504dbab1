"""`run_evaluate` end to end on the tiny preset: prep's eval split + user JSONL prompts, a drafter checkpoint in
the store, committed metrics with tau/acceptance/throughput, the lossless check, and exactly-once reruns."""

from __future__ import annotations

import json

import pytest
from support.evaluate_fixtures import commit_drafter, export_perturbed_drafter
from support.shared_runs import copy_run

from flashdraft.components.evaluate.evaluate import run_evaluate
from flashdraft.components.prep.prep import run_prep
from flashdraft.run.runner import run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


@pytest.fixture()
def evaluated(tiny_evaluated):
    """The session's tiny evaluation (tests/support/shared_runs.py): held-out suite of 1 prompt of prep's split + 2
    from eval.extra_prompts, then 1 humaneval prompt; a committed random drafter."""
    run = tiny_evaluated
    return run.cfg, run["drafter_uri"], run["metrics"]


def test_evaluate_commits_metrics_and_passes_the_lossless_check(evaluated):
    cfg, uri, metrics = evaluated
    stored = open_store(cfg.storage, cfg.run_id).get_json_verified(layout.metrics_key("evaluate"))
    assert stored == metrics.dump()
    assert metrics.drafter_uri == uri
    assert metrics.lossless.model_dump() == {"checked": True, "passed": True, "prompts": 4, "mismatches": [],
                                             "ties": [], "tie_margin": 0.0}
    ids = [p.id for p in metrics.prompts]
    assert ids[1:] == ["user-1", "extra-3", "HumanEval/0"] and ids[0] not in ids[1:]
    for name in ("drafter", "baseline"):
        m = getattr(metrics, name)
        assert 1.0 <= m.tau <= cfg.drafter.block_size
        assert len(m.acceptance_per_position) == metrics.draft_length.num_drafts  # k drafts a cycle
        assert m.tokens == metrics.target.tokens > 0
        assert m.tokens_per_s > 0 and m.speedup > 0
    # the headline figures are the first suite's (held-out)
    assert metrics.target.tokens == sum(p.new_tokens for p in metrics.prompts if p.suite == "heldout")


def test_evaluate_rerun_is_reused_and_changed_eval_settings_evaluate_again(tiny_evaluated, tmp_path):
    cfg, _ = copy_run(tiny_evaluated, tmp_path)  # the reruns commit: on a copy of the shared run
    metrics = tiny_evaluated["metrics"]
    store = open_store(cfg.storage, cfg.run_id)
    before = store.read_commit(layout.metrics_key("evaluate"))
    again = run_task(cfg, "evaluate")
    assert again.skipped and again.drafter == metrics.drafter
    assert store.read_commit(layout.metrics_key("evaluate")) == before
    shorter = run_task(cfg.with_overrides({"eval.max_new_tokens": 4}), "evaluate")
    assert not shorter.skipped and shorter.target.tokens < metrics.target.tokens
    assert store.get_json_verified(layout.metrics_key("evaluate"))["target"]["tokens"] == shorter.target.tokens


def test_evaluate_without_a_trained_drafter_names_what_is_missing(tiny_cfg):
    run_prep(tiny_cfg)
    with pytest.raises(FileNotFoundError, match="no trained drafter: .*checkpoints/latest.json is not committed"):
        run_evaluate(tiny_cfg)


def test_bad_extra_prompt_line_is_named(tiny_cfg, tmp_path):
    from flashdraft.components.evaluate.prompts import extra_prompts
    from flashdraft.target.model import load_tokenizer

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"text": "no prompt key"}) + "\n")
    cfg = tiny_cfg.with_overrides({"eval.extra_prompts": str(bad)})
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: expected an object with a 'prompt'"):
        extra_prompts(cfg, load_tokenizer(cfg.target))


def test_a_broken_acceptance_rule_fails_the_evaluation_naming_the_prompts(evaluated):
    from flashdraft.components.evaluate.evaluate import evaluate_prompts
    from flashdraft.components.evaluate.prompts import load_eval_prompts
    from flashdraft.components.evaluate.spec import greedy_accept
    from flashdraft.drafter.persistence import build_drafter
    from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer

    cfg, _, _ = evaluated
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    prompts = load_eval_prompts(cfg, open_store(cfg.storage, cfg.run_id), tok)[:2]
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=5, tokenizer=tok)

    def one_too_many(draft, choice):
        return min(draft.numel(), greedy_accept(draft, choice) + 1)

    metrics = evaluate_prompts(cfg, model, tok, prompts, {"drafter": drafter}, cfg.layer_ids(), accept=one_too_many)
    assert metrics.lossless.checked and not metrics.lossless.passed
    assert sorted(m.prompt_id for m in metrics.lossless.mismatches) == sorted(p.prompt_id for p in prompts)


def test_the_baseline_decodes_only_its_prompt_limit_and_is_compared_on_those_prompts(evaluated):
    from flashdraft.components.evaluate.evaluate import evaluate_prompts
    from flashdraft.components.evaluate.prompts import load_eval_prompts
    from flashdraft.drafter.persistence import build_drafter
    from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer

    cfg, _, _ = evaluated
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    prompts = load_eval_prompts(cfg, open_store(cfg.storage, cfg.run_id), tok)
    drafter = build_drafter(cfg, load_hf_config(cfg.target), seed=5, tokenizer=tok)
    metrics = evaluate_prompts(cfg, model, tok, prompts, {"drafter": drafter, "baseline": drafter}, cfg.layer_ids(),
                               prompt_limits={"baseline": 1})
    baseline = metrics.decoders["baseline"]
    assert metrics.drafter.prompts == len(prompts) == 3 and baseline.prompts == 1
    assert baseline.tokens == metrics.prompts[0].new_tokens < metrics.target.tokens
    assert [p.baseline_tau is None for p in metrics.prompts] == [False, True, True]
    assert metrics.lossless.passed and baseline.speedup > 0


def test_baseline_prompts_zero_skips_the_baseline(tmp_path):
    from flashdraft.config import load_config

    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/runs", "eval.num_prompts": 1,
                                                "eval.max_new_tokens": 6, "eval.baseline_prompts": 0})
    run_prep(cfg)
    commit_drafter(cfg, seed=7)
    metrics = run_evaluate(cfg)
    assert metrics.baseline is None and metrics.drafter.prompts == 1 and metrics.lossless.passed


def test_a_pretrained_parent_is_the_baseline_on_every_prompt_the_drafter_decodes(tmp_path):
    """Trained on from a parent, evaluate's baseline is the parent, decoded on every prompt of every suite as the
    `published` baseline at its own k (eval.baseline_prompts limits only an untrained baseline, whose tau is ~1.0
    anyway): tau before and after on the same prompts."""
    from flashdraft.config import load_config

    export_perturbed_drafter(load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/parent"}),
                             tmp_path / "export")
    cfg = load_config(preset="tiny", overrides={
        "storage.root": f"file://{tmp_path}/runs", "eval.num_prompts": 3, "eval.max_new_tokens": 6,
        "eval.baseline_prompts": 1, "drafter.init": "pretrained", "training.max_steps": 2,
        "drafter.init_from": str(tmp_path / "export" / "zlab")})
    run_prep(cfg)
    commit_drafter(cfg, seed=7)
    metrics = run_evaluate(cfg)
    assert metrics.baseline_init == "pretrained" and metrics.parent.format == "zlab"
    assert metrics.baseline.prompts == metrics.drafter.prompts == 3
    assert all(getattr(p, "published_tau", None) is not None for p in metrics.prompts)
    assert [b.name for b in metrics.baselines] == ["ngram", "published"]
    published = metrics.baselines[1]
    assert published.speculative_config["method"] == "dflash" and published.speculative_config["model"]


def test_every_evaluation_decodes_prompt_lookup_beside_the_drafter_and_says_which_to_serve(evaluated):
    """The shared tiny run (no eval.baselines set): ngram on every suite at its own k, losslessly; mtp refused in
    one line (the tiny target has no MTP head); a verdict per suite in the report, the console and the card."""
    from flashdraft.components.evaluate.report_section import verdict, verdict_table
    from flashdraft.components.export.card import verdict_lines

    cfg, _, metrics = evaluated
    (ngram,) = metrics.baselines
    assert ngram.name == "ngram" and set(ngram.suites) == {s.name for s in metrics.suites}
    assert all(ngram.lossless.values()) and 1 <= ngram.num_drafts <= cfg.drafter.block_size - 1
    assert ngram.speculative_config == {"method": "ngram", "num_speculative_tokens": ngram.num_drafts,
                                        "prompt_lookup_max": 5, "prompt_lookup_min": 5}
    for stats in ngram.suites.values():
        assert stats.tau >= 1.0 and stats.tokens_per_s > 0 and stats.speedup > 0
    assert [line.split(":")[0] for line in metrics.baselines_refused] == ["published", "mtp"]
    assert [v.suite for v in metrics.verdicts] == [s.name for s in metrics.suites]
    for v in metrics.verdicts:
        fastest = max(v.candidates.values())
        assert v.tokens_per_s == fastest and v.winner in {"drafter", "ngram", "target"}
        assert v.margin is None or v.margin >= 1.0
    assert metrics.figures()["ngram_num_draft_tokens"] == ngram.num_drafts
    lines = verdict(metrics)
    assert [x for x in lines if x.startswith("serve: ")] == [f"serve: {v.line()}" for v in metrics.verdicts]
    assert "full-block tau" in lines[2]
    assert len(verdict_table(metrics)) == 1 + len(metrics.suites)
    text = metrics.decoder_table_text()
    assert "ngram" in text and "untrained" in text and text.splitlines()[-1].startswith("  (mtp: ")
    card = "\n".join(verdict_lines(metrics, "exports/x/zlab"))
    assert card.startswith("## Which to serve") and "vLLM:" in card and "tok/s" not in card  # no timings
    winner = metrics.verdicts[0]
    if winner.winner == "ngram":
        assert '"method": "ngram"' in card
    elif winner.winner == "drafter":
        assert '"model": "exports/x/zlab"' in card
