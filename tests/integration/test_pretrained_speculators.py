"""The speculators format against speculators' own code (0.9.0, `make bench-venv`): its DFlash converter turns our
z-lab export into a speculators folder; `drafter.init: pretrained` reads that folder into exactly the source's
weights, and its draft logits match those of speculators' own DFlashDraftModel loaded from the same folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.evaluate_fixtures import export_perturbed_drafter

from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.persistence import build_drafter
from flashdraft.target.model import load_hf_config, resolve_model_dir

ROOT = Path(__file__).resolve().parents[2]
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"
PEER = ROOT / "tests" / "support" / "speculators_peer.py"


@pytest.mark.integration
def test_a_folder_made_by_speculators_converter_loads_with_speculators_logits(tiny_cfg, tmp_path):
    if not BENCH_PY.is_file():  # `make test` builds it; a bare pytest run must say what is missing, not skip
        pytest.fail(f"{BENCH_PY} is missing: speculators 0.9.0's side runs in its own venv (`make bench-venv`)")
    # an explicit mask row: speculators' converter keeps no trained mask embedding (export.py warns of it)
    cfg = tiny_cfg.with_overrides({"export.dtype": "float32", "drafter.mask_token_id": 0})
    source = export_perturbed_drafter(cfg, tmp_path / "out", seed=5, step=1)
    g = source.geometry
    gen = torch.Generator().manual_seed(0)
    T, anchors = 24, torch.tensor([3, 9, 15])
    feats = torch.randn(T, g.num_features * g.hidden_size, generator=gen)
    ids = torch.randint(0, g.vocab_size, (T,), generator=gen)
    save_file({"features": feats, "input_ids": ids, "anchors": anchors}, str(tmp_path / "inputs.safetensors"))
    run = subprocess.run([str(BENCH_PY), str(PEER), str(tmp_path / "out" / "zlab"),
                          str(resolve_model_dir(cfg.target)), str(tmp_path), str(tmp_path / "inputs.safetensors")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

    child = cfg.with_overrides({"drafter.init": "pretrained", "drafter.init_from": str(tmp_path / "speculators")})
    loaded = build_drafter(child, load_hf_config(child.target), seed=1).eval()
    assert loaded.parent.format == "speculators"
    own = source.state_dict()
    assert sorted(own) == sorted(loaded.state_dict())
    assert all(torch.equal(v, own[k]) for k, v in loaded.state_dict().items())
    with torch.no_grad():
        ours = loaded.logits(loaded(feats, BlockLayout(T, g.block_size, anchors), torch.arange(T), ids[anchors],
                                    anchors)).reshape(anchors.numel(), g.block_size, -1)
    theirs = load_file(str(tmp_path / "logits.safetensors"))["logits"].reshape(anchors.numel(), g.block_size, -1)
    # two attention implementations (speculators' flex-attention mask, ours): the same function, not the same sums
    torch.testing.assert_close(ours[:, 1:], theirs[:, 1:], rtol=1e-4, atol=1e-4)
    assert torch.equal(ours[:, 1:].argmax(-1), theirs[:, 1:].argmax(-1))
