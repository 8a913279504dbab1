"""Continuous batching (components/generate/continuous.py) against plain transformers greedy decoding of each
prompt alone: prompts of different lengths, fewer slots than prompts (rows finish, at their stop token or the
length limit, and waiting prompts take their slots), a buffer small enough that the live window moves back to its
start many times. Greedy tokens must be identical on these prompts (fp32; a batched GEMM may round differently
from a one-row one, so a near-tie argmax could in principle flip: the module docstring says so, and these prompts
pin that it does not here). Sampling is seeded per prompt: a reply depends on its prompt and seed only."""

from __future__ import annotations

import pytest
import torch
from support.target_families import build_family

from flashdraft.components.generate.backends import stop_token_ids
from flashdraft.components.generate.continuous import ContinuousDecoder, supports_slots
from flashdraft.components.generate.cost import ForwardCost
from flashdraft.components.generate.summary import GenerateSummary
from flashdraft.config import TargetConfig, load_config
from flashdraft.target.model import load_causal_lm, load_tokenizer

MAX_NEW = 24
QUESTIONS = ["Hi!", "What is 2 + 2? Answer with the number only.",
             "Write a short poem about the sea, the wind and a lighthouse keeper who waits for a ship that never "
             "comes home, in four lines.",
             "Say yes.", "Name three colours.",
             "Explain in one sentence why the sky is blue, as you would to a child who has just asked you on a walk "
             "in the park on a sunny afternoon in late spring."]


def _prompts(tok) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=True)["input_ids"] for q in QUESTIONS]


def _alone(model, prompt: list[int], stop: list[int]) -> list[int]:
    """transformers greedy decoding of `prompt` alone (no padding), cut after its first stop token."""
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                             do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=stop, pad_token_id=stop[0])
    ids = out[0, len(prompt):].tolist()
    return next((ids[:n + 1] for n, t in enumerate(ids) if t in stop), ids)


@pytest.fixture(scope="module")
def smollm2():
    target = load_config(preset="smollm2-local").target
    tok = load_tokenizer(target)
    return load_causal_lm(target), tok, stop_token_ids(tok)


def test_greedy_tokens_equal_each_prompt_decoded_alone(smollm2):
    model, tok, stop = smollm2
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) == len(prompts)
    result = ContinuousDecoder(model, 2, MAX_NEW, stop, margin=3).run(prompts, [0] * len(prompts))
    expected = [_alone(model, p, stop) for p in prompts]
    assert result.ids == expected
    ended = [ids[-1] in stop for ids in expected]
    assert any(ended) and not all(ended), "some rows must stop early and some run to the limit"
    assert result.steps < sum(map(len, expected)) - len(prompts), "rows shared decode steps"


def test_sampling_is_seeded_per_prompt(smollm2):
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    model, tok, stop = smollm2
    prompts = _prompts(tok)
    decoder = ContinuousDecoder(model, 3, MAX_NEW, stop, LogitsProcessorList([TemperatureLogitsWarper(0.9),
                                                                              TopPLogitsWarper(0.95)]))
    seeds = [11, 12, 13, 14, 15, 16]
    together = decoder.run(prompts, seeds).ids
    reversed_ = decoder.run(prompts[::-1], seeds[::-1]).ids[::-1]
    alone = decoder.run(prompts[2:3], seeds[2:3]).ids[0]
    assert together == reversed_ and alone == together[2]
    other_seed = decoder.run(prompts, [s + 100 for s in seeds]).ids
    assert other_seed != together
    assert together != [_alone(model, p, stop) for p in prompts], "sampling, not greedy"


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_family(f, root / f) for f in ("llama", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5")}


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_every_plain_attention_family_decodes_as_alone(families, family):
    target = TargetConfig(model=str(families[family]), source="hf", dtype="float32")
    tok, model = load_tokenizer(target), load_causal_lm(target)
    prompts = _prompts(tok)[:4]
    assert supports_slots(model)
    result = ContinuousDecoder(model, 2, MAX_NEW, [tok.eos_token_id], margin=3).run(prompts, [0] * len(prompts))
    assert result.ids == [_alone(model, p, [tok.eos_token_id]) for p in prompts]


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_5"])
def test_sliding_window_and_hybrid_targets_keep_static_batches(families, family):
    target = TargetConfig(model=str(families[family]), source="hf", dtype="float32")
    assert not supports_slots(load_causal_lm(target))


def test_forward_cost_counts_the_gemms_torch_counts(smollm2):
    """The linear layers and the LM head as torch's FlopCounterMode counts a 20-token prefill that takes one row of
    logits (its CPU attention kernel has no FLOP formula: the attention term is the documented 4 x hd x heads)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, _, _ = smollm2
    cost = ForwardCost.of(model)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.arange(100, 120)[None], logits_to_keep=1)
    assert counter.get_total_flops() == cost.linear_per_token * 20 + cost.head_per_token
    text = model.config
    assert cost.attention_per_pair == 4 * text.head_dim * text.num_attention_heads * text.num_hidden_layers
    # a reply of n tokens feeds the prompt and n - 1 of them, and takes n rows of logits
    fed = 20 + 4
    assert cost.reply(20, 5) == (cost.linear_per_token * fed + cost.head_per_token * 5
                                 + cost.attention_per_pair * fed * (fed + 1) / 2)


def test_gemm_share_sums_over_shards_and_is_absent_without_a_measurement():
    shard = {"samples": 4, "generated_tokens": 400, "generation_seconds": 10.0}
    cpu = [GenerateSummary.model_validate({**shard, "forward_flops": f, "gemm_share": s, "gemm_flops_per_s": 1e11})
           for f, s in ((2e11, 0.2), (6e11, 0.6))]
    figures = {k: cpu[0].figures()[k] + cpu[1].figures()[k] for k in cpu[0].figures()}
    assert GenerateSummary.derive(figures)["gemm_share"] == 0.4  # 8e11 FLOPs of the 2e12 the CPU could do
    assert GenerateSummary.headline(figures).endswith("40.0 tokens/s, gemm share 40%")
    gpu = GenerateSummary.model_validate(shard).figures()
    assert "gemm_share" not in GenerateSummary.derive(gpu)
    assert GenerateSummary.headline(gpu).endswith("40.0 tokens/s")
