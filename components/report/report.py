"""`flashdraft report`: one self-contained HTML page, a Markdown summary and a flat dict of scalars for a run.

Everything comes from what the stages committed to the run's store (metrics/*.json, the features prefix, the
trainer's checkpoints), so the report can be regenerated at any time with `flashdraft report --run RUN_URI`, and
it renders for a partial or failed run: a missing section says "not run" instead of failing. The outputs are
committed under reports/ and, for a KFP component, also written to local artifact paths.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

from flashdraft import layout, registry, status
from flashdraft.components.evaluate.summary import DecodeStats, EvaluateSummary, LosslessCheck, same_model
from flashdraft.components.export.summary import ExportSummary
from flashdraft.components.plan.summary import PlanSummary
from flashdraft.components.report.summary import ReportSummary
from flashdraft.components.train.summary import TrainSummary
from flashdraft.config import RunConfig
from flashdraft.provenance import Provenance
from flashdraft.provenance import current as current_provenance
from flashdraft.stage import numbers
from flashdraft.store import NotCommittedError, ObjectStore, open_store

log = logging.getLogger(__name__)
NOT_RUN = status.NOT_RUN
STATE_CODES = {"done": 1.0, "running": 0.5, NOT_RUN: 0.0, "failed": -1.0}  # <stage>_state in the Metrics


# -- gathering ------------------------------------------------------------------------------------------------


def stage_metrics(store: ObjectStore) -> dict[str, dict[str, Any]]:
    """Every committed metrics/<name>.json by name (e.g. "train", "extract-shard-00001"); unreadable files are
    reported in place of their content so one bad file cannot hide the rest."""
    out: dict[str, dict[str, Any]] = {}
    for key in store.list_committed(layout.METRICS + "/"):
        name = layout.metrics_name(key)
        if name is None:
            continue
        try:
            out[name] = store.get_json_verified(key)
        except Exception as exc:  # noqa: BLE001 - the report must render whatever else exists
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _stage_of(name: str) -> str:
    return name.split("-shard-", 1)[0]


def stored_features(store: ObjectStore, metrics: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What extraction actually left in the store: objects and bytes under features/, and bytes/token using the
    token count the extract shards reported (None where unknown)."""
    keys = store.list(layout.FEATURES + "/")
    if not keys:
        return None
    total = sum(store.size(k) for k in keys)
    tokens = sum(int(m.get("tokens", 0) or 0) for n, m in metrics.items() if _stage_of(n) == "extract")
    return {"objects": len(keys), "total_bytes": total, "tokens": tokens or None,
            "bytes_per_token": round(total / tokens, 1) if tokens else None}


def stored_codec(metrics: dict[str, dict[str, Any]]) -> str | None:
    """The codec(s) the extract shards stored their features with (from their metrics)."""
    names = {str((m.get("codec") or {}).get("name")) for n, m in metrics.items()
             if _stage_of(n) == "extract" and isinstance(m.get("codec"), dict) and m["codec"].get("name")}
    return ", ".join(sorted(names)) or None


def drafter_uris(store: ObjectStore) -> list[str]:
    """Exported drafter folders (export/<format>/, each committed by its manifest) and the newest checkpoint."""
    folders = set()
    for key in store.list_committed(layout.EXPORT + "/"):
        fmt = layout.export_format_of(key)
        if fmt is not None:
            folders.add(layout.export_prefix(fmt))
        elif key.count("/") >= 2:  # a run exported by an older flashdraft: a record beside every file
            folders.add(key.rsplit("/", 1)[0] + "/")
    uris = [store.url(f) for f in sorted(folders)]
    ckpts = sorted({k.rsplit("/", 1)[0] for k in store.list_committed(layout.CHECKPOINTS + "/")})
    if ckpts:
        uris.append(store.url(ckpts[-1]))
    return uris


