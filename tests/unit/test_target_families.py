"""Every target family flashdraft supports, as tiny random checkpoints built with transformers' own classes
(tests/target_families.py): speculative decoding stays lossless whatever the drafter proposes, including across
gpt-oss's sliding-window layers (a window of 8, prompts of ~38 tokens) and with a verify block wider than the
window; and the rolled-back sliding-window cache is exactly what a forward of the accepted tokens leaves."""

from __future__ import annotations

import pytest
import torch
from support.scripted_drafter import ScriptedDrafter
from support.target_families import FAMILIES, SLIDING_WINDOW, build_family

from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.components.evaluate.target_cache import VerifyCache
from flashdraft.config import TargetConfig
from flashdraft.target.model import load_causal_lm, load_tokenizer

MAX_NEW = 24


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_family(f, root / f) for f in FAMILIES}


def _loaded(family_dirs, family):
    target = TargetConfig(model=str(family_dirs[family]), source="hf", dtype="float32")
    tok, model = load_tokenizer(target), load_causal_lm(target)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three colours, and say why."}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
    return model, prompt


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_decoding_is_lossless_on_every_family(family_dirs, family):
    """Full, partial and zero acceptance, and (gpt-oss) a block of 16 against a window of 8: the greedy output is
    the target's own, and every full cycle accepts exactly what matched."""
    model, prompt = _loaded(family_dirs, family)
    assert len(prompt) > 2 * SLIDING_WINDOW
    reference = target_generate(model, prompt, MAX_NEW, set())
    blocks = [8, 16] if family == "gpt_oss" else [8]
    for block in blocks:
        for wrong_from, expected in [(None, block - 1), (2, 2), (0, 0)]:
            drafter = ScriptedDrafter(reference.tokens, len(prompt), block, wrong_from)
            got = speculative_generate(model, drafter, prompt, [1, 2, 3], MAX_NEW, set())
            assert got.tokens == reference.tokens, (family, block, wrong_from)
            assert got.accepted[:-1] and all(a == expected for a in got.accepted[:-1]), (block, got.accepted)


@pytest.mark.parametrize("width, reforwarded", [(6, 0), (8, 3)])
def test_sliding_window_cache_after_rollback_equals_a_forward_of_the_accepted_tokens(family_dirs, width, reforwarded):
    """gpt-oss past its window of 8: verify a block, keep 3; every layer (sliding and full) then holds what a
    prefill of exactly the accepted tokens holds. A block the window still holds whole (6 <= W-1) is spliced with
    no extra target work; a wider one (8) is rewound and its accepted tokens re-forwarded."""
    from transformers import DynamicCache

    model, prompt = _loaded(family_dirs, "gpt_oss")
    ids = torch.tensor([prompt])
    block = torch.tensor(prompt[:width]) + 1
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True)
        vc = VerifyCache(model, cache)
        vc.checkpoint()
        model(input_ids=block[None], cache=cache, use_cache=True)
        vc.keep(block, 3)
        fresh = DynamicCache(config=model.config)
        model(input_ids=torch.cat([ids[0], block[:3]])[None], cache=fresh, use_cache=True)
    kinds = set()
    for got, want in zip(cache.layers, fresh.layers, strict=True):
        kinds.add(type(got).__name__)
        assert got.get_seq_length() == want.get_seq_length() == len(prompt) + 3
        torch.testing.assert_close(got.keys, want.keys)
        torch.testing.assert_close(got.values, want.values)
    assert kinds == {"DynamicSlidingWindowLayer", "DynamicLayer"}
    assert cache.layers[0].keys.shape[-2] == SLIDING_WINDOW - 1 and vc.reforwarded_tokens == reforwarded
