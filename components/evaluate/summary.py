"""The evaluate stage's summary (metrics/evaluate.json): decoders, suites, the lossless check."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashdraft.drafter.identity import ParentIdentity
from flashdraft.run.stage import StageSummary, numbers
from flashdraft.target.model import same_model


class DecodeStats(BaseModel):
    """One decoder's figures over a suite's prompts (components/evaluate/evaluate.py summarize)."""

    model_config = ConfigDict(extra="allow")

    tokens: int = Field(0, description="tokens decoded")
    seconds: float = Field(0.0, description="decode seconds, summed over the prompts")
    tokens_per_s: float | None = Field(None, description="decode throughput")
    cycles: int | None = Field(None, description="verification cycles (speculative decoders)")
    accepted: int | None = Field(None, description="draft tokens accepted (vLLM's spec_decode_num_accepted_tokens)")
    tau: float | None = Field(None, description="tokens per verification cycle (speculative decoders)")
    block_size: int | None = Field(None, description="tokens verified per cycle (drafts + 1)")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    prompts: int | None = Field(None, description="prompts this decoder ran (the baseline: eval.baseline_prompts)")
    speedup: float | None = Field(None, description="tokens_per_s over the target alone's, same prompts")


class Mismatch(BaseModel):
    """A prompt whose speculative output differs from the target's own greedy output."""

    model_config = ConfigDict(extra="allow")

    drafter: str = Field(description="which decoder diverged: drafter or baseline")
    prompt_id: str = Field(description="the prompt")
    first_mismatch: int = Field(description="index of the first differing new token")
    reference_len: int = Field(description="new tokens of the target alone")
    speculative_len: int = Field(description="new tokens of the speculative decode")
    margin: float | None = Field(None, description="the target's top-1 minus top-2 logit at that token")
    tie: bool = Field(False, description="margin below eval.lossless_tie_margin: numerical noise can flip it")
    suite: str | None = Field(None, description="the eval suite of the prompt")


class LosslessCheck(BaseModel):
    model_config = ConfigDict(extra="allow")

    checked: bool = Field(description="greedy decoding, so the check ran")
    passed: bool = Field(description="speculative output equals the target's greedy output")
    prompts: int = Field(0, description="prompts compared")
    mismatches: list[Mismatch] = Field(default_factory=list, description="divergences beyond ties")
    ties: list[Mismatch] = Field(default_factory=list, description="divergences at numerical ties")
    tie_margin: float | None = Field(None, description="eval.lossless_tie_margin")


class PromptResult(BaseModel):
    """One decoded prompt: its size and each speculative decoder's tau on it."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="the prompt's id")
    source: str | None = Field(None, description="where the prompt came from")
    suite: str | None = Field(None, description="its eval suite")
    prompt_tokens: int = Field(description="prompt length")
    new_tokens: int = Field(description="tokens the target decoded")
    drafter_tau: float | None = None
    drafter_cycles: int | None = None
    drafter_accepted: int | None = None
    baseline_tau: float | None = Field(None, description="None where the baseline did not decode this prompt")
    baseline_cycles: int | None = None
    baseline_accepted: int | None = None


class PublishedFigure(BaseModel):
    """A published figure for the same suite (eval.reference; components/evaluate/reference.py)."""

    model_config = ConfigDict(extra="allow")

    label: str = Field(description="whose drafter, on which target")
    tau: float = Field(description="published acceptance length")
    speedup: float | None = Field(None, description="published speedup over the target alone")
    source: str | None = Field(None, description="where the figure comes from")
    thinking: bool | None = Field(None, description="thinking mode of the published run, when stated")
    target: str | None = Field(None, description="the target model of the published drafter")


class SuiteResult(BaseModel):
    """One row of the paper-layout table: one eval suite (components/evaluate/evaluate.py suite_row)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="suite name (eval.suites)")
    source: str | None = Field(None, description="heldout, humaneval or the URI")
    prompts: int | None = Field(None, description="prompts decoded")
    thinking: bool | None = Field(None, description="enable_thinking as rendered (None: the template's default)")
    max_new_tokens: int | None = Field(None, description="tokens decoded per prompt at most")
    tau: float | None = Field(None, description="the trained drafter's acceptance length")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    speedup: float | None = Field(None, description="speculative tokens/s over the target alone's, same prompts")
    target_tokens_per_s: float | None = Field(None, description="the target alone")
    drafter_tokens_per_s: float | None = Field(None, description="speculative decoding")
    lossless_passed: bool | None = Field(None, description="greedy outputs equal (None: sampling, not checked)")
    new_tokens: int | None = Field(None, description="tokens the target decoded over the suite")
    wall_seconds: float | None = Field(None, description="the suite's decoding wall time (all decoders, warm-up)")
    published: list[PublishedFigure] = Field(default_factory=list, description="published figures, same suite")


