"""`flashdraft evaluate`: how much the trained drafter buys, measured by really decoding on held-out prompts.

For every prompt the target first decodes alone (the reference output and the plain tokens/s), then
speculatively with the trained drafter, then with an untrained (randomly initialised) drafter as the baseline.
Metrics: tau (mean tokens accepted per cycle, bonus included), per-position acceptance (fraction of cycles whose
k-th draft token was accepted, vLLM's convention), tokens/s of each decoder as measured on this machine.
With greedy decoding, every speculative output must equal the reference token for token (lossless check);
a mismatch fails the stage naming the prompt, after the metrics (with the mismatch) are committed for the report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from flashdraft import layout
from flashdraft.config import RunConfig
from flashdraft.store import ObjectStore, io_counters, open_store
from flashdraft.summaries import EvaluateSummary

from .prompts import EvalPrompt, load_eval_prompts
from .spec import Generation, Proposer, greedy_accept, speculative_generate, target_generate

log = logging.getLogger(__name__)
METRICS_KEY = layout.metrics_key("evaluate")


class LosslessError(RuntimeError):
    """Greedy speculative output differs from the target's own greedy output."""


def summarize(gens: Sequence[Generation]) -> dict[str, Any]:
    """tau, per-position acceptance and throughput over a set of generations (speculative or plain)."""
    tokens = sum(len(g.tokens) for g in gens)
    seconds = sum(g.seconds for g in gens)
    out: dict[str, Any] = {"tokens": tokens, "seconds": round(seconds, 4),
                           "tokens_per_s": round(tokens / seconds, 3) if seconds > 0 else None}
    cycles = [a for g in gens for a in g.accepted]
    if cycles:
        out["cycles"] = len(cycles)
        out["accepted"] = sum(cycles)  # draft tokens accepted (vLLM's vllm:spec_decode_num_accepted_tokens)
        out["tau"] = round(sum(a + 1 for a in cycles) / len(cycles), 4)
        out["block_size"] = max(g.block_size for g in gens)
        out["acceptance_per_position"] = [round(sum(a > k for a in cycles) / len(cycles), 4)
                                          for k in range(out["block_size"] - 1)]
    return out


def lossless_mismatches(prompts: Sequence[EvalPrompt], reference: Sequence[Generation],
                        candidate: Sequence[Generation], label: str, tie_margin: float = 0.0) -> list[dict[str, Any]]:
    """One entry per prompt whose candidate tokens differ from the reference: the first differing index, the
    target's top-2 logit gap there, and `tie` when that gap is below `tie_margin` (numerical noise can flip it)."""
    bad = []
    for p, ref, got in zip(prompts, reference, candidate, strict=True):
        if ref.tokens != got.tokens:
            first = next((i for i, (a, b) in enumerate(zip(ref.tokens, got.tokens, strict=False)) if a != b),
                         min(len(ref.tokens), len(got.tokens)))
            margin = ref.margins[first] if first < len(ref.margins) else None
            bad.append({"drafter": label, "prompt_id": p.prompt_id, "first_mismatch": first,
                        "reference_len": len(ref.tokens), "speculative_len": len(got.tokens),
                        "margin": None if margin is None else round(margin, 6),
                        "tie": margin is not None and margin < tie_margin})
    return bad


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _eos_ids(tok, model) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    return {int(i) for i in ids}


def trained_drafter_prefix(store: ObjectStore) -> str:
    """The checkpoint folder the trainer's `checkpoints/latest.json` names (committed after all its files)."""
    from flashdraft import layout
    from flashdraft.checkpoint import latest_checkpoint

    latest = latest_checkpoint(store)
    if latest is None:
        raise FileNotFoundError(f"no trained drafter: {store.url(layout.CHECKPOINT_LATEST)} is not committed; "
                                "run `flashdraft train` first")
    if not latest.get("final"):
        log.warning("evaluate: training has not finished; using its newest checkpoint %s", latest["prefix"])
    return latest["prefix"]


