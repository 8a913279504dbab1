"""The model card (README.md) written into every export folder, so the folder a user serves says what it is:
Hugging Face model-card layout (YAML front matter, then Markdown) with the target and its revision, the drafter's
kind and geometry, the data and steps it was trained on, the per-suite evaluation with the lossless verdict, the
exact serve command, the flashdraft version and commit, and the license note.

Everything comes from the run's committed metrics (prep, extract, train, evaluate) and the drafter's own config; a
figure a stage did not leave (an export run by hand before evaluation) reads "not evaluated" instead.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from flashdraft.components.evaluate.draft_length import best_num_drafts, draft_length_curve, roofline_costs
from flashdraft.components.evaluate.summary import EvaluateSummary, Verdict
from flashdraft.components.plan.gpus import GPUS
from flashdraft.components.plan.rates import decode_weight_bytes
from flashdraft.components.prep.summary import PrepSummary
from flashdraft.components.train.summary import TrainSummary
from flashdraft.config import RunConfig
from flashdraft.drafter.zlab import MASK_PT, MASK_ST
from flashdraft.run.provenance import Provenance
from flashdraft.run.stage import StageSummary
from flashdraft.storage import layout
from flashdraft.storage.source import data_store, source_uri
from flashdraft.storage.store import ObjectStore

CARD_FILE = "README.md"


def local_folder(run_id: str, fmt: str) -> str:
    """Where `flashdraft export` (default --out) and `run-local` write a format's folder, relative to the
    working directory; the card's serve command names it."""
    return f"exports/{run_id}/{fmt}"


def _metrics(store: ObjectStore, name: str, model: type[StageSummary]) -> Any:
    key = layout.metrics_key(name)
    if not store.is_committed(key):
        return None
    try:
        return model.model_validate(store.get_json_verified(key))
    except Exception:  # noqa: BLE001 - a card without this figure beats no export
        return None


def extracted_tokens(store: ObjectStore) -> int | None:
    """Tokens whose hidden states the extract shards stored (their metrics summed); None when none did."""
    total = 0
    for key in store.list_committed(layout.METRICS + "/"):
        name = layout.metrics_name(key) or ""
        if name.startswith("extract-shard-"):
            try:
                total += int(store.get_json_verified(key).get("tokens") or 0)
            except Exception:  # noqa: BLE001
                continue
    return total or None


def serve_command(target: str, folder: str, fmt: str, g: dict[str, Any]) -> str:
    """The vLLM command that serves this export (the speculators folder names its own target)."""
    if fmt == "speculators":
        return f"vllm serve {folder}"
    spec = json.dumps({"method": "dflash", "model": folder, "num_speculative_tokens": g["block_size"] - 1})
    return f"vllm serve {target} \\\n  --speculative-config '{spec}' \\\n  --attention-backend flash_attn"


def _mask_row(g: dict[str, Any], files: dict[str, bytes]) -> str:
    """Where the mask embedding is, and why a pickle is (or is not) in the folder."""
    if not g.get("trainable_mask"):
        return f"the target's embedding of token {g['mask_token_id']}"
    where = f"trained embedding in {MASK_ST} (row {g['mask_token_id']} is the placeholder it replaces)"
    if MASK_ST not in files:  # the speculators format carries it in model.safetensors
        return where.replace(MASK_ST, "model.safetensors (`mask_embedding`)")
    if MASK_PT in files:
        return (f"{where}; also in {MASK_PT}, a torch pickle, because vLLM's DFlash loader reads a trained mask only "
                "from that file (export.mask_embedding_pt=true): load it only from a source you trust")
    return (f"{where}; no {MASK_PT} (a pickle, off by default): vLLM reads a trained mask only from it, so serve "
            "this folder with vLLM after re-exporting with export.mask_embedding_pt=true")