class DraftLengthPoint(BaseModel):
    """One number of draft tokens k on the evaluated device (components/evaluate/draft_length.py)."""

    num_drafts: int = Field(description="draft tokens per cycle k (the target verifies k + 1 tokens)")
    verify_ms: float = Field(description="the target's cached forward over k + 1 tokens, measured")
    draft_ms: float = Field(description="the drafter proposing k tokens, measured")
    expected_tokens: float | None = Field(None, description="1 + sum of the first k acceptance rates")
    expected_speedup: float | None = Field(None, description="expected_tokens x step_ms / (draft + verify)")
    measured_speedup: float | None = Field(None, description="decoded at this k: tokens/s over the target's")


class FullBlock(BaseModel):
    """eval.num_draft_tokens=auto: the headline suite decoded drafting the whole block, whose acceptance per
    position gives every k its expected tokens per cycle."""

    model_config = ConfigDict(extra="allow")

    tau: float | None = Field(None, description="tau drafting the whole block")
    acceptance_per_position: list[float] | None = Field(None, description="fraction accepted per draft position")
    tokens_per_s: float | None = Field(None, description="decode throughput drafting the whole block")
    cycles: int | None = Field(None, description="verification cycles")
    speedup: float | None = Field(None, description="tokens_per_s over the target alone's")


class DraftLength(BaseModel):
    """How many tokens evaluate drafted per cycle, and why (eval.num_draft_tokens; docs/evaluation.md)."""

    model_config = ConfigDict(extra="allow")

    mode: str = Field(description="auto (the best expected k) or fixed (eval.num_draft_tokens)")
    num_drafts: int = Field(description="k every suite was decoded with")
    block_size: int = Field(description="the drafter's block B (k <= B-1)")
    device_name: str | None = Field(None, description="where the costs were measured")
    step_ms: float | None = Field(None, description="the target's plain one-token step, measured")
    spread: float | None = Field(None, description="relative timing noise (MAD / median of the step plus the "
                                 "worst cycle): a longer k is chosen only when it is expected faster by more")
    curve: list[DraftLengthPoint] = Field(default_factory=list, description="every k = 1 .. B-1")
    tau: float | None = Field(None, description="headline suite's tau at k (the drafter row's)")
    speedup: float | None = Field(None, description="headline suite's measured speedup at k")
    expected_tokens: float | None = Field(None, description="the tokens per cycle the curve expected at k")
    full_block: FullBlock | None = Field(None, description="auto: the full-block pass over the headline suite")

    @property
    def full_block_tau(self) -> float | None:
        """tau drafting the whole block: auto's full-block pass, or the decode itself when k is B-1."""
        if self.full_block is not None:
            return self.full_block.tau
        return self.tau if self.num_drafts == self.block_size - 1 else None


