"""Does training pay? The free alternatives (eval.baselines), decoded beside the trained drafter, and the verdict.

Each baseline is a Proposer (spec.py) decoded by the same speculative decoder on the same prompts, with the same
lossless check, at its own best k on this device (draft_length.py): `ngram` (prompt lookup, ngram.py), `published`
(drafter.init_from, the warm-start source, evaluated rather than quoted) and `mtp` (the target's own MTP head).
The verdict per suite is the decoder with the highest measured tokens/s among those whose outputs passed the
lossless check, the target alone included (no speculation is also an answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashdraft.config import RunConfig
from flashdraft.config.errors import ConfigError

from .ngram import NgramProposer
from .summary import BaselineResult, DecodeStats, EvaluateSummary, Verdict

NOT_SERVED = {"baseline"}  # the untrained drafter: a reference point, never an option to serve


def has_mtp_weights(cfg: RunConfig) -> bool:
    """Whether the target checkpoint ships a multi-token-prediction head (`mtp.*` tensors, Qwen3.5/3.6 layout),
    read from its safetensors index or header alone."""
    from flashdraft.target.model import resolve_model_dir
    from flashdraft.target.weights import tensor_names

    if cfg.eval.baselines is not None and "mtp" not in cfg.eval.baselines:
        return False  # not asked for: the checkpoint's index is not read
    try:
        names = tensor_names(resolve_model_dir(cfg.target), cfg.target.revision)
    except FileNotFoundError:  # no safetensors (a .bin checkpoint): no MTP head flashdraft can read
        return False
    return any(n.startswith("mtp.") for n in names)


def select_baselines(cfg: RunConfig, has_mtp: bool) -> tuple[list[str], list[str]]:
    """(the baselines to decode, one line per baseline that does not apply). eval.baselines None: every one that
    applies; a listed one that cannot apply is refused in one line naming the field (ConfigError)."""
    explicit = cfg.eval.baselines
    why: dict[str, str] = {}
    if not has_mtp:
        why["mtp"] = f"mtp: {cfg.target.model} ships no mtp.* weights (no MTP head to draft with)"
    if cfg.evaluate_only:
        why["published"] = "published: drafter.init_from is the drafter this evaluate-only run evaluates"
    elif not cfg.drafter.init_from:
        why["published"] = "published: no drafter.init_from (the published drafter to evaluate) is set"
    wanted = ["ngram", "published", "mtp"] if explicit is None else explicit
    if explicit is not None:
        for name in explicit:
            if name in why and not (name == "published" and cfg.evaluate_only):
                raise ConfigError(f"eval.baselines: {why[name]}")
    return [n for n in wanted if n not in why], [why[n] for n in wanted if n in why]


def build_proposers(cfg: RunConfig, names: Sequence[str], max_drafts: int, parent: Any | None,
                    model: Any) -> tuple[dict[str, Any], list[str]]:
    """(one Proposer per selected baseline, the ones refused while loading). `parent`: the loaded
    drafter.init_from drafter (`published`); `model`: the target, whose embedding, LM head and final norm the MTP
    head shares. An MTP head of a layout not built here is refused in one line: an error when eval.baselines
    names mtp, a note in the report when it was only a default."""
    from flashdraft.target.model import resolve_model_dir

    from .mtp import MtpError, load_mtp_proposer

    lo, hi = cfg.eval.prompt_lookup()
    made = {"ngram": lambda: NgramProposer(max_drafts, lo, hi), "published": lambda: parent,
            "mtp": lambda: load_mtp_proposer(model, resolve_model_dir(cfg.target), cfg.target.revision, max_drafts)}
    out, refused = {}, []
    for name in names:
        try:
            out[name] = made[name]()
        except MtpError as exc:
            if cfg.eval.baselines is not None:
                raise ConfigError(f"eval.baselines: {exc}") from None
            refused.append(str(exc))
    return out, refused


def speculative_config(name: str, proposer: Any, k: int) -> dict[str, Any] | None:
    """vLLM's speculative_config of a baseline at k (None: the drafter's, which names its export folder)."""
    if isinstance(proposer, NgramProposer):
        return proposer.speculative_config(k)
    if name == "mtp":
        return {"method": "mtp", "num_speculative_tokens": k}
    source = getattr(getattr(proposer, "parent", None), "source", None)
    return {"method": "dflash", "model": source, "num_speculative_tokens": k} if source else None


MTP_NOTE = ("the checkpoint's own MTP head, as shipped: on a randomly initialised test checkpoint its tau is "
            "meaningless, only its losslessness is")


def baseline_result(name: str, proposer: Any, k: int, full: DecodeStats | None, suites: Sequence[Any],
                    runs: Sequence[Any]) -> BaselineResult:
    """One baseline's record from the decoded suites (evaluate.SuiteRun): its k, full-block tau, and per suite
    its figures and whether its own outputs passed the lossless check (None: sampling, not checked)."""
    lossless = {s.name: (not any(m.drafter == name for m in r.lossless.mismatches)) if r.lossless.checked else None
                for s, r in zip(suites, runs, strict=True)}
    return BaselineResult(name=name, num_drafts=k, tau_full_block=full.tau if full else None,
                          speculative_config=speculative_config(name, proposer, k), lossless=lossless,
                          note=MTP_NOTE if name == "mtp" else None,
                          suites={s.name: r.decoders[name] for s, r in zip(suites, runs, strict=True)})


def _candidates(summary: EvaluateSummary, suite: str) -> dict[str, tuple[DecodeStats, int | None, float | None]]:
    """Every servable decoder of `suite` that passed the lossless check: (its figures, k, full-block tau)."""
    row = next(s for s in summary.suites if s.name == suite)
    dl = summary.draft_length
    out: dict[str, tuple[DecodeStats, int | None, float | None]] = {
        "target": (DecodeStats(tokens_per_s=row.target_tokens_per_s, speedup=1.0), None, None)}
    if row.lossless_passed is not False:
        out["drafter"] = (DecodeStats(tokens_per_s=row.drafter_tokens_per_s, speedup=row.speedup, tau=row.tau),
                          dl.num_drafts if dl else None, dl.full_block_tau if dl else None)
    for b in summary.baselines:
        if suite in b.suites and b.lossless.get(suite) is not False:
            out[b.name] = (b.suites[suite], b.num_drafts, b.tau_full_block)
    return out


def verdicts(summary: EvaluateSummary, drafter_config: dict[str, Any] | None) -> list[Verdict]:
    """Per suite: the fastest lossless decoder and its margin over the next (the target alone counts)."""
    configs = {b.name: b.speculative_config for b in summary.baselines} | {"drafter": drafter_config}
    out = []
    for row in summary.suites:
        cands = _candidates(summary, row.name)
        ranked = sorted(cands, key=lambda n: cands[n][0].tokens_per_s or 0.0, reverse=True)
        win, (stats, k, full) = ranked[0], cands[ranked[0]]
        second = ranked[1] if len(ranked) > 1 else None
        rate2 = cands[second][0].tokens_per_s if second else None
        margin = round(stats.tokens_per_s / rate2, 3) if stats.tokens_per_s and rate2 else None
        out.append(Verdict(suite=row.name, winner=win, tokens_per_s=stats.tokens_per_s, speedup=stats.speedup,
                           num_drafts=k, tau=stats.tau, tau_full_block=full, runner_up=second, margin=margin,
                           speculative_config=configs.get(win),
                           candidates={n: c[0].tokens_per_s for n, c in cands.items()}))
    return out
