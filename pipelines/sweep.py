"""`flashdraft sweep` on this machine: extract once, train many (docs/training.md).

The base run (the base config's run_id) passes the plan gate (priced for every variant: plan.train_variants) and
makes the prompts, responses and features once, task by task through the runner, as a cluster sweep's first
tasks do. Then each variant runs as its own `run-local` run, `<base>-<variant>`, with `data.features_from` the base
run: plan gate, train, evaluate, export and its report, in sequence. A variant that changes anything the features
depend on is refused before any task runs. The sweep ends with the variants side by side, on the console and in
the base run's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from flashdraft.components.evaluate.summary import EvaluateSummary
from flashdraft.components.train.summary import TrainSummary
from flashdraft.config import ConfigError, RunConfig
from flashdraft.config.sweep import SweepSpec, Variant
from flashdraft.run import registry, status
from flashdraft.run.runner import check_run, config_inputs, run_task
from flashdraft.storage import layout
from flashdraft.storage.store import open_store


@dataclass(frozen=True)
class Sweep:
    """The base run's config (the features) and each variant's run config, checked."""

    base: RunConfig
    variants: list[tuple[Variant, RunConfig]]


def variant_overrides(base: RunConfig, variant: Variant) -> dict[str, Any]:
    """A variant's overrides of the base config: its own, its run_id, the base run as its source, and one training
    to plan (the base run's plan prices all of them: plan.train_variants)."""
    source = f"{base.storage.root.rstrip('/')}/{base.run_id}"
    return {"plan.train_variants": 1, **variant.overrides, "run_id": f"{base.run_id}-{variant.name}",
            "data.features_from": source}


def variant_config(base: RunConfig, variant: Variant) -> RunConfig:
    """A variant's run config: the base config with `variant_overrides`."""
    return base.with_overrides(variant_overrides(base, variant))


def pipeline_variants(sweep: Sweep) -> list[dict[str, Any]]:
    """The sweep pipeline's `variants` parameter: per variant its name and the overrides its tasks run with."""
    return [{"name": v.name, "overrides": variant_overrides(sweep.base, v)} for v, _ in sweep.variants]


def plan_sweep(base: RunConfig, spec: SweepSpec) -> Sweep:
    """Every variant's config; refuses, naming the variant and the field, one that changes what the features
    depend on (the settings of prep, generate and extract: a sweep varies training, drafter, eval, export)."""
    variants = spec.expand()
    base = base.with_overrides({"plan.train_variants": len(variants)})
    out = []
    for variant in variants:
        try:
            cfg = variant_config(base, variant)
        except ConfigError as exc:
            raise ConfigError(f"variant {variant.name}: {exc}") from None
        for stage in (s for s in registry.current() if s.makes_features):
            before, now = config_inputs(stage, base), config_inputs(stage, cfg)
            changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            if changed:
                raise ConfigError(f"variant {variant.name}: sets {', '.join(changed)}, which the features depend on "
                                  f"({stage.name}): a sweep's variants share one extraction; sweep training, "
                                  "drafter, eval and export settings, or make another base run")
        out.append((variant, cfg))
    return Sweep(base, out)


def features_run(base: RunConfig, console: Any = None) -> None:
    """The base run's plan gate, prep, generate and extract, one task after another through the runner (reused
    when already committed); one console line a task."""
    def task(stage: str, shard: int | None = None) -> Any:
        summary = run_task(base, stage, shard)
        if console is not None:
            line = registry.current().get(stage).summary.headline(summary.figures())
            console.print(f"{base.run_id}: {status.task_name(stage, shard)} "
                          f"{'reused' if summary.skipped else 'done'}{': ' + line if line else ''}",
                          highlight=False, markup=False, soft_wrap=True)
        return summary

    check_run(base)
    task("plan")
    shards = int(task("prep").num_shards)
    for stage in ("generate", "extract"):
        for shard in range(shards):
            task(stage, shard)


class VariantRow(BaseModel):
    """One variant, side by side with the others: what it changed and what its run measured."""

    variant: str
    run_id: str
    changes: str
    state: str
    tau: dict[str, float | None]        # per eval suite
    speedup: float | None               # the first suite's, over the target alone
    lossless: bool | None
    final_loss: float | None
    train_hours: float | None
    trainer_gpu_hours: float | None     # train hours x the trainer pool's GPUs (0 on a CPU pool)


def variant_row(variant: Variant, cfg: RunConfig) -> VariantRow:
    """The row of a finished (or failed) variant run, from its committed metrics and status records."""
    store = open_store(cfg.storage, cfg.run_id)

    def metrics(model: type[BaseModel], stage: str) -> Any:
        key = layout.metrics_key(stage)
        return model.model_validate(store.get_json_verified(key)) if store.is_committed(key) else None

    ev, train = metrics(EvaluateSummary, "evaluate"), metrics(TrainSummary, "train")
    record = status.read_record(store, "train")
    hours = record.duration_s / 3600 if record and record.duration_s is not None else None
    gpus = cfg.pools.trainer.accelerator_count * cfg.training.num_nodes
    states = {r.stage: r.state for r in status.read_records(store)}
    failed = [s for s, state in states.items() if state == "failed"]
    suites = ev.suites if ev else []
    return VariantRow(
        variant=variant.name, run_id=cfg.run_id, changes=", ".join(f"{k}={v}" for k, v in variant.overrides.items()),
        state=f"failed ({', '.join(failed)})" if failed else ("done" if ev else "not evaluated"),
        tau={s.name: s.tau for s in suites}, speedup=suites[0].speedup if suites else None,
        lossless=all(s.lossless_passed for s in suites) if suites else None,
        final_loss=train.final.loss if train and train.final else None,
        train_hours=round(hours, 4) if hours is not None else None,
        trainer_gpu_hours=round(hours * gpus, 3) if hours is not None else None)


def sweep_table(rows: list[VariantRow]) -> str:
    """The variants side by side, as Markdown: tau per suite, speedup, loss, lossless, training time."""
    suites = list(dict.fromkeys(name for r in rows for name in r.tau))
    head = ["variant", "changes", "state", *[f"tau {s}" for s in suites], "speedup", "lossless", "final loss",
            "train h", "trainer GPU-h"]

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.variant, r.changes or "-", r.state, *[num(r.tau.get(s), ".2f") for s in suites],
                 num(r.speedup, ".2f"), {True: "yes", False: "NO", None: "-"}[r.lossless], num(r.final_loss, ".3f"),
                 num(r.train_hours, ".3f"), num(r.trainer_gpu_hours, ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_sweep(base: RunConfig, spec: SweepSpec, workdir: str, *, console: Any = None,
              exports_dir: str | Path = "exports") -> list[VariantRow]:
    """The local sweep (module docstring): the base run's features, then every variant in sequence, then the base
    run's report (the variants side by side in it, as a cluster sweep's exit handler writes it); the rows."""
    from flashdraft.components.report.report import run_report
    from flashdraft.pipelines.local import localize, run_local

    sweep = plan_sweep(localize(base), spec)
    if console is not None:
        console.print(f"flashdraft sweep: base run {sweep.base.run_id} (prep, generate, extract once), variants "
                      f"{', '.join(v.name for v, _ in sweep.variants)}", highlight=False, markup=False)
    features_run(sweep.base, console)
    rows = []
    for variant, cfg in sweep.variants:
        run_local(cfg, workdir, console=console, exports_dir=exports_dir)
        rows.append(variant_row(variant, cfg))
    report = run_report(sweep.base, run_over=True)
    if console is not None:
        console.print(f"{sweep.base.run_id}: report (the variants side by side): {report.report_html}",
                      highlight=False, markup=False, soft_wrap=True)
    return rows