def served_config(v: Verdict, folder: str) -> dict[str, Any] | None:
    """vLLM's speculative_config of a suite's winner (the drafter's names this export folder; None: serve the
    target alone)."""
    if v.speculative_config is None:
        return None
    return {**v.speculative_config, "model": folder} if v.winner == "drafter" else v.speculative_config


def verdict_lines(ev: EvaluateSummary, folder: str) -> list[str]:
    """The card's 'Which to serve' section: per suite, the fastest lossless decoder measured, by how much, with
    its k beside the full-block tau, and the speculative_config vLLM serves it with, whichever it is."""
    if not ev.verdicts:
        return []
    device = ev.draft_length.device_name if ev.draft_length else ev.device
    lines = ["## Which to serve", "", "Per suite, the decoder with the highest tokens/s that `flashdraft evaluate` "
             f"measured on {device} (not necessarily your hardware: the run's report has the timings and margins) "
             "whose greedy output equalled the target's; the free alternatives (prompt lookup, the target's MTP "
             "head, the published drafter) were decoded by the same decoder on the same prompts, each at its best "
             "k there:", ""]
    for v in ev.verdicts:
        config = served_config(v, folder)
        lines += [f"- {v.card_line()}; vLLM: " + (f"`--speculative-config '{json.dumps(config)}'`" if config
                                                  else "no speculative decoding")]
    return [*lines, *(f"- ({line})" for line in ev.baselines_refused), ""]


def _geometry_rows(g: dict[str, Any], dtype: str, files: dict[str, bytes]) -> list[tuple[str, str]]:
    vocab = g["vocab_size"]
    rows = [("kind", g.get("kind", "dflash")),
            ("layers", f"{g['num_layers']} x hidden {g['hidden_size']} (heads {g['num_heads']} x {g['head_dim']}, "
                       f"KV heads {g['num_kv_heads']}, MLP {g['intermediate_size']})"),
            ("block size", f"{g['block_size']} (num_speculative_tokens {g['block_size'] - 1})"),
            ("target layers read", f"{list(g['target_layer_ids'])} of {g['num_target_layers']}"),
            ("attention", ", ".join(sorted(set(g.get("layer_types") or ["full_attention"])))
             + (f", window {g['sliding_window']}" if g.get("sliding_window") else "") + "; bidirectional in the block"),
            ("draft vocabulary", f"{g['draft_vocab_size']} of {vocab} target tokens (`d2t` and the drafter's own "
                                 f"`lm_head.weight` in model.safetensors)" if g.get("draft_vocab_size")
             else f"the target's {vocab} (embedding and LM head are the target's, not in this folder)"),
            ("mask", _mask_row(g, files)),
            ("tokenizer", f"the target's ({g.get('target', {}).get('model') or 'see base_model'}); none in this "
                          "folder: the server tokenizes with the target's"),
            ("weights dtype", dtype)]
    return rows


def _drafter_params(g: dict[str, Any]) -> float:
    """Weights one draft forward reads (modelled): its layers, the fusing projection of the target features and
    the LM head rows it scores."""
    h, q, kv = g["hidden_size"], g["num_heads"] * g["head_dim"], g["num_kv_heads"] * g["head_dim"]
    layer = h * (2 * q + 2 * kv) + 3 * h * g["intermediate_size"]
    head = (g.get("draft_vocab_size") or g["vocab_size"]) * h
    return g["num_layers"] * layer + len(g["target_layer_ids"]) * h * h + head


