"""Runs inside .venv-bench (speculators 0.9.0): speculators' own DFlash converter turns a z-lab folder into a
speculators folder, and speculators' own DFlashDraftModel, loaded from that folder, computes its draft logits for
given target features, tokens and anchors. Usage: python speculators_peer.py ZLAB_FOLDER VERIFIER_FOLDER OUT_FOLDER
INPUTS.safetensors; writes OUT_FOLDER/speculators/ and OUT_FOLDER/logits.safetensors."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from speculators.convert.dflash import DFlashConverter
from speculators.models.dflash import DFlashDraftModel
from speculators.models.dflash import core as spec_core


def main(zlab: str, verifier: str, out: str, inputs: str) -> None:
    folder = Path(out) / "speculators"
    DFlashConverter().convert(zlab, folder, base_model=verifier, validate=True)
    model = DFlashDraftModel.from_pretrained(str(folder)).float().eval()
    x = load_file(inputs)
    anchors = x["anchors"].long()
    # speculators draws anchors at random in training; this check hands it the same ones
    spec_core.select_anchors = lambda loss_mask, n, bs: (anchors, torch.ones_like(anchors, dtype=torch.bool))
    T = x["input_ids"].numel()
    with torch.no_grad():
        _, logits, _, _, _ = model._backbone_forward(
            hidden_states=x["features"][None].float(), input_ids=x["input_ids"][None].long(),
            loss_mask=torch.ones(1, T, dtype=torch.long),
            verifier_last_hidden_states=torch.zeros(1, T, model.config.transformer_layer_config.hidden_size),
            document_ids=torch.zeros(1, T, dtype=torch.long), position_ids=torch.arange(T)[None],
            max_anchors=anchors.numel())
    save_file({"logits": logits[0].contiguous()}, str(Path(out) / "logits.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