class BaselineResult(BaseModel):
    """A free alternative to the trained drafter (eval.baselines: ngram, mtp, published), decoded on every suite by
    the same speculative decoder at its own best k (components/evaluate/baselines.py)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="ngram, mtp or published")
    num_drafts: int = Field(description="k it decoded every suite with (its best on this device, or the fixed k)")
    tau_full_block: float | None = Field(None, description="headline suite's tau drafting the longest k tried")
    speculative_config: dict[str, Any] | None = Field(None, description="what vLLM serves it with at k")
    note: str | None = Field(None, description="what its figures mean (e.g. random MTP weights: tau meaningless)")
    suites: dict[str, DecodeStats] = Field(default_factory=dict, description="its figures per suite")
    lossless: dict[str, bool | None] = Field(default_factory=dict, description="per suite: its outputs equal the "
                                             "target's (None: sampling, not checked)")


class Verdict(BaseModel):
    """Which decoder to serve for one suite: the highest measured tokens/s among those that passed the lossless
    check (the target alone included), and by how much it beat the next (components/evaluate/baselines.py)."""

    suite: str = Field(description="the eval suite")
    winner: str = Field(description="drafter (the trained one), ngram, mtp, published, or target (no speculation)")
    tokens_per_s: float | None = Field(None, description="the winner's measured tokens/s")
    speedup: float | None = Field(None, description="the winner's tokens/s over the target alone's")
    num_drafts: int | None = Field(None, description="the winner's k")
    tau: float | None = Field(None, description="the winner's tau at its k")
    tau_full_block: float | None = Field(None, description="the winner's headline tau drafting the whole block")
    runner_up: str | None = Field(None, description="the next fastest")
    margin: float | None = Field(None, description="winner tokens/s over the runner-up's (1.10 = 10% faster)")
    speculative_config: dict[str, Any] | None = Field(None, description="vLLM's speculative_config of the winner")
    candidates: dict[str, float | None] = Field(default_factory=dict, description="every candidate's tokens/s")

    def card_line(self) -> str:
        """The verdict without timings (the model card: the same evaluation gives the same card bytes)."""
        if self.winner == "target":
            return f"{self.suite}: the target alone (no speculative decoder measured faster)"
        return (f"{self.suite}: {self.winner} at k={self.num_drafts} (tau {_fmt(self.tau)}, full block "
                f"{_fmt(self.tau_full_block)}), the fastest lossless decoder measured")

    def line(self) -> str:
        """The verdict in one line (report, console, evaluate log)."""
        k = "" if self.num_drafts is None else f" at k={self.num_drafts} (tau {_fmt(self.tau)}, full block " \
            f"{_fmt(self.tau_full_block)})"
        margin = "" if self.runner_up is None else f"{_fmt(self.margin)}x the runner-up {self.runner_up}"
        if self.winner == "target":  # nothing measured faster than no speculation
            return (f"{self.suite}: serve the target alone (no speculation): {_fmt(self.tokens_per_s, '.1f')} "
                    f"tok/s, {margin}")
        return (f"{self.suite}: serve {self.winner}{k}: {_fmt(self.tokens_per_s, '.1f')} tok/s, "
                f"{_fmt(self.speedup)}x the target alone" + (f", {margin}" if margin else ""))


LOSSLESS_WORD = {True: "passed", False: "FAILED", None: "not checked"}


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


SUITE_TABLE_HEADER = ["suite", "prompts", "thinking", "tau", "acceptance per position", "speedup vs target",
                      "published tau"]


class EvaluateSummary(StageSummary):
    """components/evaluate/evaluate.py: metrics/evaluate.json."""

    HEADLINE: ClassVar[tuple[str, str] | None] = (
        "tau",
        "tau {tau:,.2f} at k={num_draft_tokens:,.0f} drafts (full block {tau_full_block:,.2f}; {baseline_label} "
        "{baseline_tau:,.2f}), lossless {lossless}")

    num_prompts: int | None = Field(None, description="held-out prompts decoded")
    max_new_tokens: int | None = Field(None, description="tokens decoded per prompt")
    temperature: float | None = Field(None, description="sampling temperature (0: greedy)")
    threads: int | None = Field(None, description="torch threads")
    layer_ids: list[int] | None = Field(None, description="target layers the drafter reads")
    target: DecodeStats | None = Field(None, description="the target alone")
    drafter: DecodeStats | None = Field(None, description="the trained drafter")
    baseline: DecodeStats | None = Field(None, description="an untrained drafter of the same shape")
    lossless: LosslessCheck | None = Field(None, description="the lossless check")
    prompts: list[PromptResult] = Field(default_factory=list, description="per-prompt figures, every suite")
    run_id: str | None = Field(None, description="the evaluated run")
    drafter_uri: str | None = Field(None, description="the evaluated checkpoint")
    baseline_init: str | None = Field(None, description="how the baseline was initialised (drafter.init): random "
                                      "or target (untrained), pretrained (the parent a run trained on from)")
    parent: ParentIdentity | None = Field(None, description="the pretrained drafter (drafter.init=pretrained): the "
                                          "one evaluated (evaluate only) or the baseline (trained on from)")
    evaluate_only: bool | None = Field(None, description="the pretrained drafter evaluated as is (no training)")
    host_cpus: int | None = Field(None, description="CPUs of the host (load makes CPU timings noisy)")
    host_load_1m: float | None = Field(None, description="the host's 1-minute load average after decoding")
    target_kernels: str | None = Field(None, description="the target's linear kernels: onednn-packed (CPU, multi-row "
                                       "forwards on pre-reordered weights; cpu_kernels.py) or stock")

    suites: list[SuiteResult] = Field(default_factory=list, description="one row per eval suite (paper layout)")
    draft_length: DraftLength | None = Field(None, description="drafts per cycle k and the curve it came from; "
                                             "every tau and speedup above is at this k")
    target_model: str | None = Field(None, description="the run's target.model: the suite table marks a published "
                                     "figure for another model as such")
    baselines: list[BaselineResult] = Field(default_factory=list, description="eval.baselines, decoded")
    baselines_refused: list[str] = Field(default_factory=list, description="baselines that do not apply, and why")
    verdicts: list[Verdict] = Field(default_factory=list, description="which to serve, per suite")

    def figures(self) -> dict[str, float]:
        """The headline (first suite) figures, and per suite `tau_<suite>`, `speedup_<suite>`,
        `acceptance_<k>_<suite>` (the KFP Metrics of the evaluate step and the status record)."""
        ll, drafter, target = self.lossless, self.drafter or DecodeStats(), self.target or DecodeStats()
        passed = (1.0 if ll.passed else 0.0) if ll and ll.checked else None
        out = numbers({"tau": drafter.tau, "baseline_tau": self.baseline.tau if self.baseline else None,
                       "target_tokens_per_s": target.tokens_per_s,
                       "speculative_tokens_per_s": drafter.tokens_per_s, "lossless_passed": passed,
                       "baseline_pretrained": 1.0 if self.baseline_init == "pretrained" else None})
        dl = self.draft_length
        if dl is not None:
            out.update(numbers({"num_draft_tokens": dl.num_drafts, "tau_full_block": dl.full_block_tau,
                                "speedup_full_block": dl.full_block.speedup if dl.full_block else None}))
        for b in self.baselines:  # trackers: each baseline at its own k beside its full-block tau
            out.update(numbers({f"{b.name}_num_draft_tokens": b.num_drafts, f"{b.name}_tau_full_block":
                                b.tau_full_block}))
            for name, d in b.suites.items():
                key = name.replace("-", "_").replace(".", "_")
                out.update(numbers({f"{b.name}_tau_{key}": d.tau, f"{b.name}_speedup_{key}": d.speedup}))
        for s in self.suites:
            key = s.name.replace("-", "_").replace(".", "_")
            out.update(numbers({f"tau_{key}": s.tau, f"speedup_{key}": s.speedup}))
            out.update({f"acceptance_{k + 1}_{key}": float(a) for k, a in enumerate(s.acceptance_per_position or [])})
        return out

    def lossless_line(self) -> str:
        """The lossless verdict in words (the model card and the report's verdict share it)."""
        ll = self.lossless
        if ll is None:
            return "not evaluated"
        if not ll.checked:
            return "not checked (sampling)"
        if ll.passed:
            ties = f", {len(ll.ties)} divergence(s) at numerical ties" if ll.ties else ""
            return f"passed on {ll.prompts} prompts{ties}"
        return f"FAILED on {len(ll.mismatches)} of {ll.prompts} prompts"

    @classmethod
    def headline_values(cls, figures: dict[str, float]) -> dict[str, Any]:
        lossless = {1.0: "passed", 0.0: "FAILED"}.get(figures.get("lossless_passed", -1.0), "not checked")
        label = "pretrained" if figures.get("baseline_pretrained") else "untrained"
        return {**figures, "lossless": lossless, "baseline_label": label}

    def suite_table(self, target: str | None = None) -> list[list[str]]:
        """The paper-layout table (header first), one row per suite, as the report, `flashdraft status` and the
        evaluate log show it. A published figure for another target than `target` (default: the run's, as
        evaluate recorded it) is marked so."""
        target = target if target is not None else self.target_model
        def num(v: float | None, spec: str = ".2f") -> str:
            return "-" if v is None else format(v, spec)

        def whose(p: PublishedFigure) -> str:
            return "" if target is None or same_model(p.target, target) else " [another model's]"

        rows = [list(SUITE_TABLE_HEADER)]
        for s in self.suites:
            published = "; ".join(f"{p.tau:.2f}" + (f" ({p.speedup:.2f}x)" if p.speedup else "") + f" {p.label}"
                                  + whose(p) for p in s.published)
            rows.append([s.name, num(s.prompts, "d"), {True: "on", False: "off"}.get(s.thinking, "default"),
                         num(s.tau), " ".join(f"{a:.2f}" for a in s.acceptance_per_position or []) or "-",
                         "-" if s.speedup is None else f"{s.speedup:.2f}x", published or "-"])
        return rows

    def decoder_table(self) -> list[list[str]]:
        """Every decoder on every suite side by side, each at its own k beside the full-block tau that compares
        across k (taus at different k do not compare). The baselines that did not apply are in `verdict_text`."""
        dl = self.draft_length
        k, full = (dl.num_drafts, dl.full_block_tau) if dl else (None, None)
        rows = [["suite", "decoder", "k", "tau at k", "full-block tau (headline suite)", "tokens/s", "speedup",
                 "lossless"]]
        for s in self.suites:
            rows.append([s.name, "pretrained drafter, as is" if self.evaluate_only else "trained drafter", _fmt(k, "d"),
                         _fmt(s.tau), _fmt(full), _fmt(s.drafter_tokens_per_s, ".1f"), _fmt(s.speedup),
                         LOSSLESS_WORD[s.lossless_passed]])
            if s is self.suites[0] and self.baseline is not None and self.baseline_init != "pretrained":
                b = self.baseline
                rows.append([s.name, f"untrained ({b.prompts} prompts)", _fmt(k, "d"), _fmt(b.tau), "-",
                             _fmt(b.tokens_per_s, ".1f"), _fmt(b.speedup), "-"])
            for b in self.baselines:
                d = b.suites.get(s.name)
                if d is not None:
                    rows.append([s.name, b.name, str(b.num_drafts), _fmt(d.tau), _fmt(b.tau_full_block),
                                 _fmt(d.tokens_per_s, ".1f"), _fmt(d.speedup), LOSSLESS_WORD[b.lossless.get(s.name)]])
        return rows

    def decoder_table_text(self) -> str:
        """`decoder_table` and the verdict as plain text (run-local's console)."""
        return "\n".join(filter(None, [_text(self.decoder_table()), self.verdict_text()]))

    def verdict_text(self) -> str:
        """Which to serve, one line per suite (the report, the console and the evaluate log end with it)."""
        if not self.verdicts:
            return ""
        refused = "".join(f"\n  ({line})" for line in self.baselines_refused)
        return "which to serve (highest measured tokens/s that passed the lossless check):\n" + "\n".join(
            f"  {v.line()}" for v in self.verdicts) + refused

    def status_detail(self) -> str:
        table = self.suite_table_text()
        return f"evaluation suites (metrics/evaluate.json):\n{table}" if table else ""

    def suite_table_text(self) -> str:
        """`suite_table` as aligned plain text (logs and terminals)."""
        return _text(self.suite_table())


def _text(rows: list[list[str]]) -> str:
    """A table (header first) as aligned plain text; "" when it has no rows."""
    if len(rows) == 1:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
