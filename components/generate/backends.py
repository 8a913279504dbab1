"""Generation backends: one call turns a batch of prompt token ids into replies (`chat.Reply`).

* `hf`: transformers in this process: continuous batching (continuous.py: finished rows leave, waiting prompts
  take their slots) or, for hybrid targets, `generate` over static length-sorted batches; greedy or sampling.
* `vllm`: offline `vllm.LLM` in worker subprocesses (see vllm_worker.py), one per data-parallel replica, each
  with `tensor_parallel` GPUs. The interpreter is `$FLASHDRAFT_VLLM_PYTHON` (a separate venv on CPU machines) or
  this one.

Both take token ids (the chat template is applied once, in chat.py), so the two backends see identical prompts.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

from flashdraft.config import RunConfig
from flashdraft.config.target import GenerationConfig
from flashdraft.target.chat import Reply

log = logging.getLogger(__name__)
VLLM_PYTHON_ENV = "FLASHDRAFT_VLLM_PYTHON"


def stop_token_ids(tok, generation_config=None) -> list[int]:
    """End-of-reply tokens: the tokenizer's EOS plus any the model's generation config adds."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    extra = getattr(generation_config, "eos_token_id", None)
    ids.update([extra] if isinstance(extra, int) else (extra or []))
    return sorted(ids)


def _to_reply(ids: list[int], stop_ids: list[int]) -> Reply:
    """Cut at the first stop token (kept: the target generated it)."""
    for n, t in enumerate(ids):
        if t in stop_ids:
            return Reply(ids=list(ids[: n + 1]), stopped=True)
    return Reply(ids=list(ids), stopped=False)


class HFBackend:
    """transformers in this process: continuous batching (continuous.py) for targets whose layers all keep a plain
    key/value cache, static batches through `generate` for the others (hybrid or sliding-window targets)."""

    name = "hf"

    def __init__(self, cfg: RunConfig, tok):
        import torch

        from flashdraft.target.model import load_causal_lm

        from .continuous import ContinuousDecoder, supports_slots
        from .cost import ForwardCost

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = load_causal_lm(cfg.generation.target(cfg.target), self.device)
        self.tok = tok
        self.cfg = cfg.generation
        self.max_new_tokens = cfg.data.max_response_tokens
        self.stop_ids = stop_token_ids(tok, _generation_config(cfg))
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.stop_ids[0]
        # FLOPs counted for the stage's share of this CPU's GEMM rate; none on a GPU (no figure invented there)
        self.cost = ForwardCost.of(self.model) if self.device == "cpu" else None
        self.decoder = None
        if supports_slots(self.model):
            self.decoder = ContinuousDecoder(self.model, self.cfg.batch_size, self.max_new_tokens, self.stop_ids,
                                             _warpers(self.cfg))

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[Reply]:
        if self.decoder is None:
            return generate_static(self.model, prompts, seeds, self.cfg, self.max_new_tokens, self.stop_ids,
                                   self.pad_id)
        return [_to_reply(ids, self.stop_ids) for ids in self.decoder.run(prompts, seeds).ids]

    def close(self) -> None:
        self.model = self.decoder = None


def _warpers(g: GenerationConfig):
    """The sampling warpers transformers `generate` applies, in its order (temperature, top-k, top-p); None for
    greedy."""
    if g.temperature <= 0:
        return None
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = [TemperatureLogitsWarper(g.temperature)]
    if g.top_k > 0:
        warpers.append(TopKLogitsWarper(g.top_k))
    if g.top_p < 1.0:
        warpers.append(TopPLogitsWarper(g.top_p))
    return LogitsProcessorList(warpers)