def _load_drafters(cfg: RunConfig, store: ObjectStore, tok, device: str,
                   baseline: bool = True) -> tuple[Proposer, str, Proposer | None]:
    """(trained drafter, its URI, the untrained baseline: same architecture and the trainer's own init seed, so
    the difference is exactly what training bought; None when no prompt uses it). Both keep the frozen
    embedding/LM head in the target checkpoint's dtype, memory-mapped (a full-width fp32 copy is 10 GB)."""
    from flashdraft.drafter.model import DFlashDrafter, build_drafter
    from flashdraft.target import load_hf_config

    prefix = trained_drafter_prefix(store)
    trained = DFlashDrafter.from_pretrained(store, prefix=prefix, target=cfg.target, device=device).eval()
    untrained = build_drafter(cfg, load_hf_config(cfg.target), init="random", seed=cfg.training.seed,
                              tokenizer=tok, device=device, frozen_dtype=None).eval() if baseline else None
    return trained, store.url(prefix), untrained


def evaluate_prompts(cfg: RunConfig, model, tok, prompts: Sequence[EvalPrompt], drafters: dict[str, Proposer],
                     layer_ids: Sequence[int], accept: Callable = greedy_accept,
                     prompt_limits: dict[str, int] | None = None) -> dict[str, Any]:
    """Decode every prompt with the target alone and with each drafter; returns the metrics dict (no I/O).

    `prompt_limits[name] = n`: that drafter decodes only the first n prompts (the untrained baseline); its
    speedup and lossless check compare it with the target on those same prompts."""
    import torch

    max_new, temp = cfg.eval.max_new_tokens, cfg.eval.temperature
    eos = _eos_ids(tok, model)
    warmup_tokens = min(max_new, 2 * cfg.drafter.block_size)

    def gen_for(name: str, p: EvalPrompt, tokens: int = max_new) -> Generation:
        generator = torch.Generator().manual_seed(cfg.generation.seed) if temp > 0 else None
        if name == "target":
            return target_generate(model, p.input_ids, tokens, eos, temp, generator)
        return speculative_generate(model, drafters[name], p.input_ids, layer_ids, tokens, eos, temp, generator,
                                    accept=accept)

    # Warm-up (untimed): first-call allocations and kernel selection must not be billed to either decoder.
    for name in ["target", *drafters]:
        gen_for(name, prompts[0], tokens=warmup_tokens)
    limits = {name: len(prompts) for name in ["target", *drafters]} | (prompt_limits or {})
    runs: dict[str, list[Generation]] = {name: [] for name in ["target", *drafters]}
    per_prompt: dict[str, list[dict[str, Any]]] = {name: [] for name in drafters}  # summarize() of each run
    for i, p in enumerate(prompts):
        for name in runs:
            if i < limits[name]:
                runs[name].append(gen_for(name, p))
                if name in per_prompt:
                    per_prompt[name].append(summarize([runs[name][-1]]))
        log.info("prompt %s: %d prompt tokens, %d new; tau %s", p.prompt_id, len(p.input_ids),
                 len(runs["target"][-1].tokens),
                 {n: round(per_prompt[n][i].get("tau", 0), 2) for n in drafters if i < limits[n]})
    metrics: dict[str, Any] = {
        "num_prompts": len(prompts), "max_new_tokens": max_new, "temperature": temp,
        "device": str(next(model.parameters()).device), "threads": torch.get_num_threads(),
        "layer_ids": list(layer_ids), "target": summarize(runs["target"]),
    }
    for name in drafters:
        n = len(runs[name])
        metrics[name] = summarize(runs[name]) | {"prompts": n}
        same = summarize(runs["target"][:n])  # the target on the same prompts
        if same["tokens_per_s"] and metrics[name]["tokens_per_s"]:
            metrics[name]["speedup"] = round(metrics[name]["tokens_per_s"] / same["tokens_per_s"], 3)
    diffs: list[dict[str, Any]] = []
    if temp == 0:
        for name in drafters:
            n = len(runs[name])
            diffs += lossless_mismatches(prompts[:n], runs["target"][:n], runs[name], name,
                                         cfg.eval.lossless_tie_margin)
    mismatches = [d for d in diffs if not d["tie"]]
    metrics["lossless"] = {"checked": temp == 0, "passed": temp == 0 and not mismatches,
                           "prompts": len(prompts), "mismatches": mismatches,
                           "ties": [d for d in diffs if d["tie"]], "tie_margin": cfg.eval.lossless_tie_margin}
    metrics["prompts"] = [
        {"id": p.prompt_id, "source": p.source, "prompt_tokens": len(p.input_ids),
         "new_tokens": len(runs["target"][i].tokens),
         **{f"{n}_{k}": per_prompt[n][i].get(k) if i < len(per_prompt[n]) else None
            for n in drafters for k in ("tau", "cycles", "accepted")}}
        for i, p in enumerate(prompts)
    ]
    return metrics


