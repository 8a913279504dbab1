"""What evaluation adds to the run report: the verdict's tau, lossless and speedup, the decoding tables, the
lossless check, and the tau and acceptance charts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from flashdraft.run.reporting import Chart, RunView, StageReport, fmt, png, pyplot
from flashdraft.target.model import same_model

if TYPE_CHECKING:
    from flashdraft.components.evaluate.summary import EvaluateSummary


def report(ev: EvaluateSummary | None, run: RunView) -> StageReport:
    if ev is None:
        absent = run.absent("evaluate")
        return StageReport(verdict=[f"not evaluated ({absent})"], sections=[("Speculative decoding", absent)])
    return StageReport(verdict=verdict(ev), flags=flags(ev), sections=sections(ev, run), scalars=scalars(ev),
                       charts=charts(ev, run))


def verdict(ev: EvaluateSummary) -> list[str]:
    """tau per suite, the lossless result, the speedup (and where it was measured)."""
    taus = [f"{s.name} {s.tau:.2f}" for s in ev.suites if s.tau is not None]
    if not taus and ev.drafter and ev.drafter.tau is not None:
        taus = [f"{ev.drafter.tau:.2f}"]
    speedup = ev.drafter.speedup if ev.drafter else None
    where = ", ".join(x for x in (ev.suites[0].name if ev.suites else None, ev.device) if x)
    dl = ev.draft_length
    if dl is not None:
        where += f", {dl.num_drafts} of {dl.block_size - 1} drafts a cycle"
    if dl is not None:
        where += f"; full-block tau {fmt(dl.full_block_tau)}"
    return [f"tau {', '.join(taus) or '-'}", f"lossless {ev.lossless_line()}",
            f"speedup {'-' if speedup is None else f'{speedup:.2f}x'} ({where})",
            *(f"serve: {v.line()}" for v in ev.verdicts)]


def flags(ev: EvaluateSummary) -> list[str]:
    if ev.lossless is not None and ev.lossless.checked and not ev.lossless.passed:
        return ["LOSSLESS CHECK FAILED: speculative output differs from the target's (Lossless check below)"]
    return []


def lossless_note(ev: EvaluateSummary) -> str:
    lossless = ev.lossless
    if lossless is None or not lossless.checked:
        return "not checked (sampling, temperature > 0)"
    if not lossless.passed:
        return "FAILED on " + ", ".join(f"{m.prompt_id} ({m.drafter}, token {m.first_mismatch})"
                                       for m in lossless.mismatches)
    note = f"PASSED: speculative greedy output equals the target's greedy output on all {lossless.prompts} prompts"
    if lossless.ties:
        note += (f" (except {len(lossless.ties)} divergence(s) at numerical ties, top-2 logit gap < "
                 f"{lossless.tie_margin}: " + ", ".join(t.prompt_id for t in lossless.ties) + ")")
    return note


def sections(ev: EvaluateSummary, run: RunView) -> list:
    target_rate = ev.target.tokens_per_s if ev.target else None
    rows = [["", "tau", "tokens/s", "speedup vs target"], ["target alone (greedy)", "-", fmt(target_rate), "1"]]
    pretrained = ev.baseline_init == "pretrained"
    labels = ("pretrained drafter, as is" if ev.evaluate_only else "trained drafter",
              "the pretrained parent (before)" if pretrained else "untrained baseline")
    for decoder, label in zip((ev.drafter, ev.baseline), labels, strict=True):
        if decoder is not None:
            rows.append([label, fmt(decoder.tau), fmt(decoder.tokens_per_s), fmt(decoder.speedup)])
    out = [("Speculative decoding", rows)]
    if ev.parent is not None:
        p = ev.parent
        out.append(("Pretrained parent", [["source", p.source], ["format", p.format],
                                          ["revision", p.revision or "-"], ["weights sha256", p.sha256],
                                          ["trained here", "no (evaluate only)" if ev.evaluate_only else "yes"]]))
    if ev.suites:
        out.append(("Per-suite results (paper layout)", ev.suite_table(run.target)))
    if ev.draft_length is not None:
        out.append(("Draft length", draft_length_table(ev)))
    if ev.baselines or ev.baselines_refused:
        out.append(("Baselines (eval.baselines)", ev.decoder_table()))
    out.append(("Lossless check", lossless_note(ev)))
    out.append(("Evaluation setup", [
        ["prompts", fmt(ev.num_prompts)], ["max new tokens", fmt(ev.max_new_tokens)],
        ["block size", fmt(ev.drafter.block_size if ev.drafter else None)], ["temperature", fmt(ev.temperature)],
        ["device", f"{ev.device} ({ev.threads} threads)"], ["target kernels", fmt(ev.target_kernels)],
        ["host", f"{fmt(ev.host_cpus)} CPUs, load average {fmt(ev.host_load_1m)} after decoding"],
        ["measured", "on this machine; a CPU speedup below 1 is reported as measured"]]))
    if ev.baselines_refused:
        out.append(("Baselines not decoded", "; ".join(ev.baselines_refused)))
    if ev.verdicts:  # the section ends with the answer
        out.append(("Which to serve", verdict_table(ev)))
    return out


def verdict_table(ev: EvaluateSummary) -> list[list[str]]:
    """Per suite: the fastest decoder that passed the lossless check, by how much, and vLLM's setting for it."""
    rows = [["suite", "serve", "k", "tau at k", "full-block tau", "tokens/s", "speedup", "over the runner-up",
             "vLLM speculative_config"]]
    for v in ev.verdicts:
        rows.append([v.suite, v.winner, fmt(v.num_drafts), fmt(v.tau), fmt(v.tau_full_block), fmt(v.tokens_per_s),
                     fmt(v.speedup), f"{fmt(v.margin)}x {v.runner_up}" if v.runner_up else "-",
                     json.dumps(v.speculative_config) if v.speculative_config else "none (the target alone)"])
    return rows


