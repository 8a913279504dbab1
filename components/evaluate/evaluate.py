"""`flashdraft evaluate`: how much the trained drafter buys, measured by really decoding prompts of every suite.

For every prompt of every suite (suites.py; loaded and checked before the model) the target decodes alone (the
reference output and plain tokens/s), then speculatively with the trained drafter; an untrained drafter of the
same architecture, the baseline, decodes the first suite only (its tau is ~1 anywhere). On a GPU at temperature 0
the target-alone half runs in batches of eval.target_batch (the reference tokens), except each suite's first
eval.timed_prompts, decoded one at a time for the single-stream tokens/s every speedup divides by; the drafters
decode one prompt at a time (single-stream speedup, as the paper measures it). `flashdraft plan` prices all of it
against the stage's timeout (components/plan/evaluate_plan.py). Metrics: tau (tokens
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
from dataclasses import asdict, dataclass

from flashdraft.components.evaluate.summary import (
    DecodeStats,
    DraftLength,
    DraftLengthPoint,
    EvaluateSummary,
    FullBlock,
    LosslessCheck,
    Mismatch,
    PromptResult,
    SuiteResult,
)
from flashdraft.config import RunConfig
from flashdraft.storage import layout
from flashdraft.storage.source import data_store
from flashdraft.storage.store import ObjectStore, io_counters, open_store

from .baselines import baseline_result, build_proposers, has_mtp_weights, select_baselines, verdicts
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
from .spec import (
    Generation,
    Proposer,
    greedy_accept,
    speculative_generate,
    target_generate,
    target_generate_batch,
)
from .suites import Suite, load_suites

log = logging.getLogger(__name__)
METRICS_KEY = layout.metrics_key("evaluate")


class LosslessError(RuntimeError):
    """Greedy speculative output differs from the target's own greedy output."""


def summarize(gens: Sequence[Generation]) -> DecodeStats:
    """tau, per-position acceptance and throughput over a set of generations (speculative or plain; a plain
    decode has no cycles, so no tau). tokens/s counts the generations decoded one at a time only (a batched one's
    seconds are its share of its batch, not a single-stream speed); None when every one was batched."""
    tokens = sum(len(g.tokens) for g in gens)
    seconds = sum(g.seconds for g in gens)
    alone = [g for g in gens if not g.batched]
    alone_s = sum(g.seconds for g in alone)
    tokens_per_s = round(sum(len(g.tokens) for g in alone) / alone_s, 3) if alone_s > 0 else None
    cycles = [a for g in gens for a in g.accepted]
    if not cycles:
        return DecodeStats(tokens=tokens, seconds=round(seconds, 4), tokens_per_s=tokens_per_s)
    block = max(g.block_size for g in gens)
    return DecodeStats(tokens=tokens, seconds=round(seconds, 4), tokens_per_s=tokens_per_s, cycles=len(cycles),
                       accepted=sum(cycles), tau=round(sum(a + 1 for a in cycles) / len(cycles), 4), block_size=block,
                       acceptance_per_position=[round(sum(a > k for a in cycles) / len(cycles), 4)
                                                for k in range(block - 1)])


def lossless_mismatches(prompts: Sequence[EvalPrompt], reference: Sequence[Generation],
                        candidate: Sequence[Generation], label: str, tie_margin: float = 0.0) -> list[Mismatch]:
    """One entry per prompt whose candidate tokens differ from the reference: the first differing index, the
    target's top-2 logit gap there, and `tie` when that gap is below `tie_margin` (numerical noise can flip it)."""
    bad = []
    for p, ref, got in zip(prompts, reference, candidate, strict=True):
        if ref.tokens != got.tokens:
            first = next((i for i, (a, b) in enumerate(zip(ref.tokens, got.tokens, strict=False)) if a != b),
                         min(len(ref.tokens), len(got.tokens)))
            margin = ref.margins[first] if first < len(ref.margins) else None
            bad.append(Mismatch(drafter=label, prompt_id=p.prompt_id, first_mismatch=first,
                                reference_len=len(ref.tokens), speculative_len=len(got.tokens),
                                margin=None if margin is None else round(margin, 6),
                                tie=margin is not None and margin < tie_margin))
    return bad


