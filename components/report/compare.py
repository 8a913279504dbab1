"""`flashdraft compare RUN_URI RUN_URI ...`: runs side by side, from what each committed to its store.

One row per run (target, drafter kind and parent, samples, steps, final loss, held-out and per-suite tau, speedup,
the lossless verdict, the GPU-hours its training took, the plan's cost) and the config keys whose values differ
between the runs; `--html` adds the training loss and held-out tau curves of every run on shared axes. It reads the
same typed summaries the report reads (`gather`), so a figure means the same thing in both. A run's report ends
with this table for the runs that trained on its features (`readers_sections`).
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Any

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.components.prep.summary import PrepSummary
from flashdraft.components.report.gather import gather, stored_config
from flashdraft.components.train.summary import TrainSummary
from flashdraft.run.reporting import RunView, Section, fmt, pyplot
from flashdraft.run.source import read_source, readers
from flashdraft.run.status import is_run
from flashdraft.storage import layout
from flashdraft.storage.store import ObjectStore, StoreError


@dataclass
class RunRow:
    """One run's figures for the comparison table (None: the run has no such figure yet)."""

    run: str
    target: str | None = None
    drafter: str | None = None
    parent: str | None = None
    samples: int | None = None
    steps: int | None = None
    final_loss: float | None = None
    heldout_tau: float | None = None
    num_drafts: int | None = None          # the k every tau of the run was decoded at
    tau_full_block: float | None = None    # the headline tau drafting the whole block: compares across runs' k
    suite_tau: dict[str, float | None] = field(default_factory=dict)
    baselines: dict[str, str] = field(default_factory=dict)  # eval.baselines: "tau @k (speedup)" on the headline
    serve: str = "-"                       # the verdict on the headline suite: which to serve, by how much
    speedup: float | None = None
    lossless: str = "-"
    plan_cost_usd: float | None = None
    train_gpu_hours: float | None = None  # the train stage's wall hours x the trainer pool's GPUs (0 on CPU)
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    tau_curve: list[tuple[int, float]] = field(default_factory=list)