def _gpu_recommendations(cfg: RunConfig, g: dict[str, Any], acceptance: list[float]) -> list[dict[str, Any]]:
    """Per GPU type the planner knows (components/plan/gpus.py): the k of the highest expected speedup when its
    bf16 roofline, one sequence, prices every cycle (draft_length.roofline_costs). Modelled: none of these ran."""
    from flashdraft.components.plan.planner import planning_target

    try:
        target = planning_target(cfg)[2]
    except Exception:  # noqa: BLE001 - a target the planner cannot size: the card keeps the measured row
        return []
    step_bytes = decode_weight_bytes(target.params, target.active_params, target.experts or 0,
                                     target.experts_per_token or 0, 1)
    draft = _drafter_params(g)
    rows = []
    for gpu in GPUS.values():
        costs = roofline_costs(step_bytes, 2 * target.active_params, 2 * draft, 2 * draft, gpu.bandwidth_gbs,
                               gpu.bf16_tflops, g["block_size"] - 1)
        curve = draft_length_curve(costs, acceptance)
        rows.append({"device": gpu.name, "num_speculative_tokens": best_num_drafts(curve),
                     "basis": "modelled: planner roofline, bf16, one sequence"})
    return rows


def recommendations(cfg: RunConfig, g: dict[str, Any], ev: EvaluateSummary | None) -> list[dict[str, Any]]:
    """num_speculative_tokens to serve with: on the device evaluate ran on (its measured choice) and, modelled,
    on each GPU type the planner knows, both from the acceptance per position evaluate measured (the full-block
    pass under eval.num_draft_tokens=auto; a fixed k measured none beyond k, so no row exceeds it)."""
    dl = ev.draft_length if ev is not None else None
    if dl is None:
        return []
    rows = [{"device": dl.device_name or getattr(ev, "device", "this device"), "num_speculative_tokens": dl.num_drafts,
             "basis": f"measured by evaluate (eval.num_draft_tokens {dl.mode})"}]
    acceptance = (dl.full_block.acceptance_per_position if dl.full_block else None) or (
        ev.drafter.acceptance_per_position if ev.drafter else None) or []
    return rows + (_gpu_recommendations(cfg, g, acceptance) if acceptance else [])


def _recommendation_lines(recs: list[dict[str, Any]], block_size: int) -> list[str]:
    """The card's table of recommendations, without the timings behind them (those are the run's report's: the
    same evaluation gives the same card bytes); none without recommendations."""
    if not recs:
        return []
    rows = [["device", "num_speculative_tokens", "basis"]]
    rows += [[r["device"], str(r["num_speculative_tokens"]), r["basis"]] for r in recs]
    return ["## Draft length", "",
            f"The drafter drafts up to {block_size - 1} tokens a cycle; fewer can be faster where the verify "
            "forward's cost grows with its width (CPUs). vLLM drafts a shorter block of num_speculative_tokens + 1 "
            "slots, as flashdraft's evaluation did at the chosen k. Recommended `num_speculative_tokens`:", "",
            *_table(rows), ""]


def _table(rows: list[list[str]]) -> list[str]:
    head, *body = rows
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]


def eval_table(ev: EvaluateSummary, target: str) -> list[list[str]]:
    """The paper-layout table without timings (the card's bytes stay the same for the same evaluation), with each
    suite's lossless verdict."""
    rows = ev.suite_table(target)
    drop = rows[0].index("speedup vs target")
    out = [[c for i, c in enumerate(r) if i != drop] for r in rows]
    out[0].insert(4, "lossless")
    for row, s in zip(out[1:], ev.suites, strict=True):
        row.insert(4, {True: "passed", False: "FAILED"}.get(s.lossless_passed, "not checked"))
    return out


def features_source_lines(cfg: RunConfig) -> list[str]:
    """The card's line naming the run whose prompts, responses and features this drafter was trained on, when it
    is another run's (data.features_from); none otherwise."""
    uri = source_uri(cfg)
    return [f"- trained on the features of run `{uri}` (data.features_from: read in place, not recomputed)"] \
        if uri else []


def _target_weights(revision: str | None, provenance: Provenance) -> str:
    """Which target weights the drafter was trained and measured on: the run's pinned commit and weight digest."""
    asked = f"revision `{revision}`" if revision else "the default branch"
    commit = f"{asked} = commit `{provenance.target_sha}`" if provenance.target_sha else (
        f"revision `{revision}`" if revision else "a local folder or built target")
    digest = provenance.target_weights_sha256
    return commit + (f", weights sha256 `{digest}`" if digest else "")