@dataclass
class SuiteRun:
    """One suite decoded by the target alone and by each drafter (`evaluate_prompts`)."""

    max_new_tokens: int
    target: DecodeStats
    decoders: dict[str, DecodeStats]   # drafter, and baseline where it ran
    lossless: LosslessCheck
    prompts: list[PromptResult]
    wall_seconds: float | None = None  # what the suite added to the stage, warm-up included

    @property
    def drafter(self) -> DecodeStats:
        return self.decoders["drafter"]


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
                     num_drafts: int | None = None, batch: int = 1,
                     draft_counts: dict[str, int] | None = None) -> SuiteRun:
    """Decode every prompt with the target alone and with each drafter; returns their figures (no I/O).

    `prompt_limits[name] = n`: that drafter decodes only the first n prompts (the untrained baseline); its
    speedup and lossless check compare it with the target on those same prompts. `max_new_tokens`: the suite's
    (default eval.max_new_tokens). `num_drafts`: drafts per cycle (None: the drafter's B-1); `draft_counts[name]`:
    that decoder's own k (a baseline at its best k). `batch` > 1 (greedy only): the target alone decodes the prompts
    past eval.timed_prompts that many at a time (`batched_reference`)."""
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
                                    accept=accept, num_drafts=(draft_counts or {}).get(name, num_drafts))

    # Warm-up (untimed): first-call allocations and kernel selection must not be billed to either decoder.
    for name in ["target", *drafters]:
        gen_for(name, prompts[0], tokens=warmup_tokens)
    limits = {name: len(prompts) for name in ["target", *drafters]} | (prompt_limits or {})
    timed = len(prompts) if batch <= 1 or temp > 0 else min(cfg.eval.timed_prompts, len(prompts))
    reference = batched_reference(model, tok, prompts[timed:], max_new, eos, batch)
    runs: dict[str, list[Generation]] = {name: [] for name in ["target", *drafters]}
    per_prompt: dict[str, list[DecodeStats]] = {name: [] for name in drafters}  # summarize() of each prompt
    for i, p in enumerate(prompts):
        for name in runs:
            if i < limits[name]:
                runs[name].append(reference[i - timed] if name == "target" and i >= timed else gen_for(name, p))
                if name in per_prompt:
                    per_prompt[name].append(summarize([runs[name][-1]]))
        log.info("prompt %s: %d prompt tokens, %d new; tau %s", p.prompt_id, len(p.input_ids),
                 len(runs["target"][-1].tokens),
                 {n: round(per_prompt[n][i].tau or 0, 2) for n in drafters if i < limits[n]})
    return SuiteRun(max_new_tokens=max_new, target=summarize(runs["target"]),
                    decoders={name: decoder_stats(runs[name], runs["target"]) for name in drafters},
                    lossless=lossless_check(cfg, prompts, runs),
                    prompts=[prompt_result(p, len(runs["target"][i].tokens), per_prompt, i)
                             for i, p in enumerate(prompts)])


def target_batch(cfg: RunConfig, device: str) -> int:
    """Prompts the target-alone decode runs at once: eval.target_batch on a GPU at temperature 0, else 1 (a CPU's
    decode gains nothing from batching, and sampling keeps one seeded generator a prompt)."""
    return cfg.eval.target_batch if device == "cuda" and cfg.eval.temperature == 0 else 1


def batched_reference(model, tok, prompts: Sequence[EvalPrompt], max_new: int, eos: set[int],
                      batch: int) -> list[Generation]:
    """The target's greedy outputs for `prompts`, `batch` at a time (spec.target_generate_batch); [] for none."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos, default=0)
    out: list[Generation] = []
    for at in range(0, len(prompts), batch):
        out += target_generate_batch(model, [p.input_ids for p in prompts[at:at + batch]], max_new, eos, pad)
    return out


def decoder_stats(gens: Sequence[Generation], target: Sequence[Generation]) -> DecodeStats:
    """A speculative decoder's figures, with its speedup over the target alone on the same (first) prompts."""
    stats = summarize(gens)
    same = summarize(target[: len(gens)])
    speedup = round(stats.tokens_per_s / same.tokens_per_s, 3) if same.tokens_per_s and stats.tokens_per_s else None
    return stats.model_copy(update={"prompts": len(gens), "speedup": speedup})


