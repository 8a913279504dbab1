"""What training adds to the run report: loss and accuracy curves, the held-out curve against the served tau, the
training-vs-held-out table, and a flag when held-out accuracy falls far below training's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flashdraft.run.reporting import Chart, RunView, Section, StageReport, fmt, png, pyplot

if TYPE_CHECKING:
    from flashdraft.components.train.summary import TrainSummary

# Held-out slot-1 accuracy below this fraction of training's is flagged: the drafter fits its training mix far
# better than unseen prompts.
HELDOUT_GAP_FLAG = 0.75


@dataclass
class Curves:
    """The trainer's summary as curves: loss per step, accuracy per block position per step, the last-10%-of-steps
    loss and accuracy per position, the held-out points ({step, acc_by_pos, tau, blocks})."""

    loss: list[tuple[int, float]] = field(default_factory=list)
    accuracy: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # block position k -> points
    final_loss: float | None = None
    final_accuracy: list[float] = field(default_factory=list)
    heldout: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, train: TrainSummary) -> Curves:
        rows = [r for r in train.history if isinstance(r.get("loss"), int | float)]
        out = cls(loss=[(r.get("step", i + 1), float(r["loss"])) for i, r in enumerate(rows)],
                  heldout=[p for p in train.heldout if p.get("acc_by_pos")])
        with_acc = [r for r in rows if isinstance(r.get("acc_by_pos"), list)]
        if with_acc:
            out.accuracy = {k + 1: [(r.get("step", i + 1), float(r["acc_by_pos"][k])) for i, r in enumerate(with_acc)]
                            for k in range(len(with_acc[0]["acc_by_pos"]))}
        if train.final is not None:
            out.final_accuracy = [float(x) for x in train.final.acc_by_pos]
            out.final_loss = float(train.final.loss)
        return out


def report(train: TrainSummary | None, run: RunView) -> StageReport:
    if train is None or not train.history:
        note = run.absent("train") + " (no metrics/train.json with a loss history)"
        return StageReport(sections=[("Training", note)])
    curves = Curves.of(train)
    rows = [["steps", fmt(train.steps)], ["tokens", fmt(train.tokens)],
            ["final loss (last 10% of steps)", fmt(curves.final_loss)]]
    if curves.final_accuracy:
        rows.append(["final accuracy by position", " ".join(f"{a:.2f}" for a in curves.final_accuracy)])
    sections: list[Section] = [("Training", rows)]
    if curves.final_accuracy and curves.heldout:
        sections.append(("Training vs held-out accuracy per position", train_vs_heldout(curves)))
    return StageReport(flags=flags(curves), sections=sections, scalars=scalars(curves), charts=charts(curves, run))


def flags(curves: Curves) -> list[str]:
    if not (curves.final_accuracy and curves.heldout):
        return []
    trained, held = curves.final_accuracy[0], (curves.heldout[-1].get("acc_by_pos") or [None])[0]
    if held is None or trained <= 0 or held >= HELDOUT_GAP_FLAG * trained:
        return []
    return [f"held-out slot-1 accuracy {held:.2f} vs {trained:.2f} in training ({held / trained:.0%}): the drafter "
            "fits its training mix far better than unseen prompts (more data, or fewer steps)"]


def train_vs_heldout(curves: Curves) -> list[list[str]]:
    """Per block position: training accuracy (last 10% of steps) beside the held-out accuracy at the last
    held-out point; the held-out offline tau under them. A large gap is overfitting the training mix."""
    last = curves.heldout[-1]
    held = last["acc_by_pos"]
    rows = [["position k", "training (last 10% of steps)", f"held-out (step {last.get('step', '-')})"]]
    rows += [[str(k + 1), f"{a:.3f}", f"{held[k]:.3f}" if k < len(held) else "-"]
             for k, a in enumerate(curves.final_accuracy)]
    rows.append(["offline tau", "-", fmt(last.get("tau"))])
    return rows


def scalars(curves: Curves) -> dict[str, float]:
    out: dict[str, float] = {}
    if curves.final_loss is not None:
        out["final_train_loss"] = curves.final_loss
    if curves.heldout:
        last = curves.heldout[-1]
        if last.get("tau") is not None:
            out["heldout_offline_tau"] = float(last["tau"])
        out.update({f"heldout_accuracy_{k + 1}": float(a) for k, a in enumerate(last["acc_by_pos"])})
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


def charts(curves: Curves, run: RunView) -> dict[str, Chart]:
    out: dict[str, Chart] = {}
    if not curves.loss:
        return out
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    steps, losses = zip(*curves.loss, strict=True)
    span = smoothing_span(len(losses))
    ax.plot(steps, losses, color="#1f77b4", alpha=0.2, linewidth=0.8)  # raw, faint
    ax.plot(steps, ema(list(losses), span), color="#1f77b4", label=f"EMA (span {span})")
    ax.set(xlabel="optimizer step", ylabel="loss", title="Training loss (raw faint, EMA solid)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    out["train_loss"] = Chart("training loss", png(fig))
    if curves.accuracy:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        colors = plt.get_cmap("viridis")
        for k, points in curves.accuracy.items():
            color = colors((k - 1) / max(1, len(curves.accuracy) - 1))
            steps, acc = zip(*points, strict=True)
            ax.plot(steps, acc, color=color, alpha=0.12, linewidth=0.6)
            ax.plot(steps, ema(list(acc), smoothing_span(len(acc))), color=color, label=f"k={k} train (EMA)")
            if curves.heldout:
                ax.plot([p["step"] for p in curves.heldout], [p["acc_by_pos"][k - 1] for p in curves.heldout],
                        color=color, linestyle="--", marker="o", markersize=3, label=f"k={k} held-out")
        title = "Accuracy per block position: training (EMA over raw) vs held-out" if curves.heldout else \
            "Training accuracy per block position (raw faint, EMA solid)"
        ax.set(xlabel="optimizer step", ylabel="accuracy", title=title, ylim=(0, 1))
        ax.legend(fontsize=6, ncol=4 if curves.heldout else 2, loc="upper left")
        ax.grid(alpha=0.3)
        out["train_accuracy"] = Chart("training and held-out accuracy per position", png(fig))
    taus = [p for p in curves.heldout if p.get("tau") is not None]
    if taus:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([p["step"] for p in taus], [p["tau"] for p in taus], marker="o", color="#d62728",
                label="held-out offline tau")
        evaluated = run.summary("evaluate")
        served = {s.name: s.tau for s in (evaluated.suites if evaluated is not None else []) if s.tau is not None}
        for i, (name, tau) in enumerate(served.items()):
            ax.axhline(tau, color=plt.get_cmap("tab10")(i), linestyle=":", label=f"served tau, {name}")
        ax.set(xlabel="optimizer step", ylabel="tau (tokens per cycle)",
               title="Held-out offline tau during training vs served tau")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        out["heldout_tau"] = Chart("held-out offline tau during training", png(fig))
    return out