def render_card(cfg: RunConfig, store: ObjectStore, g: dict[str, Any], fmt: str, dtype: str, step: int,
                final: bool, files: dict[str, bytes], provenance: Provenance) -> str:
    """README.md of one export folder (`files`: the folder's other files, listed with their sizes)."""
    target, revision = cfg.target.model, cfg.target.revision
    data = data_store(cfg)  # prompts and features: a data.features_from source's
    prep = _metrics(data, "prep", PrepSummary)
    train = _metrics(store, "train", TrainSummary)
    ev = _metrics(store, "evaluate", EvaluateSummary)
    tokens = extracted_tokens(data)
    parent = (train.parent if train else None) or (ev.parent if ev else None)
    folder = local_folder(cfg.run_id, fmt)
    recs = recommendations(cfg, g, ev)
    suites = {s.name: {k: v for k, v in (("tau", s.tau), ("prompts", s.prompts), ("lossless", s.lossless_passed))
                       if v is not None}
              for s in (ev.suites if ev else [])}
    meta = {
        "base_model": target,
        "library_name": "vllm",
        "pipeline_tag": "text-generation",
        "license": "other",
        "license_name": "same-as-base-model",
        "tags": ["speculative-decoding", g.get("kind", "dflash"), "draft-model", "flashdraft"],
        "flashdraft": {
            "version": provenance.flashdraft, "commit": provenance.commit, "run_id": cfg.run_id, "format": fmt,
            "target": {"model": target, "revision": revision, "source": cfg.target.source,
                       "commit": provenance.target_sha, "weights_sha256": provenance.target_weights_sha256},
            "drafter": {**{k: g.get(k) for k in ("kind", "num_layers", "hidden_size", "block_size",
                                                 "target_layer_ids", "draft_vocab_size", "trainable_mask",
                                                 "mask_token_id")}, "dtype": dtype},
            "training": {"step": step, "final": final, "tokens": train.tokens if train else None},
            "parent": parent.model_dump() if parent else None,
            "eval": {"suites": suites, "lossless": ev.lossless_line() if ev else "not evaluated",
                     "serve": {v.suite: served_config(v, folder) for v in ev.verdicts} if ev else {}},
            "num_speculative_tokens": recs,
        },
    }
    kind = "DFlash2" if g.get("kind") == "dflash2" else "DFlash"
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, width=1000).rstrip(), "---", "",
             f"# {kind} drafter for {target}", "",
             f"A {kind} speculative-decoding drafter (block size {g['block_size']}: it drafts "
             f"{g['block_size'] - 1} tokens per target forward) for `{target}` "
             f"({_target_weights(revision, provenance)}), "
             f"trained and exported by flashdraft {provenance.flashdraft} "
             f"(commit {provenance.commit or 'unknown'}), run `{cfg.run_id}`, {fmt} format.", "",
             "## Serve", "", "```bash", serve_command(target, folder, fmt, g), "```", "",
             f"`{folder}` is where `flashdraft export` and `run-local` write this folder (the run's store keeps the "
             f"same files under `export/{fmt}/`); point the command at wherever the folder is. Speculative decoding "
             "is lossless: greedy outputs are the target's own.", ""]
    if g.get("kind") == "dflash2":
        lines += ["vLLM serves DFlash2 on its GPU Model Runner V2 only.", ""]
    lines += ["## Drafter", "", *_table([["", ""], *[[a, b] for a, b in _geometry_rows(g, dtype, files)]]), ""]
    lines += _recommendation_lines(recs, g["block_size"])
    if parent is not None:
        rev = f", revision `{parent.revision}`" if parent.revision else ""
        what = ("evaluated as is, not trained here" if cfg.evaluate_only
                else f"trained on from it for {step} step{'' if step == 1 else 's'}")
        lines += ["## Parent", "", f"Started from `{parent.source}` ({parent.format} format{rev}, model.safetensors "
                  f"sha256 `{parent.sha256}`): {what}.", ""]
        if ev is not None and ev.baseline_init == "pretrained" and ev.baseline and ev.drafter:
            lines += [f"Held-out tau on the first suite: {ev.baseline.tau} before (the parent), {ev.drafter.tau} "
                      "after.", ""]
    if cfg.evaluate_only:
        lines += ["## Training", "", "None in this run (training.max_steps 0): the parent, re-exported.", ""]
        return _finish_card(lines, cfg, g, ev, target, files, folder)
    lines += ["## Training", ""]
    sources = ", ".join(f"`{s.uri}`" for s in cfg.data.sources)
    lines += [f"- prompts: {sources}; {prep.num_train if prep and prep.num_train is not None else 'unknown'} "
              f"train prompts, {prep.num_eval if prep and prep.num_eval is not None else 'unknown'} held out "
              "for evaluation",
              f"- {_responses_line(cfg)}; hidden states of "
              f"{f'{tokens:,}' if tokens is not None else 'an unknown number of'} tokens stored as "
              f"`{cfg.features.codec}`",
              f"- {step} optimizer step{'' if step == 1 else 's'}{'' if final else ' (training had not finished)'}"
              + (f", {train.tokens:,} tokens" if train and train.tokens else "")
              + (f", final loss {train.final.loss:.3f}" if train and train.final else ""),
              *features_source_lines(cfg), ""]
    return _finish_card(lines, cfg, g, ev, target, files, folder)


