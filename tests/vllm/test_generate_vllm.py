"""The real vLLM code path on CPU: the `vllm` backend on the tiny target gives, greedy, the same tokens as `hf`.

vLLM runs from its own venv (`make vllm-venv`); `make test-vllm` points FLASHDRAFT_VLLM_PYTHON at it.
"""


import pytest

from flashdraft.components.generate.generate import run_generate
from flashdraft.components.prep.prep import run_prep
from flashdraft.config import load_config
from flashdraft.run.records import iter_responses
from flashdraft.storage.store import open_store

pytestmark = pytest.mark.vllm


def test_vllm_greedy_matches_hf_token_for_token(vllm_python, tmp_path):
    results = {}
    for backend in ("hf", "vllm"):
        cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{tmp_path}/{backend}",
                                                    "generation.backend": backend})
        run_prep(cfg)
        done = run_generate(cfg, 0)
        assert done.backend == backend
        results[backend] = (done, list(iter_responses(open_store(cfg.storage, cfg.run_id), 0)))
    (hf_done, hf_rows), (vllm_done, vllm_rows) = results["hf"], results["vllm"]
    assert hf_done.turns > hf_done.samples, "the shard should include multi-turn prompts"
    assert len(vllm_rows) == len(hf_rows) == hf_done.samples
    for a, b in zip(hf_rows, vllm_rows, strict=True):
        assert a["sample_id"] == b["sample_id"]
        assert a["input_ids"] == b["input_ids"], f"sample {a['sample_id']} differs"
        assert (a["loss_mask"], a["finish_reason"]) == (b["loss_mask"], b["finish_reason"])
    assert vllm_done.generated_tokens == hf_done.generated_tokens
