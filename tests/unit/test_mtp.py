"""The target's own MTP head as a baseline: a tiny Qwen3.5-architecture target built with random `mtp.*` weights
drafts through the same speculative decoder losslessly (its tau is reported and means nothing on random weights);
a target without them is refused in one line."""

from __future__ import annotations

import pytest
import torch
from support.target_families import add_mtp_weights, build_family

from flashdraft.components.evaluate.baselines import has_mtp_weights, select_baselines
from flashdraft.components.evaluate.draft_length import measure_cycle_costs
from flashdraft.components.evaluate.evaluate import lossless_mismatches, summarize
from flashdraft.components.evaluate.mtp import MtpError, load_mtp_proposer
from flashdraft.components.evaluate.prompts import EvalPrompt
from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.config import load_config
from flashdraft.target.model import load_causal_lm

MAX_NEW = 16


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    """(the folder with MTP weights, the one without, the config of the first)."""
    root = tmp_path_factory.mktemp("mtp")
    plain = build_family("qwen3_5", root / "plain")
    with_mtp = add_mtp_weights(build_family("qwen3_5", root / "mtp"))
    cfg = load_config(preset="tiny", overrides=[f"target.model={with_mtp}", "target.source=hf",
                                                "target.dtype=float32"])
    return with_mtp, plain, cfg


def test_a_qwen35_target_with_mtp_weights_drafts_with_its_head_losslessly(qwen35):
    model_dir, _, cfg = qwen35
    assert has_mtp_weights(cfg)
    assert select_baselines(cfg, has_mtp=True)[0] == ["ngram", "mtp"]
    model = load_causal_lm(cfg.target)
    proposer = load_mtp_proposer(model, model_dir, None, max_drafts=3)
    prompts = [[5, 17, 99, 3, 42, 7, 8, 250, 11, 12], [300, 301, 5, 5, 9, 1000, 77]]
    refs = [target_generate(model, p, MAX_NEW, set()) for p in prompts]
    gens = [speculative_generate(model, proposer, p, [0], MAX_NEW, set(), num_drafts=3) for p in prompts]
    evals = [EvalPrompt(prompt_id=f"p{i}", input_ids=p, source="test") for i, p in enumerate(prompts)]
    assert lossless_mismatches(evals, refs, gens, "mtp") == []
    stats = summarize(gens)
    assert stats.cycles > 0 and 1.0 <= stats.tau <= 4.0 and stats.block_size == 4  # random head: any tau
    # the recomputing reference (no cache reuse) decodes the same
    again = speculative_generate(model, proposer, prompts[0], [0], MAX_NEW, set(), num_drafts=3, reuse_cache=False)
    assert again.tokens == refs[0].tokens and again.accepted == gens[0].accepted
    costs = measure_cycle_costs(model, proposer, prompts[0], [0], 4, reps=1)
    assert len(costs.draft_ms) == 3


def test_a_target_without_mtp_weights_refuses_mtp_in_one_line(qwen35):
    _, plain, cfg = qwen35
    cfg = cfg.with_overrides({"target.model": str(plain), "eval.baselines": ["mtp"]})
    assert not has_mtp_weights(cfg)
    with pytest.raises(Exception) as err:
        select_baselines(cfg, has_mtp=has_mtp_weights(cfg))
    assert str(err.value).count("\n") == 0 and "ships no mtp.* weights" in str(err.value)
    with pytest.raises(MtpError, match="ships no mtp.\\* weights"):
        load_mtp_proposer(torch.nn.Linear(1, 1), plain, None, 3)
