"""`flashdraft plan`: print the storage/throughput reality check for a config or preset."""

from __future__ import annotations

import json
import shlex
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, fail, run_config


def plan(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the machine-readable report.")] = False,
    gate: Annotated[bool, typer.Option(
        "--gate", help="Exit 3 when offline storage exceeds the budget, a pool's predicted peak memory exceeds its "
                       "GPU, or the planned cost or days exceed plan.max_cost_usd / plan.deadline_days.")] = False,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Every topology (inference GPU or colocated x BF16/FP8 weights x offline/streaming x "
                          "codec) with its cost, storage, bandwidth, days and memory fit, sorted by total cost "
                          "(--json: the report's `comparison`).")] = False,
    calibrate: Annotated[str | None, typer.Option(
        "--calibrate", help="Calibration JSON (gpu-check writes one; schema: flashdraft/perf/calibration.py): "
                            "measured rates and trainer peaks replace the assumed ones.")] = None,
) -> None:
    """Bytes at rest per codec, GPU-hours per pool, peak memory per GPU per pool, streaming bandwidth, the mode;
    with --compare, every topology's cost and days."""
    from rich.console import Console
    from rich.markdown import Markdown

    from flashdraft.components.plan.compare import compare_markdown
    from flashdraft.components.plan.planner import comparison_of, make_plan, plan_markdown
    from flashdraft.config import ConfigError
    from flashdraft.perf.calibration import CalibrationError

    cfg = run_config(config, preset, set_)
    try:
        if calibrate:
            cfg = cfg.with_overrides({"plan.calibration": calibrate})
        report = make_plan(cfg, origin=" ".join([*(["--preset", preset] if preset else []),
                                                 *(["--config", str(config)] if config else []),
                                                 *(f"--set {shlex.quote(x)}" for x in set_ or [])]))
    except (ConfigError, CalibrationError) as exc:  # a setting to fix: exit 1, as every config error
        raise fail(exc, 1) from None
    if as_json:
        typer.echo(json.dumps(report.dump(), indent=2))
    elif compare:  # wide: a row is one line
        gate_line = f"\n**Gate: {report.gate}**\n" if report.gate else ""
        Console(width=180).print(Markdown(compare_markdown(comparison_of(report)) + gate_line))
    else:
        Console(width=120).print(Markdown(plan_markdown(report)))
    if gate and report.gate:
        typer.secho(report.gate, fg=typer.colors.RED, err=True)
        raise typer.Exit(3)