def _responses_line(cfg: RunConfig) -> str:
    """Where the training replies came from (data.responses): the target's own, or the dataset's."""
    if cfg.data.responses == "dataset":
        return ("responses: the dataset's own assistant turns, not generated (data.responses=dataset): the drafter "
                f"learned replies `{cfg.target.model}` did not write")
    return (f"responses generated by the target itself ({cfg.generation.backend}, temperature "
            f"{cfg.generation.temperature}), up to {cfg.data.max_response_tokens} tokens")


def _finish_card(lines: list[str], cfg: RunConfig, g: dict[str, Any], ev: EvaluateSummary | None, target: str,
                 files: dict[str, bytes], folder: str) -> str:
    """The card's evaluation, files and license sections after `lines`."""
    lines += ["## Evaluation", ""]
    if ev is None or not ev.suites:
        lines += ["Not evaluated before this export (`flashdraft evaluate`, then export again).", ""]
    else:
        lines += [f"flashdraft's own speculative decoder (greedy, up to {ev.max_new_tokens} new tokens); tau = tokens "
                  "per target forward, bonus token included; speed depends on the serving hardware, so the run's "
                  "report has it, not this card:", "", *_table(eval_table(ev, target)), "",
                  f"Lossless check: {ev.lossless_line()}.", "", *verdict_lines(ev, folder)]
    lines += ["## Files", "", *_table([["file", "bytes"], *[[f"`{n}`", f"{len(d):,}"] for n, d in files.items()],
                                        [f"`{CARD_FILE}`", "this card"]]), "",
              "## License", "",
              f"flashdraft is Apache-2.0. These weights were trained on `{target}`'s "
              + ("hidden states over the dataset's own replies" if cfg.data.responses == "dataset"
                 else "own outputs and hidden states")
              + (" and carry rows of its LM head" if g.get("draft_vocab_size") else "")
              + f": use and redistribute them under `{target}`'s license.", ""]
    return "\n".join(lines)


def card_meta(text: str) -> dict[str, Any]:
    """The YAML front matter of a card."""
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise ValueError(f"{CARD_FILE}: no YAML front matter between '---' lines")
    return yaml.safe_load(text[4: text.index("\n---\n", 4)])