def run_evaluate(cfg: RunConfig) -> EvaluateSummary:
    """Evaluate the trained drafter against the target and an untrained baseline (the latest checkpoint).

    The runner commits the result and decides about reuse (flashdraft/runner.py): a new checkpoint or changed
    `eval.*` settings evaluate again. Raises LosslessError on a mismatch, after committing metrics/evaluate.json
    so the report shows where the outputs diverged."""
    import torch

    from flashdraft.target import load_causal_lm, load_tokenizer, set_cpu_threads, target_num_layers

    io0 = io_counters()
    store = open_store(cfg.storage, cfg.run_id)
    device = _device()
    set_cpu_threads(cfg, device)
    tok = load_tokenizer(cfg.target)
    model = load_causal_lm(cfg.target, device)
    layer_ids = cfg.layer_ids(target_num_layers(cfg))
    prompts = load_eval_prompts(cfg, store, tok)
    n_base = len(prompts) if cfg.eval.baseline_prompts is None else min(cfg.eval.baseline_prompts, len(prompts))
    trained, trained_uri, baseline = _load_drafters(cfg, store, tok, device, baseline=n_base > 0)
    log.info("evaluate: %d prompts, drafter %s, device %s, %d threads", len(prompts), trained_uri, device,
             torch.get_num_threads())
    drafters = {"drafter": trained, **({"baseline": baseline} if n_base else {})}
    metrics = evaluate_prompts(cfg, model, tok, prompts, drafters, layer_ids, prompt_limits={"baseline": n_base})
    # Other processes on the host slow every decoder, not equally (batched GEMMs suffer most): record the load.
    metrics.update(stage="evaluate", run_id=cfg.run_id, drafter_uri=trained_uri, baseline_init="random",
                   host_cpus=os.cpu_count(), host_load_1m=round(os.getloadavg()[0], 2), store_io=io_counters(io0))
    log.info("evaluate: tau %.3f (baseline %.3f); target %.1f tok/s, speculative %.1f tok/s; lossless %s",
             metrics["drafter"].get("tau", 0), metrics.get("baseline", {}).get("tau", 0),
             metrics["target"]["tokens_per_s"] or 0, metrics["drafter"]["tokens_per_s"] or 0,
             metrics["lossless"]["passed"] if metrics["lossless"]["checked"] else "not checked (sampling)")
    if metrics["lossless"]["mismatches"]:
        store.commit_json(METRICS_KEY, metrics)
        first = metrics["lossless"]["mismatches"][0]
        ids = sorted({m["prompt_id"] for m in metrics["lossless"]["mismatches"]})
        raise LosslessError(f"lossless check failed on prompt(s) {', '.join(ids)}: the {first['drafter']} "
                            f"speculative output diverges from the target's greedy output at token "
                            f"{first['first_mismatch']} of prompt {first['prompt_id']}")
    return EvaluateSummary.model_validate(metrics)