def lossless_check(cfg: RunConfig, prompts: Sequence[EvalPrompt], runs: dict[str, list[Generation]]) -> LosslessCheck:
    """Greedy decoding: every speculative output against the target's own, ties (a top-2 logit gap below
    eval.lossless_tie_margin) apart; sampling: not checked."""
    greedy, margin = cfg.eval.temperature == 0, cfg.eval.lossless_tie_margin
    diffs: list[Mismatch] = []
    for name, gens in runs.items():
        if greedy and name != "target":
            n = len(gens)
            diffs += lossless_mismatches(prompts[:n], runs["target"][:n], gens, name, margin)
    mismatches = [d for d in diffs if not d.tie]
    return LosslessCheck(checked=greedy, passed=greedy and not mismatches, prompts=len(prompts),
                         mismatches=mismatches, ties=[d for d in diffs if d.tie], tie_margin=margin)


def prompt_result(p: EvalPrompt, new_tokens: int, per_prompt: dict[str, list[DecodeStats]], i: int) -> PromptResult:
    """Prompt i's row: its size, and each drafter's tau, cycles and accepted drafts where it decoded it."""
    per = {f"{n}_{k}": getattr(stats[i], k) if i < len(stats) else None
           for n, stats in per_prompt.items() for k in ("tau", "cycles", "accepted")}
    return PromptResult(id=p.prompt_id, source=p.source, prompt_tokens=len(p.input_ids), new_tokens=new_tokens, **per)


def tune_draft_length(cfg: RunConfig, model, drafter: Proposer, prompts: Sequence[EvalPrompt], eos: set[int],
                      layer_ids: Sequence[int], block_size: int, max_new: int
                      ) -> tuple[int, CycleCosts, DecodeStats | None]:
    """(k to decode every suite with, this device's measured cycle costs, the full-block pass's `summarize`).

    The costs of every k are measured on the first prompt (draft_length.measure_cycle_costs). A fixed
    eval.num_draft_tokens is used as is (no full-block pass). `auto` first decodes `prompts` (the headline suite)
    drafting the whole block, the acceptance per position of which gives each k's expected tokens per cycle; the
    k of the highest expected speedup is chosen, or a shorter one within the timings' spread of it (the full block
    when no cycle ran)."""
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
    acceptance = full.acceptance_per_position or []
    k = best_num_drafts(draft_length_curve(costs, acceptance), costs.spread) if acceptance else block_size - 1
    log.info("evaluate: draft length %d of %d on %s (full-block tau %s, acceptance %s; expected speedup %s)", k,
             block_size - 1, device_name(next(model.parameters()).device), full.tau, acceptance,
             [p.expected_speedup for p in draft_length_curve(costs, acceptance)])
    return k, costs, full


def draft_length_record(k: int, block_size: int, costs: CycleCosts, full: DecodeStats | None,
                        headline: SuiteRun, device: str) -> DraftLength:
    """The curve of every k with its measured costs, expected speedup (from the full-block pass's acceptance, or
    under a fixed k from that run's, so only up to k) and measured speedup where one was decoded (the chosen k on
    the headline suite; under auto also the full block)."""
    acceptance = (full or headline.drafter).acceptance_per_position or []
    curve = [DraftLengthPoint(**asdict(p)) for p in draft_length_curve(costs, acceptance)]
    full_block = None
    if full is not None:
        target_tps = headline.target.tokens_per_s
        speedup = round(full.tokens_per_s / target_tps, 3) if target_tps and full.tokens_per_s else None
        curve[-1].measured_speedup = speedup
        full_block = FullBlock(tau=full.tau, acceptance_per_position=full.acceptance_per_position,
                               tokens_per_s=full.tokens_per_s, cycles=full.cycles, speedup=speedup)
    curve[k - 1].measured_speedup = headline.drafter.speedup
    return DraftLength(mode="auto" if full is not None else "fixed", num_drafts=k, block_size=block_size,
                       device_name=device_name(device), step_ms=round(costs.step_ms, 3), curve=curve,
                       spread=costs.spread,
                       tau=headline.drafter.tau, speedup=headline.drafter.speedup,
                       expected_tokens=round(expected_tokens(acceptance, k), 4) if acceptance else None,
                       full_block=full_block)


