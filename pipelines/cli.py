"""Pipeline commands: `compile`, `chart-config`, `upload-pipeline`, `submit`, `run-local`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from flashdraft.cli.options import ConfigOpt, PresetOpt, SetOpt, check_store, fail, run_config
from flashdraft.config.sweep import SweepSpec

DEFAULT_PACKAGE = "build/flashdraft-pipeline.yaml"
CLUSTER_PRESET = "qwen3.6-27b"

RegistryOpt = Annotated[str | None, typer.Option(help="Image registry (else env FLASHDRAFT_IMAGE_REGISTRY, else "
                                                      "ghcr.io/flashdraft).")]
TagOpt = Annotated[str | None, typer.Option(help="Image tag (else env FLASHDRAFT_IMAGE_TAG, else latest).")]
# upload-pipeline and submit: the compiled package, its name and version in KFP, and where KFP is.
PackageOpt = Annotated[Path, typer.Option(help="Compiled pipeline YAML.")]
NameOpt = Annotated[str, typer.Option(help="Pipeline name in KFP.")]
VersionOpt = Annotated[str | None, typer.Option(help="Pipeline version name (default: the release's with submit "
                                                      "--chart, else the tag of the package's images, so new images "
                                                      "are a new version).")]
HostOpt = Annotated[str | None, typer.Option(envvar="KFP_HOST", help="KFP API endpoint (env KFP_HOST).")]
NamespaceOpt = Annotated[str | None, typer.Option(help="KFP namespace (multi-user Kubeflow).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the requests instead of sending them.")]


def _kfp_api(package: Path, host: str | None, namespace: str | None, dry_run: bool, compile_hint: str):
    """The KFP API client for upload-pipeline and submit, after checking there is a package and an endpoint."""
    from flashdraft.pipelines.submit import KfpApi, resolve_token

    if not package.is_file():
        raise fail(f"{package}: no compiled pipeline (run `{compile_hint}` first)")
    if not host and not dry_run:
        raise fail("no KFP endpoint: pass --host or set KFP_HOST")
    return KfpApi(host or "http://kfp.invalid", token=resolve_token(), namespace=namespace, dry_run=dry_run)


def images_line(registry: str | None, tag: str | None) -> str:
    """Which images a compiled pipeline pulls and where the registry and tag came from, in one line: the
    defaults (ghcr.io/flashdraft, latest) are named as such, so nobody deploys them without knowing."""
    import os

    from flashdraft.pipelines.pipeline import stage_images

    def source(arg: str | None, option: str, env: str) -> str:
        return option if arg else env if os.environ.get(env) else "the default"

    images = sorted(set(stage_images(registry, tag).values()))
    origin = (f"registry: {source(registry, '--registry', 'FLASHDRAFT_IMAGE_REGISTRY')}, tag: "
              f"{source(tag, '--tag', 'FLASHDRAFT_IMAGE_TAG')}")
    hint = ("; pass --registry/--tag (or FLASHDRAFT_IMAGE_REGISTRY/FLASHDRAFT_IMAGE_TAG) for the images you pushed"
            if "the default" in origin else "")
    return f"images {', '.join(images)} ({origin}{hint})"


def compile_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Compiled pipeline YAML.")] = Path(DEFAULT_PACKAGE),
    config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
    registry: RegistryOpt = None, tag: TagOpt = None,
    parallelism: Annotated[int, typer.Option(help="Shards in flight per ParallelFor (0 = all). In streaming "
                                                  "mode each concurrent extract pod may add one part beyond "
                                                  "the window.")] = 0,
    variants: Annotated[Path | None, typer.Option("--variants", help="A sweep (as `flashdraft sweep "
                                                  "--variants`): one extraction, then a ParallelFor over the "
                                                  "variants, each its own run.")] = None,
    grid: Annotated[list[str] | None, typer.Option("--grid", help="A sweep's FIELD=V1,V2 (as `flashdraft "
                                                   "sweep --grid`).")] = None,
    parameters: Annotated[Path | None, typer.Option("--parameters", help="Defaults of the run parameters outside "
                                                    "the config (s3_secret_name, tracking_secret_name, "
                                                    "trainjob_namespace, trainjob_runtime): YAML, as `chart-config "
                                                    "--parameters-output` writes.")] = None,
) -> None:
    """Compile the Kubeflow pipeline (PipelineSpec + Kubernetes platform spec) with this config's defaults.

    Without --config/--preset the cluster preset qwen3.6-27b gives the defaults.
    """
    from flashdraft.config import ConfigError
    from flashdraft.pipelines.chart_config import read_cluster_defaults
    from flashdraft.pipelines.pipeline import compile_pipeline
    from flashdraft.pipelines.sweep import pipeline_variants, plan_sweep

    cfg = run_config(config, preset or (None if config else CLUSTER_PRESET), set_)
    try:
        cluster = read_cluster_defaults(parameters) if parameters else None
    except ValueError as exc:
        raise fail(exc) from None
    sweep = None
    if variants or grid:
        try:
            sweep = plan_sweep(cfg, load_sweep_spec(variants, grid))
        except ConfigError as exc:
            raise fail(exc, 1) from None
        cfg = sweep.base
    compile_pipeline(cfg, str(output), registry, tag, parallelism, pipeline_variants(sweep) if sweep else None,
                     cluster)
    what = f"a sweep of {len(sweep.variants)} variants, " if sweep else ""
    typer.echo(f"compiled {output} ({what}mode {cfg.mode.kind}); {images_line(registry, tag)}")


def chart_config_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Run config YAML to write.")],
    preset: Annotated[str, typer.Option("--preset", "-p", help="The preset the chart's pools and storage "
                                                               "are applied to.")] = CLUSTER_PRESET,
    parameters_output: Annotated[Path | None, typer.Option("--parameters-output", help="Also write the release's "
                                                           "Secret names and TrainJob settings here (for "
                                                           "`compile --parameters`).")] = None,
) -> None:
    """The run config `make chart-pipeline` compiles: PRESET with the pools and storage of the chart's defaults
    ConfigMap, read on stdin (`helm template ... --show-only templates/configmap-defaults.yaml`)."""
    import dataclasses

    import yaml

    from flashdraft.config import ConfigError
    from flashdraft.pipelines.chart_config import chart_cluster_defaults, chart_run_config

    configmap = sys.stdin.read()
    try:
        text = chart_run_config(configmap, preset)
        cluster = chart_cluster_defaults(configmap)
    except (ValueError, ConfigError) as exc:
        raise fail(f"stdin: {exc}") from None
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if parameters_output:
        parameters_output.write_text(yaml.safe_dump(dataclasses.asdict(cluster), sort_keys=False))
    typer.echo(f"wrote {output} ({preset} with the chart's pools and storage)"
               + (f" and {parameters_output} (its Secrets and TrainJob settings)" if parameters_output else ""))


def upload_pipeline(
    package: PackageOpt = Path(DEFAULT_PACKAGE), name: NameOpt = "flashdraft", version: VersionOpt = None,
    host: HostOpt = None, namespace: NamespaceOpt = None, dry_run: DryRunOpt = False,
) -> None:
    """Idempotently upload the compiled pipeline and a version (used by the Helm hook Job)."""
    from flashdraft.pipelines.submit import KfpApiError, image_tag

    api = _kfp_api(package, host, namespace, dry_run, "flashdraft compile")
    try:
        version = version or image_tag(str(package))
        ids = api.ensure_pipeline_version(str(package), name, version)
    except KfpApiError as exc:
        raise fail(exc) from None
    if dry_run:
        typer.echo(json.dumps(api.planned, indent=2))
    typer.echo(json.dumps({"pipeline": name, "version": version, **ids}))


def _release_name_version(chart: Path | None, name: str | None, version: str | None,
                          package: Path) -> tuple[str, str]:
    """The pipeline name and version a submit uses: the options, else the release's (the chart's rendered defaults
    ConfigMap: pipeline.name, pipeline.version or the image tag), else `flashdraft` and the package's image tag."""
    from flashdraft.pipelines.chart_config import defaults_data
    from flashdraft.pipelines.submit import image_tag

    release = {}
    if chart:
        try:
            release = defaults_data(chart.read_text() if chart.is_file() else "")
        except ValueError as exc:
            raise fail(f"{chart}: {exc}") from None
    return (name or release.get("pipelineName") or "flashdraft",
            version or release.get("pipelineVersion") or image_tag(str(package)))


