"""Making a drafter: `build_drafter` (a fresh one for a run config), `save_drafter` / `load_drafter` (a drafter
folder, a training checkpoint in the object store, or a z-lab export) and `drafter_from_parts`.

A drafter folder holds `drafter_config.json` (the geometry, with the target it was trained on) and
`model.safetensors` (trainable weights by z-lab name: `layers.*`, `fc.weight`, `hidden_norm.weight`,
`norm.weight`, plus `mask_embedding` when trainable and `d2t` with a draft vocabulary). The frozen embedding and
LM head are never saved: loading reads them from the target.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save_file

from flashdraft.config import TargetConfig
from flashdraft.drafter.dflash_drafter import DFlashDrafter
from flashdraft.drafter.geometry import DrafterGeometry, geometry_from_hf, resolve_mask_token
from flashdraft.drafter.pretrained import build_pretrained
from flashdraft.drafter.zlab import read_zlab
from flashdraft.storage.layout import CONFIG_FILE, WEIGHTS_FILE
from flashdraft.storage.store import ObjectStore
from flashdraft.target.model import load_tokenizer, target_embeddings, target_init, text_config

log = logging.getLogger(__name__)


def save_drafter(model: DFlashDrafter, folder: str | Path) -> Path:
    """Write `model` as a drafter folder (`load_drafter` reads it back)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(model.weights(), str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps(model.config_dict(), indent=2))
    return out


def load_drafter(source, *, target=None, device: str | torch.device = "cpu", attn_impl: str = "auto",
                 prefix: str = "") -> DFlashDrafter:
    """Load a drafter folder (local path or an ObjectStore + key prefix) or a z-lab export folder.

    From a store, both files are committed bytes read verified against their commit records (a byte flipped at
    rest is a ChecksumError naming the key, never a different drafter). The frozen embedding/LM head come from
    `target` (a TargetConfig; default: the one recorded in the drafter config)."""
    if isinstance(source, ObjectStore):
        key = (prefix.rstrip("/") + "/") if prefix else ""
        config = source.get_json_verified(key + CONFIG_FILE)
        weights = load_bytes(source.get_verified(key + WEIGHTS_FILE))
    else:
        folder = Path(source)
        if (folder / CONFIG_FILE).is_file():
            config = json.loads((folder / CONFIG_FILE).read_text())
            weights = load_bytes((folder / WEIGHTS_FILE).read_bytes())
        elif (folder / "config.json").is_file():
            config, weights = read_zlab(folder)
        else:
            raise FileNotFoundError(f"{folder}: neither {CONFIG_FILE} nor a z-lab config.json")
    return drafter_from_parts(config, weights, target=target, device=device, attn_impl=attn_impl)


def drafter_from_parts(config: dict[str, Any], weights: dict[str, torch.Tensor], *, target=None, device="cpu",
                       attn_impl: str = "auto") -> DFlashDrafter:
    """A drafter from its geometry fields and trainable weights. The frozen embedding and LM head stay in the
    target checkpoint's dtype, memory-mapped on CPU (`mmap_tensor`); `logits` computes in the drafter's dtype all
    the same (`upcast_matmul`)."""
    geometry = DrafterGeometry(**config)
    target_cfg = target if target is not None else TargetConfig(**geometry.target)
    embed, head = target_embeddings(target_cfg)
    model = DFlashDrafter(geometry, attn_impl=attn_impl)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
    model.set_frozen(embed, head)
    return model.to(device).eval()


def build_drafter(cfg, target_hf_config, init: str = "random", seed: int | None = None, tokenizer=None,
                  device: str | torch.device = "cpu", attn_impl: str = "auto",
                  frozen_dtype: torch.dtype | None = torch.float32) -> DFlashDrafter:
    """A drafter for `cfg` (RunConfig) on the target described by `target_hf_config`, with the target's frozen
    embedding/LM head loaded. init="random" gives the seeded untrained baseline (seed default training.seed);
    drafter.init=target then copies target layers, drafter.init=pretrained starts from drafter.init_from
    (pretrained.py: its geometry, checked against the settings). `frozen_dtype`: the embedding/LM head's dtype
    (None: the checkpoint's, memory-mapped, no copy)."""
    if init != "random":
        raise ValueError(f"init={init!r}: only 'random' (use load_drafter for a checkpoint)")
    embed, head = target_embeddings(cfg.target)
    if frozen_dtype is not None:
        embed, head = embed.to(frozen_dtype), head.to(frozen_dtype)  # no copy when the checkpoint has that dtype
    if cfg.drafter.init == "pretrained":
        model, parent, fresh = build_pretrained(cfg, target_hf_config, seed=cfg.training.seed if seed is None
                                                else seed, attn_impl=attn_impl, frozen=(embed, head))
        log.warning("drafter init from %s%s", parent.line(),
                    f"; a DFlash checkpoint starting a dflash2 drafter: its shared weights loaded, the DFlash2-only "
                    f"parts ({len(fresh)} tensors: block convolutions, candidate selector) initialised as for a "
                    "new drafter" if fresh else "")
        return model.to(device)
    text_cfg = text_config(target_hf_config)
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.target)
    mask_id, trainable = resolve_mask_token(cfg.drafter.mask_token_id, tok, int(text_cfg.vocab_size))
    geometry = geometry_from_hf(
        target_hf_config, num_layers=cfg.drafter.num_layers, block_size=cfg.drafter.block_size,
        target_layer_ids=cfg.layer_ids(int(text_cfg.num_hidden_layers)), mask_token_id=mask_id,
        trainable_mask=trainable, target=cfg.target.model_dump(mode="json"), **cfg.drafter.geometry_overrides())
    geometry.draft_vocab_size = cfg.drafter.draft_vocab_size
    if cfg.drafter.kind == "dflash2":
        d = cfg.drafter
        geometry = replace(geometry, kind="dflash2", conv_kernel_size=d.conv_kernel_size,
                           conv_group_size=d.conv_group_size, selector_rank=d.selector_rank,
                           selector_top_k=d.selector_top_k)
    model = DFlashDrafter(geometry, attn_impl=attn_impl)
    model.set_frozen(embed, head)
    model.init_weights(cfg.training.seed if seed is None else seed, cfg.drafter.mask_init)
    if cfg.drafter.init == "target":
        ids = cfg.drafter.resolved_init_layers(int(text_cfg.num_hidden_layers))
        copied = model.init_from_target(*target_init(cfg.target, ids))
        log.info("drafter init from target layers %s: %d tensors copied", ids, len(copied))
    return model.to(device)