def training_curves(train: TrainSummary | None) -> dict[str, Any]:
    """From metrics/train.json (the trainer's summary): loss per step, accuracy per block position per step, and
    the final (last-10%-of-steps) accuracy per position. Missing pieces are simply absent."""
    if train is None or not train.history:
        return {}
    rows = [r for r in train.history if isinstance(r.get("loss"), int | float)]
    out: dict[str, Any] = {}
    if rows:
        out["loss"] = [(r.get("step", i + 1), float(r["loss"])) for i, r in enumerate(rows)]
        with_acc = [r for r in rows if isinstance(r.get("acc_by_pos"), list)]
        if with_acc:
            out["accuracy_curves"] = {
                k + 1: [(r.get("step", i + 1), float(r["acc_by_pos"][k])) for i, r in enumerate(with_acc)]
                for k in range(len(with_acc[0]["acc_by_pos"]))}
    if train.final is not None:
        out["final_accuracy"] = [float(x) for x in train.final.acc_by_pos]
        out["final_loss"] = float(train.final.loss)
    points = [p for p in train.heldout if p.get("acc_by_pos")]
    if points:
        out["heldout"] = points  # {step, acc_by_pos, tau, blocks} every training.heldout_every steps
    return out


def ema(values: list[float], span: int) -> list[float]:
    """Exponential moving average with the pandas `span` convention (alpha = 2 / (span + 1)), bias-corrected so
    the first points are not pulled toward zero."""
    alpha, out, avg, weight = 2.0 / (span + 1), [], 0.0, 0.0
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def smoothing_span(points: int) -> int:
    """~1/25 of the curve, at least 5 steps: a 1200-step run averages ~50 steps, a 40-step one 5."""
    return max(5, points // 25)


def _summary(metrics: dict[str, dict[str, Any]], model: type[Any], stage: str) -> Any:
    """metrics/<stage>.json as its model; None when the stage left none (or an unreadable one)."""
    found = metrics.get(stage)
    return None if found is None or set(found) == {"error"} else model.model_validate(found)


def gather(store: ObjectStore, config: dict[str, Any] | None, run_over: bool = False) -> dict[str, Any]:
    """Everything the report shows. run_over: called as the run's exit handler, so a task whose record still says
    running died without recording an outcome and is shown failed."""
    metrics = stage_metrics(store)
    statuses = status.stage_statuses(status.read_records(store), metrics, run_over=run_over)
    stages = {s.stage: status.describe(s) for s in statuses}
    train: TrainSummary | None = _summary(metrics, TrainSummary, "train")
    plan: PlanSummary | None = _summary(metrics, PlanSummary, "plan")
    export: ExportSummary | None = _summary(metrics, ExportSummary, "export")
    # the export's provenance is the run's; a run not exported yet shows the reporting process's own
    provenance, source = (export.provenance, "export") if export and export.provenance else (current_provenance(),
                                                                                             "report")
    return {"run": store.root, "config": config, "metrics": metrics, "stages": stages, "statuses": statuses,
            "plan": plan, "stored": stored_features(store, metrics),
            "train_summary": train, "train": training_curves(train),
            "evaluate": _summary(metrics, EvaluateSummary, "evaluate"), "drafters": drafter_uris(store),
            "target": ((config or {}).get("target") or {}).get("model") or (plan.target if plan else None),
            "provenance": provenance, "provenance_source": source}


# -- the verdict ------------------------------------------------------------------------------------------------

# Held-out slot-1 accuracy below this fraction of training's is flagged: the drafter fits its training mix far
# better than unseen prompts (0.33 vs 0.63 on the 2026-12-04 SmolLM2 run is 0.52).
HELDOUT_GAP_FLAG = 0.75


def busy_seconds(statuses: list[status.StageStatus]) -> float | None:
    """Wall time the run's tasks took: the union of their [started, ended] intervals (overlapping streaming
    stages counted once; a reused task counts with its original run's interval, the idle gap between runs not)."""
    spans = sorted((t.started, t.ended) for s in statuses for t in s.tasks if t.ended is not None)
    if not spans:
        return None
    total, (start, end) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > end:
            total, start = total + end - start, a
        end = max(end, b)
    return round(total + end - start, 1)


def run_date(statuses: list[status.StageStatus]) -> str | None:
    """When the run's last task ended, UTC."""
    ends = [t.ended for s in statuses for t in s.tasks if t.ended is not None]
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(max(ends))) if ends else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:,.1f} s" if seconds < 120 else f"{seconds / 60:,.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:,.1f} h"