def flat_config(config: dict[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """A run's stored config as dotted keys."""
    out: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if isinstance(value, dict) and value:
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _plan_cost(plan: PlanSummary | None) -> float | None:
    rows = plan.comparison.rows if plan is not None and plan.comparison is not None else []
    return next((r.total_cost_usd for r in rows if r.configured), None)


def _lossless(evaluated: EvaluateSummary | None) -> str:
    if evaluated is None or evaluated.lossless is None or not evaluated.lossless.checked:
        return "-"
    return "passed" if evaluated.lossless.passed else "FAILED"


def _baselines(evaluated: EvaluateSummary | None) -> dict[str, str]:
    """Each baseline's headline-suite tau at its own k, with its full-block tau and speedup."""
    if evaluated is None or not evaluated.suites:
        return {}
    first = evaluated.suites[0].name
    return {b.name: f"{fmt(b.suites[first].tau)} @k={b.num_drafts} (full {fmt(b.tau_full_block)}; "
                    f"{fmt(b.suites[first].speedup)}x)" for b in evaluated.baselines if first in b.suites}


def _serve(evaluated: EvaluateSummary | None) -> str:
    """The headline suite's verdict: the winner and its margin over the runner-up."""
    if evaluated is None or not evaluated.verdicts:
        return "-"
    v = evaluated.verdicts[0]
    return f"{v.winner} ({fmt(v.margin)}x {v.runner_up})" if v.runner_up else v.winner


def _train_gpu_hours(view: RunView, cfg: dict[str, Any]) -> float | None:
    """GPU-hours the run's training took: its train stage's wall time x the trainer GPUs of its config."""
    seconds = next((s.duration_s for s in view.statuses if s.stage == "train"), None)
    gpus = cfg.get("pools.trainer.accelerator_count")
    if seconds is None or gpus is None:
        return None
    return seconds / 3600 * gpus * (cfg.get("training.num_nodes") or 1)


def _prep(view: RunView) -> PrepSummary | None:
    """The run's prep figures: its own, or for a run on another run's features (data.features_from) its source's."""
    prep = view.summary("prep")
    if isinstance(prep, PrepSummary):
        return prep
    record = read_source(view.store)
    if record is None:
        return None
    try:
        source = view.store.at(record.source)
    except StoreError:  # a source on another scheme than this store's: not opened with these settings
        return None
    key = layout.metrics_key("prep")
    return PrepSummary.model_validate(source.get_json_verified(key)) if source.is_committed(key) else None


def run_row(view: RunView) -> RunRow:
    """The comparison's figures of one run."""
    cfg = flat_config(view.config)
    train, evaluated = view.summary("train"), view.summary("evaluate")
    prep, plan = _prep(view), view.summary("plan")
    train = train if isinstance(train, TrainSummary) else None
    evaluated = evaluated if isinstance(evaluated, EvaluateSummary) else None
    parent = (train.parent if train else None) or (evaluated.parent if evaluated else None)
    return RunRow(
        run=view.run, target=view.target, drafter=cfg.get("drafter.kind"),
        parent=getattr(parent, "source", None) or cfg.get("drafter.init_from"),
        samples=prep.num_train if prep is not None else None,
        steps=train.steps if train else None, final_loss=train.final.loss if train and train.final else None,
        heldout_tau=evaluated.drafter.tau if evaluated and evaluated.drafter else None,
        suite_tau={s.name: s.tau for s in evaluated.suites} if evaluated else {},
        num_drafts=evaluated.draft_length.num_drafts if evaluated and evaluated.draft_length else None,
        tau_full_block=evaluated.draft_length.full_block_tau if evaluated and evaluated.draft_length else None,
        baselines=_baselines(evaluated), serve=_serve(evaluated),
        speedup=evaluated.drafter.speedup if evaluated and evaluated.drafter else None,
        lossless=_lossless(evaluated), plan_cost_usd=_plan_cost(plan if isinstance(plan, PlanSummary) else None),
        train_gpu_hours=_train_gpu_hours(view, cfg),
        loss_curve=[(h["step"], h["loss"]) for h in (train.history if train else []) if "loss" in h],
        tau_curve=[(h["step"], h["tau"]) for h in (train.heldout if train else []) if h.get("tau") is not None])


@dataclass
class Comparison:
    rows: list[RunRow]
    differences: dict[str, list[Any]]  # config key -> each run's value, for keys that differ

    def suites(self) -> list[str]:
        return sorted({name for row in self.rows for name in row.suite_tau})

    def baseline_names(self) -> list[str]:
        return sorted({name for row in self.rows for name in row.baselines})

    def k_note(self) -> str:
        """Said under the table when the runs' taus were decoded at different k (they do not compare; the
        full-block tau does)."""
        ks = sorted({r.num_drafts for r in self.rows if r.num_drafts is not None})
        if len(ks) < 2:
            return ""
        return (f"note: the runs' taus are at different k ({', '.join(map(str, ks))} drafts a cycle, each run's "
                "best on its device) and do not compare; the full-block tau does")

    def table(self) -> list[list[str]]:
        """Header row, then one row per run: every tau at the run's k (in the column) beside the full-block tau."""
        suites, names = self.suites(), self.baseline_names()
        head = ["run", "target", "drafter", "parent", "samples", "steps", "final loss", "k", "held-out tau at k",
                "full-block tau", *[f"tau {s} at k" for s in suites], "speedup", "lossless",
                *[f"{n} tau at its k" for n in names], "serve", "train GPU-h", "plan cost $"]
        body = [[r.run, fmt(r.target), fmt(r.drafter), fmt(r.parent), fmt(r.samples), fmt(r.steps),
                 fmt(r.final_loss), fmt(r.num_drafts), fmt(r.heldout_tau), fmt(r.tau_full_block),
                 *[fmt(r.suite_tau.get(s)) for s in suites], fmt(r.speedup), r.lossless,
                 *[r.baselines.get(n, "-") for n in names], r.serve, fmt(r.train_gpu_hours), fmt(r.plan_cost_usd)]
                for r in self.rows]
        return [head, *body]

    def difference_table(self) -> list[list[str]]:
        return [["config key", *[f"run {i + 1}" for i in range(len(self.rows))]],
                *[[key, *[fmt(v) for v in values]] for key, values in self.differences.items()]]


# The run id and where it is stored differ between any two runs: not a difference of recipe.
SAME_BY_DESIGN = ("run_id", "storage.root")


def compare(stores: list[ObjectStore]) -> Comparison:
    """The comparison of the runs in `stores` (their committed metrics and the config their report stored)."""
    views = [gather(store, stored_config(store)) for store in stores]
    configs = [flat_config(v.config) for v in views]
    keys = sorted({k for c in configs for k in c} - set(SAME_BY_DESIGN))
    differences = {k: [c.get(k) for c in configs] for k in keys if len({repr(c.get(k)) for c in configs}) > 1}
    return Comparison([run_row(v) for v in views], differences)


def readers_sections(store: ObjectStore) -> list[Section]:
    """The runs that trained on this run's features (its readers/ records: a sweep's variants, a later
    `data.features_from` run) side by side as `flashdraft compare` shows them, then the config keys that differ
    between them: so a sweep's base report, its pipeline's exit handler, ends with the variants. A reader that has
    no run (yet) where its record says is named instead of compared."""
    found = readers(store)
    if not found:
        return []
    stores, absent = [], []
    for record in found:
        try:
            other = store.at(record.reader)
        except StoreError:
            other = None
        if other is not None and is_run(other):
            stores.append(other)
        else:
            absent.append(f"{record.run_id} ({record.reader})")
    title = "Runs trained on these features (data.features_from)"
    out: list[Section] = []
    if stores:
        comparison = compare(stores)
        out.append((title, comparison.table()))
        if comparison.k_note():
            out.append((f"{title}: draft lengths", comparison.k_note()))
        if len(stores) > 1:
            out.append((f"{title}: config keys that differ", comparison.difference_table()
                        if comparison.differences else "no config key differs"))
    if absent:
        out.append((title if not stores else f"{title}: not found", "no run found for " + ", ".join(absent)))
    return out


def render_text(comparison: Comparison) -> str:
    """The tables as aligned text (the terminal's view)."""
    out = []
    for table in (comparison.table(), comparison.difference_table()):
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
        out.append("")
    if not comparison.differences:
        out[-1] = "(no config key differs)"
    if comparison.k_note():
        out.insert(len(comparison.table()), comparison.k_note())
    return "\n".join(out).rstrip() + "\n"


def _curves_png(comparison: Comparison) -> str:
    """The loss and held-out tau curves of every run on shared axes, as a base64 PNG."""
    plt = pyplot()
    fig, (loss_ax, tau_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, row in enumerate(comparison.rows):
        label = f"run {i + 1}"
        if row.loss_curve:
            loss_ax.plot(*zip(*row.loss_curve, strict=True), label=label, linewidth=1)
        if row.tau_curve:
            tau_ax.plot(*zip(*row.tau_curve, strict=True), label=label, marker="o", markersize=3)
    loss_ax.set(title="training loss", xlabel="optimizer step", ylabel="loss")
    tau_ax.set(title="held-out tau (trainer's probe)", xlabel="optimizer step", ylabel="tau")
    for ax in (loss_ax, tau_ax):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _html_table(rows: list[list[str]]) -> str:
    head, *body = rows
    cells = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    lines = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><tr>{cells}</tr>{lines}</table>"


def render_html(comparison: Comparison) -> str:
    runs = "".join(f"<li>run {i + 1}: {html.escape(r.run)}</li>" for i, r in enumerate(comparison.rows))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>flashdraft compare</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
            "</style></head><body><h1>flashdraft compare</h1>"
            f"<ul>{runs}</ul>{_html_table(comparison.table())}<p>{html.escape(comparison.k_note())}</p>"
            "<h2>Config keys that differ</h2>"
            f"{_html_table(comparison.difference_table())}<h2>Curves</h2>"
            f"<img alt='loss and held-out tau curves' src='data:image/png;base64,{_curves_png(comparison)}'>"
            "</body></html>")