def draft_length_table(ev: EvaluateSummary) -> list[list[str]]:
    """The curve evaluate chose k from (draft_length.py): every k's measured costs, expected and measured
    speedup, and which tau is which."""
    dl = ev.draft_length
    rows = [["k drafts", "verify ms (k + 1 tokens)", "draft ms", "expected tokens/cycle", "expected speedup",
             "measured speedup"]]
    for p in dl.curve:
        rows.append([f"{p.num_drafts}{' (chosen)' if p.num_drafts == dl.num_drafts else ''}", fmt(p.verify_ms),
                     fmt(p.draft_ms), fmt(p.expected_tokens), fmt(p.expected_speedup), fmt(p.measured_speedup)])
    rows.append([f"{dl.mode}: measured on {dl.device_name}; target step {fmt(dl.step_ms)} ms; timing spread "
                 f"{fmt(dl.spread)} (a longer k only when expected faster by more)",
                 f"tau at k={dl.num_drafts}: {fmt(dl.tau)}",
                 f"tau at the full block ({dl.block_size - 1} drafts): {fmt(dl.full_block_tau)}", "", "", ""])
    return rows


def draft_length_chart(ev: EvaluateSummary) -> Chart | None:
    """Expected (line) and measured (points) speedup against the number of drafts k."""
    dl = ev.draft_length
    if dl is None or not dl.curve:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    expected = [(p.num_drafts, p.expected_speedup) for p in dl.curve if p.expected_speedup is not None]
    measured = [(p.num_drafts, p.measured_speedup) for p in dl.curve if p.measured_speedup is not None]
    if expected:
        ax.plot(*zip(*expected, strict=True), marker="o", color="#1f77b4", label="expected (measured costs)")
    if measured:
        ax.scatter(*zip(*measured, strict=True), color="#d62728", zorder=3, label="measured (decoded)")
    ax.axhline(1.0, color="#888888", linewidth=0.8)
    ax.axvline(dl.num_drafts, color="#2ca02c", linestyle="--", linewidth=1, label=f"chosen k={dl.num_drafts}")
    ax.set(xlabel="draft tokens per cycle k", ylabel="speedup vs target alone",
           title=f"Draft length on {dl.device_name}", xticks=[p.num_drafts for p in dl.curve])
    ax.legend(fontsize=7)
    return Chart("speedup against draft length", png(fig))


