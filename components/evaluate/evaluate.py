"""`flashdraft evaluate`: how much the trained drafter buys, measured by really decoding prompts of every suite.

For every prompt of every suite (suites.py; loaded and checked before the model) the target decodes alone (the
reference output and plain tokens/s), then speculatively with the trained drafter; an untrained drafter of the
same architecture, the baseline, decodes the first suite only (its tau is ~1 anywhere). Metrics: tau (tokens
accepted per cycle, bonus included), per-position acceptance (vLLM's convention), tokens/s on this machine.
Greedy speculative outputs must equal the reference token for token: a mismatch fails the stage naming the
prompt, after the metrics (with the mismatch) are committed.

metrics/evaluate.json keeps the single-suite layout for the FIRST suite (the headline figures) and adds `suites`,
one row per suite in the paper's layout (docs/evaluation.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.config import RunConfig
from flashdraft.storage import layout
from flashdraft.storage.source import data_store
from flashdraft.storage.store import ObjectStore, io_counters, open_store

from .cpu_kernels import pack_for_cpu
from .draft_length import (
    CycleCosts,
    best_num_drafts,
    device_name,
    draft_length_curve,
    expected_tokens,
    measure_cycle_costs,
)
from .prompts import EvalPrompt
from .reference import load_reference, published_for
from .spec import Generation, Proposer, greedy_accept, speculative_generate, target_generate
from .suites import Suite, load_suites

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
    from flashdraft.storage import layout
    from flashdraft.storage.checkpoint import latest_checkpoint

    latest = latest_checkpoint(store)
    if latest is None:
        raise FileNotFoundError(f"no trained drafter: {store.url(layout.CHECKPOINT_LATEST)} is not committed; "
                                "run `flashdraft train` first")
    if not latest.get("final"):
        log.warning("evaluate: training has not finished; using its newest checkpoint %s", latest["prefix"])
    return latest["prefix"]


def _load_drafters(cfg: RunConfig, store: ObjectStore, tok, device: str,
                   baseline: bool = True) -> tuple[Proposer, str, Proposer | None]:
    """(the drafter to evaluate, its URI, the baseline; None when no prompt uses it). The drafter is the trained
    one (the latest checkpoint), or in an evaluate-only run the pretrained one as is (drafter.init_from). The
    baseline is the untrained drafter (same architecture, the trainer's own init seed, so the difference is
    exactly what training bought), or the pretrained parent a run trained on from (tau before and after); an
    evaluate-only run has none. Both keep the frozen embedding/LM head in the target checkpoint's dtype,
    memory-mapped (a full-width fp32 copy is 10 GB)."""
    from flashdraft.drafter.persistence import build_drafter, load_drafter
    from flashdraft.target.model import resolve_target

    def start() -> Proposer:  # what training starts from: seeded random, target layers, or the pretrained parent
        return build_drafter(cfg, resolve_target(cfg).hf_config(), init="random", seed=cfg.training.seed,
                             tokenizer=tok, device=device, frozen_dtype=None).eval()

    if cfg.evaluate_only:
        drafter = start()
        return drafter, drafter.parent.source, None
    prefix = trained_drafter_prefix(store)
    trained = load_drafter(store, prefix=prefix, target=cfg.target, device=device).eval()
    return trained, store.url(prefix), start() if baseline else None


def evaluate_prompts(cfg: RunConfig, model, tok, prompts: Sequence[EvalPrompt], drafters: dict[str, Proposer],
                     layer_ids: Sequence[int], accept: Callable = greedy_accept,
                     prompt_limits: dict[str, int] | None = None, max_new_tokens: int | None = None,
                     num_drafts: int | None = None) -> dict[str, Any]:
    """Decode every prompt with the target alone and with each drafter; returns the metrics dict (no I/O).

    `prompt_limits[name] = n`: that drafter decodes only the first n prompts (the untrained baseline); its
    speedup and lossless check compare it with the target on those same prompts. `max_new_tokens`: the suite's
    (default eval.max_new_tokens). `num_drafts`: drafts per cycle (None: the drafter's B-1)."""
    import torch

    max_new, temp = max_new_tokens or cfg.eval.max_new_tokens, cfg.eval.temperature
    eos = _eos_ids(tok, model)
    # Warm-up: a prefill and two decode/verify steps of each decoder reach every first-call allocation and kernel
    # choice; a longer one only doubles the stage at full width on a CPU (a 16-row verify there takes ~12 s).
    warmup_tokens = min(max_new, 3)

    def gen_for(name: str, p: EvalPrompt, tokens: int = max_new) -> Generation:
        generator = torch.Generator().manual_seed(cfg.generation.seed) if temp > 0 else None
        if name == "target":
            return target_generate(model, p.input_ids, tokens, eos, temp, generator)
        return speculative_generate(model, drafters[name], p.input_ids, layer_ids, tokens, eos, temp, generator,
                                    accept=accept, num_drafts=num_drafts)

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


def tune_draft_length(cfg: RunConfig, model, drafter: Proposer, prompts: Sequence[EvalPrompt], eos: set[int],
                      layer_ids: Sequence[int], block_size: int, max_new: int
                      ) -> tuple[int, CycleCosts, dict[str, Any] | None]:
    """(k to decode every suite with, this device's measured cycle costs, the full-block pass's `summarize`).

    The costs of every k are measured on the first prompt (draft_length.measure_cycle_costs). A fixed
    eval.num_draft_tokens is used as is (no full-block pass). `auto` first decodes `prompts` (the headline suite)
    drafting the whole block, the acceptance per position of which gives each k's expected tokens per cycle; the
    k of the highest expected speedup is chosen (the full block when no cycle ran)."""
    import torch

    costs = measure_cycle_costs(model, drafter, prompts[0].input_ids, layer_ids, block_size)
    fixed = cfg.eval.draft_tokens(block_size)
    if fixed is not None:
        return fixed, costs, None
    temp, gens = cfg.eval.temperature, []
    for p in prompts:
        generator = torch.Generator().manual_seed(cfg.generation.seed) if temp > 0 else None
        gens.append(speculative_generate(model, drafter, p.input_ids, layer_ids, max_new, eos, temp, generator))
    full = summarize(gens)
    acceptance = full.get("acceptance_per_position") or []
    k = best_num_drafts(draft_length_curve(costs, acceptance)) if acceptance else block_size - 1
    log.info("evaluate: draft length %d of %d on %s (full-block tau %s, acceptance %s; expected speedup %s)", k,
             block_size - 1, device_name(next(model.parameters()).device), full.get("tau"), acceptance,
             [p.expected_speedup for p in draft_length_curve(costs, acceptance)])
    return k, costs, full


def draft_length_record(k: int, block_size: int, costs: CycleCosts, full: dict[str, Any] | None,
                        headline: dict[str, Any], device: str) -> dict[str, Any]:
    """metrics["draft_length"] (summary.DraftLength): the curve of every k with its measured costs, expected
    speedup (from the full-block pass's acceptance, or under a fixed k from that run's, so only up to k) and
    measured speedup where one was decoded (the chosen k on the headline suite; under auto also the full block)."""
    acceptance = ((full or headline["drafter"]).get("acceptance_per_position")) or []
    curve = [{**asdict(p), "measured_speedup": None} for p in draft_length_curve(costs, acceptance)]
    target_tps = headline["target"].get("tokens_per_s")
    if full is not None and target_tps and full.get("tokens_per_s"):
        curve[-1]["measured_speedup"] = round(full["tokens_per_s"] / target_tps, 3)
        full = {key: full.get(key) for key in ("tau", "acceptance_per_position", "tokens_per_s", "cycles")}
        full["speedup"] = curve[-1]["measured_speedup"]
    curve[k - 1]["measured_speedup"] = headline["drafter"].get("speedup")
    return {"mode": "auto" if full is not None else "fixed", "num_drafts": k, "block_size": block_size,
            "device_name": device_name(device), "step_ms": round(costs.step_ms, 3), "curve": curve,
            "tau": headline["drafter"].get("tau"), "speedup": headline["drafter"].get("speedup"),
            "expected_tokens": round(expected_tokens(acceptance, k), 4) if acceptance else None,
            "full_block": full}


def suite_row(suite: Suite, metrics: dict[str, Any], reference: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the paper-layout table (summaries.SuiteResult) from one suite's `evaluate_prompts` metrics."""
    drafter, target = metrics["drafter"], metrics["target"]
    return {"name": suite.name, "source": suite.source, "prompts": len(suite.prompts), "thinking": suite.thinking,
            "max_new_tokens": suite.max_new_tokens, "tau": drafter.get("tau"),
            "acceptance_per_position": drafter.get("acceptance_per_position"), "speedup": drafter.get("speedup"),
            "target_tokens_per_s": target["tokens_per_s"], "drafter_tokens_per_s": drafter["tokens_per_s"],
            "new_tokens": target["tokens"], "wall_seconds": metrics.get("wall_seconds"),
            "lossless_passed": metrics["lossless"]["passed"] if metrics["lossless"]["checked"] else None,
            "published": published_for(reference, suite.name)}


def combine_suites(suites: Sequence[Suite], results: Sequence[dict[str, Any]],
                   reference: list[dict[str, Any]]) -> dict[str, Any]:
    """The first suite's metrics as the top level (the headline), every suite's row under `suites`, every
    suite's prompts (tagged with their suite) and one lossless verdict over all of them."""
    metrics = {k: v for k, v in results[0].items() if k != "wall_seconds"}
    metrics["suites"] = [suite_row(s, r, reference) for s, r in zip(suites, results, strict=True)]
    metrics["prompts"] = [{"suite": s.name, **p} for s, r in zip(suites, results, strict=True) for p in r["prompts"]]
    lossless = [r["lossless"] for r in results]
    mismatches = [{"suite": s.name, **m} for s, ll in zip(suites, lossless, strict=True) for m in ll["mismatches"]]
    metrics["lossless"] = {**lossless[0], "passed": all(ll["passed"] for ll in lossless),
                           "prompts": sum(ll["prompts"] for ll in lossless), "mismatches": mismatches,
                           "ties": [{"suite": s.name, **t} for s, ll in zip(suites, lossless, strict=True)
                                    for t in ll["ties"]]}
    return metrics


def run_evaluate(cfg: RunConfig) -> EvaluateSummary:
    """Evaluate the trained drafter (the latest checkpoint) on every suite against the target, and an untrained
    baseline on the first suite.

    The runner commits the result and decides about reuse (flashdraft/run/runner.py): a new checkpoint or changed
    `eval.*` settings evaluate again. Raises SuiteError / ReferenceError before loading the model on a missing or
    malformed suite or reference file, and LosslessError on a mismatch, after committing metrics/evaluate.json
    so the report shows where the outputs diverged."""
    import torch

    from flashdraft.target.model import resolve_target, set_cpu_threads

    io0 = io_counters()
    block = cfg.drafter.block_size  # a pretrained drafter's is checked against it when it loads (pretrained.py)
    cfg.eval.draft_tokens(block)  # a fixed eval.num_draft_tokens that does not fit the block: refused first
    store = open_store(cfg.storage, cfg.run_id)
    device = _device()
    set_cpu_threads(cfg, device)
    target = resolve_target(cfg)  # the model's own geometry and layer ids; contradicting settings refused here
    tok = target.tokenizer()
    suites = load_suites(cfg, data_store(cfg), tok)  # every suite read and checked before any model is loaded
    reference = load_reference(cfg.eval.reference, cfg.storage)
    model = target.causal_lm(device)
    kernels = pack_for_cpu(model) if device == "cpu" else "stock"  # both decoders run the same modules
    layer_ids = list(target.layer_ids)
    first = suites[0].prompts
    limit = cfg.eval.baseline_prompts
    if cfg.evaluate_only or limit == 0:  # the pretrained drafter as is has nothing to compare with
        n_base0 = 0
    elif limit is None or cfg.drafter.init == "pretrained":  # a parent's tau is "before", on the prompts of "after"
        n_base0 = len(first)
    else:
        n_base0 = min(limit, len(first))
    trained, trained_uri, baseline = _load_drafters(cfg, store, tok, device, baseline=n_base0 > 0)
    k, costs, full = tune_draft_length(cfg, model, trained, first, _eos_ids(tok, model), layer_ids, block,
                                       suites[0].max_new_tokens)
    log.info("evaluate: suites %s, drafter %s, device %s, %d threads",
             ", ".join(f"{s.name} ({len(s.prompts)} prompts)" for s in suites), trained_uri, device,
             torch.get_num_threads())
    results = []
    for i, suite in enumerate(suites):
        n_base = 0 if i else n_base0  # the untrained baseline decodes the first suite only
        drafters = {"drafter": trained, **({"baseline": baseline} if n_base else {})}
        t0 = time.perf_counter()
        results.append(evaluate_prompts(cfg, model, tok, suite.prompts, drafters, layer_ids,
                                        prompt_limits={"baseline": n_base}, max_new_tokens=suite.max_new_tokens,
                                        num_drafts=k))
        results[-1]["wall_seconds"] = round(time.perf_counter() - t0, 2)  # what this suite added to the stage
        row = results[-1]["drafter"]
        log.info("evaluate: suite %s: tau %.3f, speedup %s", suite.name, row.get("tau", 0), row.get("speedup"))
    metrics = combine_suites(suites, results, reference)
    metrics["draft_length"] = draft_length_record(k, block, costs, full, results[0], device)
    # Other processes on the host slow every decoder, not equally (batched GEMMs suffer most): record the load.
    parent = getattr(baseline if baseline is not None else trained, "parent", None)
    metrics.update(stage="evaluate", run_id=cfg.run_id, target_model=cfg.target.model, drafter_uri=trained_uri,
                   baseline_init=None if baseline is None else cfg.drafter.init, host_cpus=os.cpu_count(),
                   host_load_1m=round(os.getloadavg()[0], 2), store_io=io_counters(io0), target_kernels=kernels,
                   parent=parent.model_dump() if parent is not None else None,
                   evaluate_only=cfg.evaluate_only)
    summary = EvaluateSummary.model_validate(metrics)
    log.info("evaluate: tau %.3f (baseline %.3f); target %.1f tok/s, speculative %.1f tok/s; lossless %s\n%s",
             metrics["drafter"].get("tau", 0), metrics.get("baseline", {}).get("tau", 0),
             metrics["target"]["tokens_per_s"] or 0, metrics["drafter"]["tokens_per_s"] or 0,
             metrics["lossless"]["passed"] if metrics["lossless"]["checked"] else "not checked (sampling)",
             summary.suite_table_text())
    if metrics["lossless"]["mismatches"]:
        store.commit_json(METRICS_KEY, metrics)
        first = metrics["lossless"]["mismatches"][0]
        ids = sorted({m["prompt_id"] for m in metrics["lossless"]["mismatches"]})
        raise LosslessError(f"lossless check failed on prompt(s) {', '.join(ids)}: the {first['drafter']} "
                            f"speculative output diverges from the target's greedy output at token "
                            f"{first['first_mismatch']} of prompt {first['prompt_id']} (suite {first['suite']}); "
                            f"the target's top-2 logit gap there is {first['margin']}, not below "
                            f"eval.lossless_tie_margin={cfg.eval.lossless_tie_margin}")
    return summary