def verdict(data: dict[str, Any]) -> str:
    """The report's first line: tau per suite, lossless, speedup, wall time, date, commit."""
    from flashdraft.components.export.card import lossless_line

    ev: EvaluateSummary | None = data["evaluate"]
    prov: Provenance = data["provenance"]
    if ev is None:
        parts = [f"not evaluated ({_absent(data, 'evaluate')})"]
    else:
        taus = [f"{s.name} {s.tau:.2f}" for s in ev.suites if s.tau is not None]
        if not taus and ev.drafter and ev.drafter.tau is not None:
            taus = [f"{ev.drafter.tau:.2f}"]
        speedup = ev.drafter.speedup if ev.drafter else None
        parts = [f"tau {', '.join(taus) or '-'}", f"lossless {lossless_line(ev)}",
                 f"speedup {'-' if speedup is None else f'{speedup:.2f}x'}"
                 + f" ({', '.join(x for x in (ev.suites[0].name if ev.suites else None, ev.device) if x)})"]
    parts += [f"wall time {_duration(busy_seconds(data['statuses']))}", run_date(data["statuses"]) or "no date",
              f"flashdraft {prov.flashdraft} commit {prov.short_commit}"]
    return " | ".join(parts)


def projection(plan: PlanSummary | None) -> str | None:
    """For a run planned on GPU pools (a production target): the plan's GPU-hours per pool and bytes at rest for
    the whole planned dataset; None for a CPU run (no GPU-hours to project)."""
    if plan is None or not plan.gpu_hours:
        return None
    pools: dict[str, list[float | str]] = {}
    for name, est in plan.gpu_hours.items():
        hours = est.get("gpu_hours")
        if hours is None:
            continue
        try:
            pool = registry.current().get(name).pool
        except ValueError:
            pool = name
        entry = pools.setdefault(pool, [0.0, est.get("gpu") or "GPU"])
        entry[0] = float(entry[0]) + float(hours)
    if not pools:
        return None
    hours = ", ".join(f"{pool} pool {h:,.1f} GPU-hours ({gpu})" for pool, (h, gpu) in pools.items())
    at_rest = fmt_bytes(plan.total_bytes_at_rest) if plan.total_bytes_at_rest is not None else "-"
    return (f"{_fmt(plan.samples)} samples x {_fmt(plan.tokens_per_sample)} tokens: {hours}; {at_rest} of hidden "
            f"states at rest ({plan.codec}){'' if not plan.calibration else f'; rates from {plan.calibration}'}")


def flags(data: dict[str, Any]) -> list[str]:
    """What a reader should not miss: a lossless failure, held-out slot-1 accuracy far below training's."""
    out = []
    ev: EvaluateSummary | None = data["evaluate"]
    if ev is not None and ev.lossless is not None and ev.lossless.checked and not ev.lossless.passed:
        out.append("LOSSLESS CHECK FAILED: speculative output differs from the target's (Lossless check below)")
    train = data["train"]
    if train.get("final_accuracy") and train.get("heldout"):
        trained, held = train["final_accuracy"][0], (train["heldout"][-1].get("acc_by_pos") or [None])[0]
        if held is not None and trained > 0 and held < HELDOUT_GAP_FLAG * trained:
            out.append(f"held-out slot-1 accuracy {held:.2f} vs {trained:.2f} in training ({held / trained:.0%}): "
                       "the drafter fits its training mix far better than unseen prompts (more data, or fewer steps)")
    return out


# -- scalars (KFP Metrics artifact) -----------------------------------------------------------------------------