def generate_static(model, prompts: list[list[int]], seeds: list[int], g: GenerationConfig, max_new_tokens: int,
                    stop_ids: list[int], pad_id: int) -> list[Reply]:
    """transformers `generate` over length-sorted static batches of `g.batch_size`, left-padded: every row of a
    batch decodes until the batch's longest reply ends. The path for targets `ContinuousDecoder` cannot hold (and
    the baseline of benchmarks/bench_generate.py). Sampling seeds each batch with its first prompt's seed."""
    import torch
    from transformers import GenerationConfig as HFGenerationConfig

    sample = g.temperature > 0
    gen_cfg = HFGenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample,
                                 temperature=g.temperature if sample else None,
                                 top_p=g.top_p if sample else None,
                                 top_k=(g.top_k if g.top_k > 0 else 0) if sample else None,
                                 eos_token_id=stop_ids, pad_token_id=pad_id)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    replies: list[Reply | None] = [None] * len(prompts)
    for start in range(0, len(order), g.batch_size):
        batch = order[start:start + g.batch_size]
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):  # left padding: every prompt ends at the same column
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        if sample:
            torch.manual_seed(seeds[batch[0]])
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 generation_config=gen_cfg)
        for row, i in enumerate(batch):
            replies[i] = _to_reply(out[row, width:].tolist(), stop_ids)
    return replies  # type: ignore[return-value]


class VLLMBackend:
    name = "vllm"

    def __init__(self, cfg: RunConfig, tok, max_model_len: int):
        from flashdraft.target.model import load_hf_config, vllm_target_args

        self.cfg = cfg
        self.stop_ids = stop_token_ids(tok, _generation_config(cfg))
        python = os.environ.get(VLLM_PYTHON_ENV) or sys.executable
        g = cfg.generation
        init = {"target": vllm_target_args(cfg.target), "dtype": g.target(cfg.target).dtype, "seed": g.seed,
                "tensor_parallel": g.tensor_parallel, "max_model_len": g.max_model_len or max_model_len,
                "enable_prefix_caching": g.enable_prefix_caching}
        if cfg.target.source == "hf":
            load_hf_config(cfg.target)  # fail early, with the HF message, for a bad model id
        self.workers = []
        t0 = time.time()
        for rank in range(g.data_parallel):
            env = dict(os.environ)
            if g.data_parallel > 1:
                visible = env.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(64))).split(",")
                env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[rank * g.tensor_parallel:(rank + 1) * g.tensor_parallel])
            proc = subprocess.Popen([python, "-m", "flashdraft.components.generate.vllm_worker"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            proc.stdin.write(json.dumps(init) + "\n")
            proc.stdin.flush()
            self.workers.append(proc)
        for proc in self.workers:
            self._read(proc)
        self.startup_s = round(time.time() - t0, 2)
        log.info("vllm: %d worker(s) ready in %.1f s (%s)", len(self.workers), self.startup_s, python)

    def _read(self, proc: subprocess.Popen) -> dict:
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            raise RuntimeError(f"vllm worker exited with code {code} (its log is above, on stderr); on CPU set "
                               f"{VLLM_PYTHON_ENV} to a venv with vllm (make vllm-venv)")
        return json.loads(line)

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[Reply]:
        g = self.cfg.generation
        sampling = {"temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k,
                    "max_tokens": self.cfg.data.max_response_tokens, "stop_token_ids": self.stop_ids}
        n = len(self.workers)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        for rank, proc in enumerate(self.workers):  # send to every replica first, then collect
            part = slice(bounds[rank], bounds[rank + 1])
            proc.stdin.write(json.dumps({"prompts": prompts[part], "seeds": seeds[part], "sampling": sampling}) + "\n")
            proc.stdin.flush()
        replies: list[Reply] = []
        for proc in self.workers:
            replies += [_to_reply(out["ids"], self.stop_ids) for out in self._read(proc)["outputs"]]
        return replies

    def close(self) -> None:
        for proc in self.workers:
            if proc.stdin:
                proc.stdin.close()
        for proc in self.workers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.workers = []


def _generation_config(cfg: RunConfig):
    from transformers import GenerationConfig

    from flashdraft.target.model import pinned_dir, resolve_model_dir, target_revision

    revision = target_revision(cfg.target) if cfg.target.source == "hf" and pinned_dir(cfg.target) is None else None
    kwargs = {"revision": revision} if revision else {}
    try:
        return GenerationConfig.from_pretrained(resolve_model_dir(cfg.target), **kwargs)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        return None


def make_backend(cfg: RunConfig, tok, max_model_len: int):
    if cfg.generation.backend == "hf":
        return HFBackend(cfg, tok)
    return VLLMBackend(cfg, tok, max_model_len)