def scalars(ev: EvaluateSummary) -> dict[str, float]:
    drafter, baseline, target = ev.drafter, ev.baseline, ev.target
    out = {key: float(value) for key, value in (
        ("tau", drafter and drafter.tau), ("baseline_tau", baseline and baseline.tau),
        ("target_tokens_per_s", target and target.tokens_per_s),
        ("speculative_tokens_per_s", drafter and drafter.tokens_per_s), ("speedup", drafter and drafter.speedup))
        if value is not None}
    if ev.lossless is not None and ev.lossless.checked:
        out["lossless_passed"] = 1.0 if ev.lossless.passed else 0.0
    out.update({k: v for k, v in ev.figures().items() if k.startswith(("tau_", "speedup_", "acceptance_"))})
    return out


def charted_published(ev: EvaluateSummary, target: str | None) -> dict[str, list]:
    """Per suite, the published figures the tau chart draws: only those for this run's target (another model's tau
    is no yardstick for this drafter; the table lists it, marked as another model's)."""
    return {s.name: [p for p in s.published if same_model(p.target, target)] for s in ev.suites}


def charts(ev: EvaluateSummary, run: RunView) -> dict[str, Chart]:
    out: dict[str, Chart] = {}
    rows = [s for s in ev.suites if s.tau is not None]
    charted = charted_published(ev, run.target)
    if rows:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar([s.name for s in rows], [s.tau for s in rows], color="#1f77b4", label="this drafter")
        for i, s in enumerate(rows):
            ax.text(i, s.tau, f"{s.tau:.2f}", ha="center", va="bottom")
            for p in charted[s.name]:
                ax.plot([i - 0.4, i + 0.4], [p.tau, p.tau], color="#d62728", linewidth=1.5)
                # above its line, inside the suite's column (beside it, the label ran past the chart's edge)
                ax.text(i, p.tau, f"{p.tau:.2f} {p.label}", fontsize=7, ha="center", va="bottom", color="#d62728",
                        wrap=True)
        top = max([s.tau for s in rows] + [p.tau for s in rows for p in charted[s.name]])
        ax.set(ylabel="tau (tokens per cycle)", title="tau per suite (red: published figures for this target)",
               ylim=(0, top * 1.2))
        out["suite_tau"] = Chart("tau per suite", png(fig))
    decoders = [(n, d) for n, d in (("drafter", ev.drafter), ("baseline", ev.baseline))
                if d is not None and d.acceptance_per_position]
    if decoders:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.2))
        width = 0.8 / len(decoders)
        for i, (name, decoder) in enumerate(decoders):
            rates = decoder.acceptance_per_position
            ax.bar([k + 1 + (i - (len(decoders) - 1) / 2) * width for k in range(len(rates))], rates, width=width,
                   label="trained" if name == "drafter" else "untrained baseline")
        ax.set(xlabel="draft position k", ylabel="fraction of cycles accepted",
               title="Acceptance per draft position", ylim=(0, 1))
        ax.legend()
        out["acceptance"] = Chart("acceptance per position", png(fig))
        taus = [(("trained" if n == "drafter" else "untrained"), d.tau or 0) for n, d in decoders]
        fig, ax = plt.subplots(figsize=(4, 3.2))
        ax.bar([t[0] for t in taus], [t[1] for t in taus], color=["#1f77b4", "#aaaaaa"][: len(taus)])
        for i, (_, v) in enumerate(taus):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
        ax.set(ylabel="tau (tokens per cycle)", title="Acceptance length tau")
        out["tau"] = Chart("tau vs untrained baseline", png(fig))
    chart = draft_length_chart(ev)
    if chart is not None:
        out["draft_length"] = chart
    return out
