"""Prompt lookup on vLLM's own engine: flashdraft's `ngram` baseline proposes what vLLM's proposer proposes, and
vLLM's counters give the tau flashdraft measured on the same prompts and target (within 10%).

Both are greedy on the tiny target (fp32, one prompt at a time in vLLM), so the outputs are equal token for token;
tau may differ slightly only where the engines' cycles line up differently (vLLM skips drafting near the length
limit), hence the 10% bound the issue asks for rather than equality.
"""

from __future__ import annotations

import json
import random
import subprocess
import textwrap

import pytest

from flashdraft.components.evaluate import vllm_spec
from flashdraft.components.evaluate.evaluate import summarize
from flashdraft.components.evaluate.ngram import NgramProposer, lookup
from flashdraft.components.evaluate.spec import speculative_generate, target_generate
from flashdraft.config import load_config
from flashdraft.target.model import load_causal_lm, load_tokenizer, resolve_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
MAX_NEW, K, LOOKUP = 32, 4, (2, 4)

MATCHER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find
    cases = json.load(sys.stdin)
    print(json.dumps([find(np.array(s, dtype=np.int32), lo, hi, 10**6, k).tolist() for s, lo, hi, k in cases]))
""")


def test_lookup_proposes_what_vllms_ngram_proposer_proposes(vllm_python):
    rng = random.Random(0)
    cases = []
    for _ in range(20000):
        lo = rng.randint(1, 4)
        seq = [rng.randrange(rng.randint(2, 5)) for _ in range(rng.randint(1, 40))]
        cases.append((seq, lo, rng.randint(lo, 6), rng.randint(1, 8)))
    done = subprocess.run([vllm_python, "-c", MATCHER], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, check=True)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [lookup(s, lo, hi, k) for s, lo, hi, k in cases] == theirs


def test_vllm_ngram_tau_is_flashdrafts_within_ten_percent(vllm_python, tmp_path):
    cfg = load_config(preset="tiny")
    tok, model = load_tokenizer(cfg.target), load_causal_lm(cfg.target)
    texts = ["Repeat after me: the cat sat on the mat. The cat sat on the mat.", "Count: one two three one two three",
             "Write a Python function that adds two numbers and call it twice."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"] for t in texts]
    proposer = NgramProposer(K, *LOOKUP)
    refs = [target_generate(model, p, MAX_NEW, set()) for p in prompts]
    ours = [speculative_generate(model, proposer, p, [0], MAX_NEW, set(), num_drafts=K) for p in prompts]
    assert [g.tokens for g in ours] == [r.tokens for r in refs]
    tau = summarize(ours).tau
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    cmd = [vllm_python, str(vllm_spec.__file__), "--target",
           str(resolve_model_dir(cfg.target)), "--prompts", str(path), "--method", "ngram",
           "--num-speculative-tokens", str(K), "--prompt-lookup-min", str(LOOKUP[0]), "--prompt-lookup-max",
           str(LOOKUP[1]), "--max-new-tokens", str(MAX_NEW), "--dtype", "float32", "--max-model-len", "512"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"vllm_spec exited with {done.returncode} (its log is above)"
    vllm = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["ids"] for r in vllm["prompts"]] == [r.tokens for r in refs]
    assert vllm["drafts"] > 0 and tau > 1.0, (vllm, tau)
    drafting = [a for g in ours for a, n in zip(g.accepted, g.drafted, strict=True) if n]  # vLLM counts these
    like_vllm = 1 + sum(drafting) / len(drafting)
    assert vllm["tau"] == pytest.approx(like_vllm, rel=0.10), f"vLLM ngram tau {vllm['tau']} vs ours {like_vllm}"