def scalar_metrics(data: dict[str, Any]) -> dict[str, float]:
    """Flat numbers for a KFP Metrics artifact; a section that did not run contributes nothing."""
    out: dict[str, float] = {}
    ev: EvaluateSummary | None = data["evaluate"]
    if ev is not None:
        drafter, baseline, target = ev.drafter, ev.baseline, ev.target
        for key, value in (("tau", drafter and drafter.tau), ("baseline_tau", baseline and baseline.tau),
                           ("target_tokens_per_s", target and target.tokens_per_s),
                           ("speculative_tokens_per_s", drafter and drafter.tokens_per_s),
                           ("speedup", drafter and drafter.speedup)):
            if value is not None:
                out[key] = float(value)
        if ev.lossless is not None and ev.lossless.checked:
            out["lossless_passed"] = 1.0 if ev.lossless.passed else 0.0
        out.update({k: v for k, v in ev.figures().items() if k.startswith(("tau_", "speedup_", "acceptance_"))})
    plan: PlanSummary | None = data["plan"]
    if plan is not None and plan.selected is not None:
        out["planned_bytes_per_token"] = float(plan.selected.bytes_per_token)
        out["planned_total_bytes"] = float(plan.selected.total_bytes)
    if data["stored"]:
        out["stored_total_bytes"] = float(data["stored"]["total_bytes"])
        out["stored_objects"] = float(data["stored"]["objects"])
        if data["stored"]["bytes_per_token"] is not None:
            out["stored_bytes_per_token"] = float(data["stored"]["bytes_per_token"])
    if "final_loss" in data["train"]:
        out["final_train_loss"] = data["train"]["final_loss"]
    if data["train"].get("heldout"):
        last = data["train"]["heldout"][-1]
        if last.get("tau") is not None:
            out["heldout_offline_tau"] = float(last["tau"])
        out.update({f"heldout_accuracy_{k + 1}": float(a) for k, a in enumerate(last["acc_by_pos"])})
    for s in data["statuses"]:  # every stage's state (1 done, 0.5 running, 0 not run, -1 failed) and figures
        name = s.stage.replace("-", "_")
        out[f"{name}_state"] = STATE_CODES[s.state]
        if s.duration_s is not None:
            out[f"{name}_duration_s"] = float(s.duration_s)
        out.update({f"{name}_{k}": float(v) for k, v in s.figures.items()})
    return out


# -- charts -----------------------------------------------------------------------------------------------------


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def charted_published(data: dict[str, Any]) -> dict[str, list[Any]]:
    """Per suite, the published figures the tau chart draws: only those for this run's target (another model's tau
    is no yardstick for this drafter; the table lists it, marked as another model's)."""
    ev: EvaluateSummary | None = data["evaluate"]
    return {s.name: [p for p in s.published if same_model(p.target, data["target"])]
            for s in (ev.suites if ev is not None else [])}


def charts(data: dict[str, Any]) -> dict[str, str]:
    """Base64 PNGs by name for the sections that have data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    train, ev = data["train"], data["evaluate"]
    if train.get("loss"):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        steps, losses = zip(*train["loss"], strict=True)
        span = smoothing_span(len(losses))
        ax.plot(steps, losses, color="#1f77b4", alpha=0.2, linewidth=0.8)  # raw, faint
        ax.plot(steps, ema(list(losses), span), color="#1f77b4", label=f"EMA (span {span})")
        ax.set(xlabel="optimizer step", ylabel="loss", title="Training loss (raw faint, EMA solid)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        out["train_loss"] = _png(fig)
    if train.get("accuracy_curves"):
        fig, ax = plt.subplots(figsize=(7, 3.8))
        curves, heldout = train["accuracy_curves"], train.get("heldout") or []
        colors = plt.get_cmap("viridis")
        for k, points in curves.items():
            color = colors((k - 1) / max(1, len(curves) - 1))
            steps, acc = zip(*points, strict=True)
            ax.plot(steps, acc, color=color, alpha=0.12, linewidth=0.6)
            ax.plot(steps, ema(list(acc), smoothing_span(len(acc))), color=color, label=f"k={k} train (EMA)")
            if heldout:
                ax.plot([p["step"] for p in heldout], [p["acc_by_pos"][k - 1] for p in heldout], color=color,
                        linestyle="--", marker="o", markersize=3, label=f"k={k} held-out")
        title = "Accuracy per block position: training (EMA over raw) vs held-out" if heldout else \
            "Training accuracy per block position (raw faint, EMA solid)"
        ax.set(xlabel="optimizer step", ylabel="accuracy", title=title, ylim=(0, 1))
        ax.legend(fontsize=6, ncol=4 if heldout else 2, loc="upper left")
        ax.grid(alpha=0.3)
        out["train_accuracy"] = _png(fig)
    taus = [p for p in train.get("heldout") or [] if p.get("tau") is not None]
    if taus:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([p["step"] for p in taus], [p["tau"] for p in taus], marker="o", color="#d62728",
                label="held-out offline tau")
        served = {s.name: s.tau for s in (ev.suites if ev is not None else []) if s.tau is not None}
        for i, (name, tau) in enumerate(served.items()):
            ax.axhline(tau, color=plt.get_cmap("tab10")(i), linestyle=":", label=f"served tau, {name}")
        ax.set(xlabel="optimizer step", ylabel="tau (tokens per cycle)",
               title="Held-out offline tau during training vs served tau")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        out["heldout_tau"] = _png(fig)
    rows = [s for s in (ev.suites if ev is not None else []) if s.tau is not None]
    charted = charted_published(data)
    if rows:
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
        out["suite_tau"] = _png(fig)
    decoders = {"drafter": ev.drafter, "baseline": ev.baseline} if ev is not None else {}
    rows = [(n, d) for n, d in decoders.items() if d is not None and d.acceptance_per_position]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        width = 0.8 / len(rows)
        for i, (name, decoder) in enumerate(rows):
            rates = decoder.acceptance_per_position
            ax.bar([k + 1 + (i - (len(rows) - 1) / 2) * width for k in range(len(rates))], rates, width=width,
                   label="trained" if name == "drafter" else "untrained baseline")
        ax.set(xlabel="draft position k", ylabel="fraction of cycles accepted",
               title="Acceptance per draft position", ylim=(0, 1))
        ax.legend()
        out["acceptance"] = _png(fig)
        taus = [(("trained" if n == "drafter" else "untrained"), d.tau or 0) for n, d in rows]
        fig, ax = plt.subplots(figsize=(4, 3.2))
        ax.bar([t[0] for t in taus], [t[1] for t in taus], color=["#1f77b4", "#aaaaaa"][: len(taus)])
        for i, (_, v) in enumerate(taus):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom")
        ax.set(ylabel="tau (tokens per cycle)", title="Acceptance length tau")
        out["tau"] = _png(fig)
    return out


# -- rendering --------------------------------------------------------------------------------------------------


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return str(n)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def throughput_rows(metrics: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(metrics file, key, value) for every rate a stage reported (keys ending in per_s, or naming a
    throughput), one level of nesting deep, e.g. evaluate's target.tokens_per_s."""
    return [(name, key, v) for name in sorted(metrics) for key, v in numbers(metrics[name], sep=".").items()
            if key.endswith("per_s") or "per_s_" in key or "throughput" in key]