def submit(
    package: PackageOpt = Path(DEFAULT_PACKAGE),
    params: Annotated[Path | None, typer.Option("--params", help="YAML mapping of run parameters.")] = None,
    experiment: Annotated[str, typer.Option(help="KFP experiment name.")] = "flashdraft",
    chart: Annotated[Path | None, typer.Option("--chart", help="The release's defaults ConfigMap as `make "
                                               "chart-pipeline` rendered it (build/chart-defaults.yaml): the "
                                               "pipeline name and version the release uploads.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="The run config this run uses (its config_yaml "
                                                 "parameter), e.g. a smoke run's on the release's pipeline; "
                                                 "default: the one compiled in.")] = None,
    name: Annotated[str | None, typer.Option(help="Pipeline name in KFP (default: the release's, else "
                                                  "flashdraft).")] = None,
    version: VersionOpt = None,
    run_name: Annotated[str | None, typer.Option(help="Run display name.")] = None,
    host: HostOpt = None, namespace: NamespaceOpt = None, dry_run: DryRunOpt = False,
) -> None:
    """Upload pipeline + version (idempotent), create the run, print what it runs and its UI URL.

    Auth: the in-cluster ServiceAccount token (KF_PIPELINES_SA_TOKEN_PATH) or KFP_BEARER_TOKEN.
    """
    from flashdraft.config import ConfigError
    from flashdraft.pipelines.submit import KfpApiError, check_parameters, load_parameters, will_run, with_run_config

    api = _kfp_api(package, host, namespace, dry_run, "make chart-pipeline")
    try:
        name, version = _release_name_version(chart, name, version, package)
        parameters = load_parameters(str(params) if params else None)
        if config:
            parameters = with_run_config(parameters, config)
        check_parameters(str(package), parameters)
        summary = will_run(str(package), parameters, name, version)
        ids = api.ensure_pipeline_version(str(package), name, version)
        experiment_id = api.ensure_experiment(experiment)
        run = api.create_run(run_name or f"{name}-{version}", experiment_id, ids, parameters)
    except (KfpApiError, ConfigError) as exc:
        raise fail(exc) from None
    typer.echo("\n".join(["will run:", *(f"  {line}" for line in summary)]))
    if dry_run:
        typer.echo(json.dumps(api.planned, indent=2))
        typer.echo("dry run: nothing was sent")
        return
    typer.echo(f"run {run['run_id']}: {api.run_url(run['run_id'])}")


def run_local_cmd(
    config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
    workdir: Annotated[Path, typer.Option(help="kfp.local pipeline root (task outputs; logs/ holds each run's "
                                               "log folder).")] = Path("runs/kfp-local"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show kfp.local's output and every "
                                                                  "task's log on the terminal.")] = False,
    from_stage: Annotated[str | None, typer.Option("--from", help="Recompute from this stage: its committed "
                                                                  "results and those of every stage after it "
                                                                  "are deleted, then the run starts.")] = None,
    confirm_readers: Annotated[bool, typer.Option("--confirm-readers", help="--from on a run whose prompts, "
                                                  "responses or features other runs read (data.features_from): "
                                                  "recompute them anyway (those runs are refused at their next "
                                                  "task).")] = False,
    runner: Annotated[str, typer.Option(help="`subprocess`: each task in a subprocess of this Python; "
                                             "`docker`: each task in its pool's image on this machine's "
                                             "Docker engine, the way to test images before `make push`.")]
    = "subprocess",
    image: Annotated[str | None, typer.Option(help="--runner docker: this image for every pool (else each "
                                                   "pool's image from --registry/--tag).")] = None,
    registry: RegistryOpt = None, tag: TagOpt = None,
) -> None:
    """Run the same pipeline on this machine with kfp.local (SubprocessRunner) and a local store.

    The terminal shows one line per task start and end with its figures, live progress, a summary table and
    where the report and the logs are; kfp.local's executor dumps and each task's output go to log files."""
    import logging
    import sys

    from rich.console import Console

    from flashdraft.pipelines.containers import ContainerError, ContainerRun
    from flashdraft.pipelines.local import print_outcome, run_local

    if runner not in ("subprocess", "docker"):
        raise fail(f"--runner must be subprocess or docker, got {runner!r}", 1)
    container = ContainerRun.resolve(image, registry, tag) if runner == "docker" else None
    cfg = run_config(config, preset or (None if config else "smollm2-local"), set_)
    check_store(cfg)  # before kfp.local starts anything: a bad store fails in seconds, in one line
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)
    from flashdraft.config import ConfigError

    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120)
    try:
        result = run_local(cfg, str(workdir), console=console, verbose=verbose, from_stage=from_stage,
                           container=container, confirm_readers=confirm_readers)
    except ConfigError as exc:  # a refused change (runner.StageInputsChanged), an unknown --from stage
        raise fail(exc, 1) from None
    except ContainerError as exc:  # no engine, a missing image, an image of another version
        raise fail(exc, 1) from None
    print_outcome(console, result)
    if result.get("state") != "SUCCEEDED":
        raise typer.Exit(1)


