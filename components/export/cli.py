"""`flashdraft export`: write the trained drafter in the z-lab format (vLLM, SGLang) and optionally speculators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, run_config, run_stage


def export(
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Local folder (default ./exports/<run_id>).")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="bfloat16, float16 or float32 (overrides "
                                                              "export.dtype).")] = None,
    speculators: Annotated[bool, typer.Option("--speculators", help="Also write the speculators format (adds it "
                                                                    "to export.formats).")] = False,
) -> None:
    """Export the latest training checkpoint to the object store (export/) and a local folder, in the formats and
    dtype of the config's export section."""
    from flashdraft.components.export.export import ExportError, run_export

    cfg = run_config(config, preset, [*(set_ or []), *([f"export.dtype={dtype}"] if dtype else [])])
    if speculators and "speculators" not in cfg.export.formats:
        cfg = cfg.with_overrides({"export.formats": [*cfg.export.formats, "speculators"]})
    # --out is not a config field, so not in the fingerprint: a hand-run export always runs (force).
    summary = run_stage(cfg, "export", body=lambda: run_export(
        cfg, out_dir=out if out is not None else Path("exports") / cfg.run_id), force=True, errors=(ExportError,))
    typer.echo(json.dumps(summary.dump(), indent=2))