def sections(data: dict[str, Any]) -> list[tuple[str, list[list[str]] | str]]:
    """The report's content as (title, table rows or a note), shared by the HTML and the Markdown output."""
    ev, plan, stored = data["evaluate"], data["plan"], data["stored"]
    out: list[tuple[str, list[list[str]] | str]] = [("Verdict", verdict(data))]
    if (projected := projection(plan)) is not None:
        out.append(("Projection for the planned dataset (plan)", projected))
    if warnings := flags(data):
        out.append(("Flags", "; ".join(warnings)))
    cfg = data["config"] or {}
    target = cfg.get("target", {})
    prov: Provenance = data["provenance"]
    out.append(("Run", [["run", data["run"]],
                        ["target", f"{target.get('model', '-')} ({target.get('source', '-')}, revision "
                                   f"{target.get('revision') or 'not pinned'})"],
                        ["date (last task ended)", run_date(data["statuses"]) or "-"],
                        ["wall time (tasks' busy time)", _duration(busy_seconds(data["statuses"]))],
                        [f"software ({'as exported' if data['provenance_source'] == 'export' else 'this report'})",
                         prov.line()]]))
    out.append(("Stages", [["stage", "state", "time", "figures"]] + [
        [s.stage, status.describe(s), "-" if s.duration_s is None else f"{s.duration_s:,.1f} s", s.headline or "-"]
        for s in data["statuses"]]))
    if ev is not None:
        target = ev.target or DecodeStats()
        rows = [["", "tau", "tokens/s", "speedup vs target"],
                ["target alone (greedy)", "-", _fmt(target.tokens_per_s), "1"]]
        for decoder, label in ((ev.drafter, "trained drafter"), (ev.baseline, "untrained baseline")):
            if decoder is not None:
                rows.append([label, _fmt(decoder.tau), _fmt(decoder.tokens_per_s), _fmt(decoder.speedup)])
        out.append(("Speculative decoding", rows))
        if ev.suites:
            out.append(("Per-suite results (paper layout)", ev.suite_table(data["target"])))
        lossless = ev.lossless or LosslessCheck(checked=False, passed=False)
        if not lossless.checked:
            note = "not checked (sampling, temperature > 0)"
        elif lossless.passed:
            note = (f"PASSED: speculative greedy output equals the target's greedy output on all "
                    f"{lossless.prompts} prompts")
            if lossless.ties:
                note += (f" (except {len(lossless.ties)} divergence(s) at numerical ties, top-2 logit gap < "
                         f"{lossless.tie_margin}: " + ", ".join(t["prompt_id"] for t in lossless.ties) + ")")
        else:
            note = "FAILED on " + ", ".join(f"{m['prompt_id']} ({m['drafter']}, token {m['first_mismatch']})"
                                           for m in lossless.mismatches)
        out.append(("Lossless check", note))
        out.append(("Evaluation setup", [
            ["prompts", _fmt(ev.num_prompts)], ["max new tokens", _fmt(ev.max_new_tokens)],
            ["block size", _fmt(ev.drafter.block_size if ev.drafter else None)],
            ["temperature", _fmt(ev.temperature)],
            ["device", f"{ev.device} ({ev.threads} threads)"],
            ["host", f"{_fmt(ev.host_cpus)} CPUs, load average {_fmt(ev.host_load_1m)} after decoding"],
            ["measured", "on this machine; a CPU speedup below 1 is reported as measured"]]))
    else:
        out.append(("Speculative decoding", _absent(data, "evaluate")))
    if plan or stored:
        selected = plan.selected if plan else None
        out.append(("Storage: planned vs stored", [
            ["", "planned", "stored"],
            ["codec", (plan.codec if plan else None) or "-", stored_codec(data["metrics"]) or "-"],
            ["bytes/token", _fmt(selected.bytes_per_token if selected else None),
             _fmt((stored or {}).get("bytes_per_token"))],
            ["total bytes", fmt_bytes(selected.total_bytes if selected else None),
             fmt_bytes((stored or {}).get("total_bytes"))],
            ["objects", _fmt(plan.objects if plan else None), _fmt((stored or {}).get("objects"))],
            ["tokens", _fmt(plan.total_tokens if plan else None), _fmt((stored or {}).get("tokens"))]]))
    else:
        out.append(("Storage: planned vs stored", f"plan and extract: {NOT_RUN}"))
    rates = throughput_rows(data["metrics"])
    out.append(("Per-stage throughput", [["metrics", "measure", "value"]] + [[a, b, _fmt(c)] for a, b, c in rates]
                if rates else f"no stage reported a throughput ({NOT_RUN})"))
    train = data["train"]
    if not train:
        out.append(("Training", _absent(data, "train") + " (no metrics/train.json with a loss history)"))
    else:
        summary: TrainSummary = data["train_summary"]
        rows = [["steps", _fmt(summary.steps)], ["tokens", _fmt(summary.tokens)],
                ["final loss (last 10% of steps)", _fmt(train.get("final_loss"))]]
        if train.get("final_accuracy"):
            rows.append(["final accuracy by position", " ".join(f"{a:.2f}" for a in train["final_accuracy"])])
        out.append(("Training", rows))
        if train.get("final_accuracy") and train.get("heldout"):
            out.append(("Training vs held-out accuracy per position", train_vs_heldout(train)))
    out.append(("Drafter", [[u] for u in data["drafters"]] if data["drafters"] else _absent(data, "export")))
    return out