def suite_row(suite: Suite, run: SuiteRun, reference: list[dict]) -> SuiteResult:
    """One row of the paper-layout table from one suite's `evaluate_prompts` figures."""
    drafter = run.drafter
    return SuiteResult(name=suite.name, source=suite.source, prompts=len(suite.prompts), thinking=suite.thinking,
                       max_new_tokens=suite.max_new_tokens, tau=drafter.tau,
                       acceptance_per_position=drafter.acceptance_per_position, speedup=drafter.speedup,
                       target_tokens_per_s=run.target.tokens_per_s, drafter_tokens_per_s=drafter.tokens_per_s,
                       new_tokens=run.target.tokens, wall_seconds=run.wall_seconds,
                       lossless_passed=run.lossless.passed if run.lossless.checked else None,
                       published=published_for(reference, suite.name))


def combined_lossless(suites: Sequence[Suite], runs: Sequence[SuiteRun]) -> LosslessCheck:
    """One lossless verdict over every suite: each mismatch and tie tagged with its suite."""
    def tagged(attr: str) -> list[Mismatch]:
        return [m.model_copy(update={"suite": s.name}) for s, r in zip(suites, runs, strict=True)
                for m in getattr(r.lossless, attr)]

    first = runs[0].lossless
    return LosslessCheck(checked=first.checked, passed=all(r.lossless.passed for r in runs),
                         prompts=sum(r.lossless.prompts for r in runs), mismatches=tagged("mismatches"),
                         ties=tagged("ties"), tie_margin=first.tie_margin)


def _untrained_prompts(cfg: RunConfig, prompts: int, baselines: Sequence[str]) -> int:
    """Prompts of the first suite the `baseline` decoder (the untrained drafter, or the pretrained parent) decodes:
    none in an evaluate-only run or when the parent decodes every suite as the `published` baseline."""
    limit = cfg.eval.baseline_prompts
    if cfg.evaluate_only or limit == 0 or "published" in baselines:
        return 0
    if limit is None or cfg.drafter.init == "pretrained":  # a parent's tau is "before", on the prompts of "after"
        return prompts
    return min(limit, prompts)