def load_sweep_spec(variants: Path | None, grid: list[str] | None) -> SweepSpec:
    """The sweep's variants: the YAML file's `variants`/`grid`, plus each `--grid FIELD=V1,V2` (values as YAML
    scalars, as --set reads them). Exits 1 naming the file or option on a bad one."""
    import yaml
    from pydantic import ValidationError

    try:
        data = (yaml.safe_load(variants.read_text()) or {}) if variants else {}
        if not isinstance(data, dict):
            raise fail(f"--variants {variants}: a mapping with `variants` and/or `grid`", 1)
        for item in grid or []:
            field, sep, values = item.partition("=")
            if not sep or not values:
                raise fail(f"--grid {item!r}: FIELD=V1,V2,...", 1)
            data.setdefault("grid", {})[field.strip()] = [yaml.safe_load(v) for v in values.split(",")]
        spec = SweepSpec.model_validate(data)
        spec.expand()
    except (OSError, yaml.YAMLError) as exc:
        raise fail(f"--variants {variants}: {exc}", 1) from None
    except (ValidationError, ValueError) as exc:
        raise fail(f"sweep variants ({variants or '--grid'}): {exc}", 1) from None
    return spec


def sweep_cmd(
    config: ConfigOpt = None, preset: PresetOpt = None, set_: SetOpt = None,
    variants: Annotated[Path | None, typer.Option("--variants", help="YAML: `variants: [{name, overrides}]` "
                                                  "and/or `grid: {FIELD: [V1, V2]}` (docs/training.md).")] = None,
    grid: Annotated[list[str] | None, typer.Option("--grid", help="FIELD=V1,V2: one variant per value "
                                                   "(repeatable: every combination).")] = None,
    workdir: Annotated[Path, typer.Option(help="kfp.local pipeline root of the variant runs.")]
    = Path("runs/kfp-local"),
) -> None:
    """Extract once, train many: the base config's run makes the prompts, responses and features once; each
    variant (its overrides of training, drafter, eval or export settings) trains, evaluates and exports as its own
    run `<run_id>-<variant>` reading them (data.features_from), one after another; then the variants side by
    side. On a cluster: `flashdraft compile --variants` (one pipeline run, a ParallelFor over the variants)."""
    import logging
    import sys

    from rich.console import Console

    from flashdraft.components.plan.planner import PlanGateError
    from flashdraft.config import ConfigError
    from flashdraft.pipelines.sweep import run_sweep, sweep_table

    spec = load_sweep_spec(variants, grid)
    cfg = run_config(config, preset or (None if config else "smollm2-local"), set_)
    check_store(cfg)
    logging.getLogger().setLevel(logging.WARNING)  # a line a task instead (as run-local without --verbose)
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)
    try:
        rows = run_sweep(cfg, spec, str(workdir), console=console)
    except (ConfigError, PlanGateError) as exc:  # a refused variant or source, the plan gate
        raise fail(exc, 1) from None
    console.print(sweep_table(rows), highlight=False, markup=False, soft_wrap=True)
    if any(r.state != "done" for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the pipeline commands to `app` (the `flashdraft.commands` entry point: flashdraft/cli/main.py calls it)."""
    app.command("compile")(compile_cmd)
    app.command("chart-config")(chart_config_cmd)
    app.command("upload-pipeline")(upload_pipeline)
    app.command("submit")(submit)
    app.command("run-local")(run_local_cmd)
    app.command("sweep")(sweep_cmd)