def train_vs_heldout(train: dict[str, Any]) -> list[list[str]]:
    """Per block position: training accuracy (last 10% of steps) beside the held-out accuracy at the last
    held-out point; the held-out offline tau under them. A large gap is overfitting the training mix."""
    last = train["heldout"][-1]
    held = last["acc_by_pos"]
    rows = [["position k", "training (last 10% of steps)", f"held-out (step {last.get('step', '-')})"]]
    rows += [[str(k + 1), f"{a:.3f}", f"{held[k]:.3f}" if k < len(held) else "-"]
             for k, a in enumerate(train["final_accuracy"])]
    rows.append(["offline tau", "-", _fmt(last.get("tau"))])
    return rows


def _absent(data: dict[str, Any], stage: str) -> str:
    """The note of a section whose stage left no data: `train: not run`, or `train: failed (...)`."""
    state = next((s.state for s in data["statuses"] if s.stage == stage), NOT_RUN)
    return f"{stage}: failed (see Stages)" if state == "failed" else f"{stage}: {state}"


_CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}
th{background:#f3f3f3}.note{color:#555}tr.failed td{color:#b00020;font-weight:600}tr.not-run td{color:#888}
img{max-width:100%;margin:.5em 1em 1em 0}code{background:#f6f6f6}.verdict{font-size:1.1em;font-weight:600}
.flags{color:#b00020;font-weight:600}"""


def _html_table(rows: list[list[str]]) -> str:
    head, *body = rows if len(rows[0]) > 2 or rows[0][0] == "" else [None, *rows]
    parts = ["<table>"]
    if head:
        parts.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>")
    parts += [f"<tr{_row_class(r)}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body]
    return "".join(parts) + "</table>"


def _row_class(row: list[str]) -> str:
    """Stage rows: failed ones in red, not-run ones greyed (class names the state, for readers and tests)."""
    state = row[1] if len(row) > 1 else ""
    if state.startswith("failed"):
        return " class='failed'"
    return " class='not-run'" if state == NOT_RUN else ""


def render_html(data: dict[str, Any], images: dict[str, str]) -> str:
    chart_titles = {"tau": "tau vs untrained baseline", "acceptance": "acceptance per position",
                    "train_loss": "training loss", "train_accuracy": "training and held-out accuracy per position",
                    "heldout_tau": "held-out offline tau during training", "suite_tau": "tau per suite"}
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>flashdraft report</title>"
             f"<style>{_CSS}</style></head><body><h1>flashdraft run report</h1>"]
    for title, body in sections(data):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        note = {"Verdict": "verdict", "Flags": "flags"}.get(title, "note")  # the first line and warnings stand out
        parts.append(_html_table(body) if isinstance(body, list) else f"<p class='{note}'>{html.escape(body)}</p>")
    if images:
        parts.append("<h2>Charts</h2>")
        parts += [f"<img id='chart-{name}' alt='{html.escape(chart_titles.get(name, name))}' "
                  f"src='data:image/png;base64,{b64}'>" for name, b64 in images.items()]
    if data["config"]:
        parts.append("<h2>Config</h2><pre>" + html.escape(json.dumps(data["config"], indent=2)) + "</pre>")
    return "\n".join(parts) + "</body></html>\n"


def render_markdown(data: dict[str, Any]) -> str:
    lines = ["# flashdraft run report", ""]
    for title, body in sections(data):
        lines += [f"## {title}", ""]
        if isinstance(body, str):
            lines += [body, ""]
            continue
        head, *rest = body if len(body[0]) > 2 or body[0][0] == "" else [[""] * len(body[0]), *body]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rest] + [""]
    return "\n".join(lines)


# -- entry points -------------------------------------------------------------------------------------------------


def build_report(store: ObjectStore, config: dict[str, Any] | None = None,
                 out_dir: str | Path | None = None, run_over: bool = False) -> ReportSummary:
    """Render from the store's committed metrics and stage records, commit reports/{report.html,summary.md,
    metrics.json}; with `out_dir`, also write them there (KFP artifact paths). `config` defaults to the one stored
    by an earlier report run. run_over: see `gather`."""
    if config is None and store.is_committed(layout.REPORT_CONFIG):
        try:
            config = store.get_json_verified(layout.REPORT_CONFIG)
        except NotCommittedError:
            config = None
    elif config is not None:
        store.commit_json(layout.REPORT_CONFIG, config)
    data = gather(store, config, run_over)
    page, summary, scalars = render_html(data, charts(data)), render_markdown(data), scalar_metrics(data)
    store.commit(layout.REPORT_HTML, page.encode())
    store.commit(layout.REPORT_MARKDOWN, summary.encode())
    store.commit_json(layout.REPORT_SCALARS, scalars)
    result: dict[str, Any] = {"report_html": store.url(layout.REPORT_HTML),
                              "summary_md": store.url(layout.REPORT_MARKDOWN), "metrics": scalars,
                              "stages": data["stages"]}
    if out_dir is not None:
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.html").write_text(page)
        (folder / "summary.md").write_text(summary)
        (folder / "metrics.json").write_text(json.dumps(scalars, indent=2))
        result.update(html_path=str(folder / "report.html"), markdown_path=str(folder / "summary.md"))
    log.info("report: %s", result["report_html"])
    return ReportSummary.model_validate(result)


def run_report(cfg: RunConfig, out_dir: str | Path | None = None, run_over: bool = False) -> ReportSummary:
    """The pipeline's report step (also its exit handler): works whatever subset of stages has run."""
    return build_report(open_store(cfg.storage, cfg.run_id), cfg.model_dump(mode="json"), out_dir, run_over)