def _decode_suites(cfg: RunConfig, model, tok, suites: Sequence[Suite], drafters: dict[str, Proposer],
                   untrained: Proposer | None, n_base0: int, layer_ids: Sequence[int],
                   draft_counts: dict[str, int], batch: int = 1) -> list[SuiteRun]:
    """Every suite decoded by the target alone, the drafter and each eval.baselines proposer at its own k; the
    untrained (or parent) baseline decodes the first `n_base0` prompts of the first suite. `batch`: the target-alone
    reference's batch on a GPU (evaluate_prompts)."""
    runs = []
    for i, suite in enumerate(suites):
        n_base = 0 if i else n_base0
        decoders = {**drafters, **({"baseline": untrained} if n_base else {})}
        t0 = time.perf_counter()
        run = evaluate_prompts(cfg, model, tok, suite.prompts, decoders, layer_ids, prompt_limits={"baseline": n_base},
                               max_new_tokens=suite.max_new_tokens, num_drafts=draft_counts["drafter"],
                               draft_counts=draft_counts, batch=batch)
        run.wall_seconds = round(time.perf_counter() - t0, 2)
        runs.append(run)
        log.info("evaluate: suite %s: tau %.3f, speedup %s; %s", suite.name, run.drafter.tau or 0,
                 run.drafter.speedup, {n: (d.tau, d.speedup) for n, d in run.decoders.items() if n != "drafter"})
    return runs


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
    chosen, refused = select_baselines(cfg, has_mtp_weights(cfg))  # a listed one that cannot apply: refused here
    model = target.causal_lm(device)
    kernels = pack_for_cpu(model) if device == "cpu" else "stock"  # both decoders run the same modules
    layer_ids = list(target.layer_ids)
    first = suites[0].prompts
    n_base0 = _untrained_prompts(cfg, len(first), chosen)
    trained, trained_uri, baseline = _load_drafters(cfg, store, tok, device,
                                                    baseline=n_base0 > 0 or "published" in chosen)
    eos = _eos_ids(tok, model)
    k, costs, full = tune_draft_length(cfg, model, trained, first, eos, layer_ids, block, suites[0].max_new_tokens)
    extras, unloaded = build_proposers(cfg, chosen, block - 1, baseline, model)
    refused += unloaded
    probe = first[: cfg.eval.baseline_prompts or len(first)]  # each baseline's full-block pass, for its own k
    tuned = {n: tune_draft_length(cfg, model, p, probe, eos, layer_ids, block, suites[0].max_new_tokens)
             for n, p in extras.items()}
    log.info("evaluate: suites %s, drafter %s, baselines %s, device %s, %d threads",
             ", ".join(f"{s.name} ({len(s.prompts)} prompts)" for s in suites), trained_uri,
             {n: t[0] for n, t in tuned.items()} or "none", device, torch.get_num_threads())
    runs = _decode_suites(cfg, model, tok, suites, {"drafter": trained, **extras}, baseline if n_base0 else None,
                          n_base0, layer_ids, {"drafter": k} | {n: t[0] for n, t in tuned.items()},
                          batch=target_batch(cfg, device))
    headline = runs[0]
    # Other processes on the host slow every decoder, not equally (batched GEMMs suffer most): record the load.
    parent = getattr(baseline if baseline is not None else trained, "parent", None)
    before = headline.decoders.get("published", headline.decoders.get("baseline"))
    summary = EvaluateSummary(
        num_prompts=len(first), max_new_tokens=headline.max_new_tokens, temperature=cfg.eval.temperature,
        device=str(next(model.parameters()).device), threads=torch.get_num_threads(), layer_ids=layer_ids,
        target=headline.target, drafter=headline.drafter, baseline=before,
        lossless=combined_lossless(suites, runs),
        suites=[suite_row(s, r, reference) for s, r in zip(suites, runs, strict=True)],
        prompts=[p.model_copy(update={"suite": s.name}) for s, r in zip(suites, runs, strict=True) for p in r.prompts],
        draft_length=draft_length_record(k, block, costs, full, headline, device), run_id=cfg.run_id,
        target_model=cfg.target.model, drafter_uri=trained_uri,
        baseline_init=None if baseline is None else cfg.drafter.init, host_cpus=os.cpu_count(),
        host_load_1m=round(os.getloadavg()[0], 2), store_io=io_counters(io0), target_kernels=kernels,
        parent=parent, evaluate_only=cfg.evaluate_only, baselines_refused=refused,
        baselines=[baseline_result(n, extras[n], tuned[n][0], tuned[n][2], suites, runs) for n in extras])
    summary.verdicts = verdicts(summary, {"method": "dflash", "num_speculative_tokens": k})
    ll = summary.lossless
    log.info("evaluate: tau %.3f (baseline %.3f); target %.1f tok/s, speculative %.1f tok/s; lossless %s\n%s\n%s",
             summary.drafter.tau or 0, summary.baseline.tau or 0 if summary.baseline else 0,
             summary.target.tokens_per_s or 0, summary.drafter.tokens_per_s or 0,
             ll.passed if ll.checked else "not checked (sampling)", summary.suite_table_text(),
             summary.decoder_table_text())
    if ll.mismatches:
        store.commit_json(METRICS_KEY, summary.dump())
        bad = ll.mismatches[0]
        ids = sorted({m.prompt_id for m in ll.mismatches})
        raise LosslessError(f"lossless check failed on prompt(s) {', '.join(ids)}: the {bad.drafter} "
                            f"speculative output diverges from the target's greedy output at token "
                            f"{bad.first_mismatch} of prompt {bad.prompt_id} (suite {bad.suite}); "
                            f"the target's top-2 logit gap there is {bad.margin}, not below "
                            f"eval.lossless_tie_margin={cfg.eval.lossless_tie_margin}")
    return summary
