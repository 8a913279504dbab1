"""Checkpoint formats that serving stacks load; the files, and who reads what, are in docs/serving.md.

z-lab / SpecForge format (vLLM `"method": "dflash"`, SGLang `DFLASH`): config.json is a Qwen3 config with
architectures ["DFlashDraftModel"] (["DFlash2DraftModel"] for dflash2: docs/dflash2.md), block_size,
num_target_layers and dflash_config {mask_token_id, target_layer_ids}; `layer_types` with `sliding_window` W, and
always `is_causal: false`: vLLM runs a sliding_attention layer causally unless told otherwise, and hands it W as
the per-layer window attention.py trains with. A "flashdraft" key records the target and mask-embedding facts for
our own loader. model.safetensors holds the draft weights, never the embedding nor the full LM head (with a draft
vocabulary: `d2t` and the drafter's own [K, H] lm_head.weight). A trainable mask embedding adds
mask_embedding.safetensors and, only with export.mask_embedding_pt (a pickle), mask_embedding.pt: vLLM's override
of the placeholder row mask_token_id, the one file it reads a trained mask from; only vLLM reads it, so an explicit
drafter.mask_token_id (a fixed row every reader shares) is the portable choice.

speculators format (`vllm serve <folder>`): speculators_model_type "dflash", aux_hidden_state_layer_ids = z-lab
ids + 1 (vLLM capture semantics), `sliding_window_non_causal: true`; the z-lab weights plus embed_tokens.weight
and lm_head.weight.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

MASK_PT, MASK_ST = "mask_embedding.pt", "mask_embedding.safetensors"


def layer_types(g: dict[str, Any]) -> list[str]:
    return list(g.get("layer_types") or ["full_attention"] * g["num_layers"])


def qwen3_config(g: dict[str, Any], dtype: str) -> dict[str, Any]:
    types = layer_types(g)
    sliding = "sliding_attention" in types
    return {
        "model_type": "qwen3", "hidden_size": g["hidden_size"], "intermediate_size": g["intermediate_size"],
        "num_hidden_layers": g["num_layers"], "num_attention_heads": g["num_heads"],
        "num_key_value_heads": g["num_kv_heads"], "head_dim": g["head_dim"], "hidden_act": "silu",
        "rms_norm_eps": g["rms_norm_eps"], "rope_theta": g["rope_theta"], "rope_scaling": None,
        "max_position_embeddings": g["max_position_embeddings"], "vocab_size": g["vocab_size"],
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "initializer_range": g["initializer_range"], "use_sliding_window": sliding,
        "sliding_window": g.get("sliding_window") if sliding else None, "max_window_layers": len(types),
        "layer_types": types, "is_causal": False, "torch_dtype": dtype,
    }


DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def zlab_config(g: dict[str, Any], dtype: str) -> dict[str, Any]:
    dflash2 = g.get("kind") == "dflash2"
    extra = {k: g[k] for k in DFLASH2_KEYS} if dflash2 else {}
    if dflash2:  # neutral values, written so a reader never guesses (flashdraft trains neither scaling nor a cap)
        extra.update(input_embedding_scale=1.0, output_multiplier=1.0)
    return {
        "architectures": ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"], **qwen3_config(g, dtype),
        "block_size": g["block_size"], "num_target_layers": g["num_target_layers"],
        "dflash_config": {"mask_token_id": g["mask_token_id"], "target_layer_ids": list(g["target_layer_ids"]),
                          "block_size": g["block_size"], **extra},
        "flashdraft": {"target": g.get("target", {}), "trainable_mask": g["trainable_mask"]},
        **({"draft_vocab_size": g["draft_vocab_size"]} if g.get("draft_vocab_size") else {}),
    }


def draft_vocab_tensors(body: dict[str, torch.Tensor], head: torch.Tensor) -> dict[str, torch.Tensor]:
    """A reduced draft vocabulary as vLLM reads it: `d2t` offsets (target id = draft index + d2t) and the
    drafter's own `lm_head.weight` [K, H] (the target's rows for those ids); without one, `body` unchanged."""
    if "d2t" not in body:
        return body
    ids = body["d2t"].long()
    return {**body, "d2t": ids - torch.arange(ids.numel()), "lm_head.weight": head.float()}


def speculators_config(g: dict[str, Any], dtype: str, verifier_architectures: list[str]) -> dict[str, Any]:
    return {
        "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": "0.9.0",
        "transformer_layer_config": qwen3_config(g, dtype),
        "draft_vocab_size": g.get("draft_vocab_size") or g["vocab_size"],
        "block_size": g["block_size"], "target_hidden_size": g["hidden_size"], "mask_token_id": g["mask_token_id"],
        "aux_hidden_state_layer_ids": [i + 1 for i in g["target_layer_ids"]], "sample_from_anchor": False,
        "sliding_window_non_causal": True,
        "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": g["block_size"] - 1}],
            "verifier": {"name_or_path": g.get("target", {}).get("model"), "architectures": verifier_architectures},
        },
    }


def split_mask(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    body = {k: v for k, v in weights.items() if k != "mask_embedding"}
    return body, weights.get("mask_embedding")


def _read_attention(c: dict[str, Any], where: str, causal: bool | None = None) -> dict[str, Any]:
    """layer_types/sliding_window back from a z-lab (or speculators' transformer_layer_config) config; refuses what
    our layers cannot run (causal blocks). `causal`: the format's own flag, when it has one."""
    types = c.get("layer_types")
    if causal is None:
        causal = c.get("is_causal")
    if causal is None:
        causal = (c.get("dflash_config") or {}).get("causal")
    if causal is None:  # vLLM's rule: without an explicit flag a sliding_attention layer is causal
        causal = bool(types) and "sliding_attention" in types
    if causal:
        raise ValueError(f"{where}: causal DFlash layers (is_causal, dflash_config.causal, or "
                         "sliding_attention without is_causal: false) are not supported; flashdraft drafters "
                         "attend bidirectionally inside a block")
    if types is None and c.get("use_sliding_window"):
        types = ["sliding_attention"] * c["num_hidden_layers"]
    if not types or "sliding_attention" not in types:
        return {"layer_types": list(types) if types else None, "sliding_window": None}
    window = (c.get("dflash_config") or {}).get("swa_window_size") or c.get("sliding_window")
    if window is None:
        raise ValueError(f"{where}: sliding_attention layers but no sliding_window")
    return {"layer_types": list(types), "sliding_window": int(window)}


def _layers_geometry(c: dict[str, Any]) -> dict[str, Any]:
    """The Qwen3-layer fields every format states the same way (z-lab's top level, speculators'
    transformer_layer_config)."""
    return {
        "hidden_size": c["hidden_size"], "num_heads": c["num_attention_heads"],
        "num_kv_heads": c["num_key_value_heads"],
        "head_dim": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        "intermediate_size": c["intermediate_size"], "rms_norm_eps": c["rms_norm_eps"],
        # transformers 5 writes it under rope_parameters (speculators' converter does)
        "rope_theta": c["rope_theta"] if "rope_theta" in c else c["rope_parameters"]["rope_theta"],
        "vocab_size": c["vocab_size"], "num_layers": c["num_hidden_layers"],
        "max_position_embeddings": c.get("max_position_embeddings", 32768),
        "initializer_range": c.get("initializer_range", 0.02),
    }


def _draft_vocab_back(weights: dict[str, torch.Tensor]) -> None:
    """`d2t` offsets back to target ids, in place; the reduced head is rebuilt from the target's."""
    if "d2t" in weights:
        weights["d2t"] = weights["d2t"].long() + torch.arange(weights["d2t"].numel())
        weights.pop("lm_head.weight", None)


def zlab_geometry(c: dict[str, Any], weights: dict[str, torch.Tensor], mask: torch.Tensor | None,
                  where: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A z-lab config.json, its weights and its optional trained mask embedding -> (DrafterGeometry fields,
    trainable weights by our names). `where` names the config file in errors."""
    archs = c.get("architectures", [])
    if not {"DFlashDraftModel", "DFlash2DraftModel"} & set(archs):
        raise ValueError(f"{where}: architectures {archs} is neither DFlashDraftModel nor DFlash2DraftModel")
    dflash, extra = c["dflash_config"], c.get("flashdraft", {})
    dflash2 = {}
    if "DFlash2DraftModel" in archs:
        missing = [k for k in DFLASH2_KEYS if k not in dflash]
        if missing:
            raise ValueError(f"{where}: DFlash2DraftModel without dflash_config {missing}")
        for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                             ("final_logit_softcapping", None)):
            if dflash.get(key) not in (neutral, None, 0, 0.0):
                raise ValueError(f"{where}: dflash_config.{key}={dflash[key]} is not supported "
                                 "(flashdraft drafters use none)")
        dflash2 = {"kind": "dflash2", **{k: int(dflash[k]) for k in DFLASH2_KEYS}}
    weights = dict(weights)
    _draft_vocab_back(weights)
    if mask is not None:
        weights["mask_embedding"] = mask
    geometry = {
        **_layers_geometry(c), "block_size": c.get("block_size") or dflash["block_size"],
        "target_layer_ids": dflash["target_layer_ids"], "num_target_layers": c["num_target_layers"],
        "mask_token_id": dflash["mask_token_id"], "trainable_mask": mask is not None,
        "target": extra.get("target", {}), **_read_attention(c, where),
        "draft_vocab_size": c.get("draft_vocab_size") if "d2t" in weights else None, **dflash2,
    }
    return geometry, weights


def speculators_geometry(c: dict[str, Any], weights: dict[str, torch.Tensor], where: str, *,
                         num_target_layers: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators DFlash config.json and its weights -> (DrafterGeometry fields, trainable weights by our
    names). The format names target layers by vLLM's capture ids (z-lab id + 1) and does not record the target's
    layer count: `num_target_layers` is the target's. Its full embedding and LM head are the target's own and are
    dropped (the drafter reads the target's); a trained mask embedding travels as `mask_embedding`."""
    if c.get("speculators_model_type") != "dflash":
        raise ValueError(f"{where}: speculators_model_type {c.get('speculators_model_type')!r} is not 'dflash'")
    layer = c["transformer_layer_config"]
    weights = {k: v for k, v in weights.items() if k not in ("embed_tokens.weight",)}
    if "d2t" not in weights:
        weights.pop("lm_head.weight", None)
    _draft_vocab_back(weights)
    weights.pop("t2d", None)  # speculators' reverse map; ours is rebuilt from d2t
    draft_vocab = c.get("draft_vocab_size")
    layer_ids = [int(i) - 1 for i in c["aux_hidden_state_layer_ids"]]
    fc = weights.get("fc.weight")
    if fc is not None and fc.shape[1] == (len(layer_ids) + 1) * layer["hidden_size"]:
        # speculators' converter leaves a z-lab id equal to the target's last layer out (vLLM captures that layer
        # anyway); the fc's input width says one more layer feeds it
        layer_ids.append(num_target_layers - 1)
    geometry = {
        **_layers_geometry(layer), "block_size": c["block_size"], "target_layer_ids": layer_ids,
        "num_target_layers": num_target_layers, "mask_token_id": c["mask_token_id"],
        "trainable_mask": "mask_embedding" in weights, "target": {},
        **_read_attention(layer, where, causal=not c.get("sliding_window_non_causal", False)
                          if "sliding_attention" in (layer.get("layer_types") or []) else False),
        "draft_vocab_size": draft_vocab if "d2t" in weights and draft_vocab != layer["vocab_size"] else None,
    }
    return geometry, weights


def read_zlab(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A z-lab folder -> (DrafterGeometry fields, trainable weights by our names)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    c = json.loads((folder / "config.json").read_text())
    mask = load_file(str(folder / MASK_ST))["mask_embedding"] if (folder / MASK_ST).is_file() else None
    return zlab_geometry(c, load_file(str(folder / "model.safetensors")), mask, f"{folder}/config.json")
