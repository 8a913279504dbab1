"""The flashdraft Kubeflow pipeline: DAG wiring and placement only (stage logic lives in components/).

    exit handler ── report (runs on success and on failure)
      plan gate ─> prep ─> ParallelFor(shards): generate ─> ParallelFor(shards): extract ─> train ─> evaluate ─> export

data.responses=dataset: prep writes the dataset's replies as the responses and there is no generate task (extract
follows prep). offline: train waits for every extract shard (fan-in). streaming: train starts with the extract loop
and consumes shards through the object store's bounded window. Evaluate only (a pretrained drafter,
training.max_steps 0): plan gate ─> prep ─> evaluate ─> export, with no generate, extract or train task. A run that
trains on another run's features (data.features_from): plan gate ─> train ─> evaluate ─> export, or one sweep run
with a ParallelFor over the variants (`build_sweep_pipeline`). The DAG shape (mode, single pod vs TrainJob, evaluate
only, data.responses, data.features_from) is fixed when the pipeline is built from a config; the plan gate refuses a
run whose config asks for another shape. Everything else
(the whole config YAML, dotted overrides, node pools, GPU counts, the Secrets' names) is a run parameter.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as real types.

import inspect
import json
import os
from dataclasses import dataclass
from typing import Any

from kfp import compiler, dsl

from flashdraft.config import RunConfig
from flashdraft.pipelines import stages
from flashdraft.pipelines.placement import PoolParams, SecretNames, place
from flashdraft.run import registry as stage_registry

PIPELINE_NAME = "flashdraft"
DEFAULT_REGISTRY = "ghcr.io/flashdraft"
DEFAULT_TAG = "latest"
DEFAULT_S3_SECRET = "flashdraft-s3"
DEFAULT_TRACKING_SECRET = "flashdraft-tracking"  # optional: a run without it logs to no remote tracker
DEFAULT_HUB_SECRET = "flashdraft-hub"  # optional: HF_TOKEN, HF_ENDPOINT (public repositories need neither)
DEFAULT_TRAINJOB_RUNTIME = "torch-distributed"
# Pool -> image: CPU stages in the slim base image, vLLM/extraction in the inference image, training in trainer.
POOL_IMAGE = {"cpu": "flashdraft-base", "inference": "flashdraft-inference", "trainer": "flashdraft-trainer"}


@dataclass(frozen=True)
class ClusterDefaults:
    """The run parameters that are not part of the run config: the Secrets' names and the TrainJob's namespace and
    runtime. A release's pipeline carries the chart's (its defaults ConfigMap's `parameters.yaml`, through
    `flashdraft chart-config --parameters-output`), so a run started from the UI uses the release's Secrets."""

    s3_secret_name: str = DEFAULT_S3_SECRET
    tracking_secret_name: str = DEFAULT_TRACKING_SECRET
    hub_secret_name: str = DEFAULT_HUB_SECRET
    trainjob_namespace: str = ""  # empty: the run's own namespace
    trainjob_runtime: str = DEFAULT_TRAINJOB_RUNTIME


def stage_images(registry: str | None = None, tag: str | None = None) -> dict[str, str]:
    """Image per pool, from arguments, else env FLASHDRAFT_IMAGE_REGISTRY / FLASHDRAFT_IMAGE_TAG, else defaults."""
    registry = (registry or os.environ.get("FLASHDRAFT_IMAGE_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")
    tag = tag or os.environ.get("FLASHDRAFT_IMAGE_TAG") or DEFAULT_TAG
    return {pool: f"{registry}/{name}:{tag}" for pool, name in POOL_IMAGE.items()}


# Tasks wired by hand below: the DAG's shape (the plan gate with the compiled shape, prep's shard list feeding the
# fan-outs, the per-shard loops, streaming's stream-end, train's offline fan-in or the TrainJob launcher). The exit
# handler is the registry's `exit_handler` stage (the report). Every other declared stage (evaluate, export, an
# extension's) is added after its upstream tasks, in registry order, through the generic `stages.stage_task`: it
# reads its inputs from the store.
WIRED = frozenset({"plan", "prep", "generate", "extract", "stream-end", "train"})
# The stages whose component takes or gives something the generic body does not (pipelines/stages.py).
OWN_BODIES = {"plan": stages.plan_gate, "prep": stages.prep, "train": stages.train, "report": stages.report}


def _components(images: dict[str, str], cfg: RunConfig) -> dict[str, Any]:
    """One KFP component per declared stage (its own body, else the generic one named after the stage, so its
    task and executor are `<stage>` / `exec-<stage>` as for a body of its own), in its pool's image; plus the
    multi-node launcher, which only talks to the Kubernetes API (the TrainJob's pods use the trainer image), and a
    sweep variant's report."""
    def comp(func: Any, pool: str) -> Any:
        return dsl.component(func, base_image=images[pool], install_kfp_package=False)

    out = {}
    for stage in stage_registry.current():
        pool = stage_registry.current().pool_name(cfg.pools, stage.name)
        out[stage.name] = comp(OWN_BODIES.get(stage.name, stages.stage_task), pool)
        if stage.name not in OWN_BODIES:
            out[stage.name].component_spec.name = stage.name
    out["train-launcher"] = comp(stages.train_multinode, "cpu")
    # a sweep variant's own report, through the generic body (the report's own body is the exit handler's)
    out["variant-report"] = comp(stages.stage_task, stage_registry.current().pool_name(cfg.pools, "report"))
    out["variant-report"].component_spec.name = "variant-report"
    return out


def stage_args(stage: str, shard: Any = -1) -> dict[str, Any]:
    """The arguments a stage's component takes besides the config: for the generic body, the stage's name and its
    shard (a ParallelFor item; -1: not per-shard), always given (KFP's ignore_upstream_failure wants every input
    bound)."""
    return {} if stage in OWN_BODIES else {"stage": stage, "shard": shard}


@dataclass
class _Wiring:
    """The tasks of one pipeline function, wired while KFP traces it: what they share (the config, the components,
    the pipeline's parameters) and the DAG's shape (`build_pipeline`'s docstring)."""

    cfg: RunConfig
    components: dict[str, Any]
    cfg_args: dict[str, Any]  # config_yaml and overrides: every task's first arguments
    params: dict[str, PoolParams]  # per pool: the node selector, tolerations and GPU count parameters
    secrets: SecretNames  # the S3, tracking and Hub Secret name parameters
    trainjob: dict[str, Any]  # the multi-node launcher's placement arguments
    local: bool
    parallelism: int
    variants: Any = None  # a sweep: the `variants` pipeline parameter (each item {name, overrides}); else None

    def placed(self, stage: str, task: Any, pool: str | None = None) -> Any:
        pool = pool or stage_registry.current().pool_name(self.cfg.pools, stage)
        return place(task, stage, getattr(self.cfg.pools, pool), self.params[pool], self.secrets,
                     retries=not self.local).set_display_name(stage)

    def task(self, stage: str, cfg_args: dict[str, Any] | None = None, **args: Any) -> Any:
        """A placed task of `stage`'s component (`stage_args` added for the generic body); `cfg_args`: a sweep
        variant's config arguments instead of the run's."""
        shard = args.pop("shard", -1)
        return self.placed(stage, self.components[stage](**(cfg_args or self.cfg_args), **stage_args(stage, shard),
                                                          **args))

    def wire(self) -> None:
        """The exit handler around the plan gate, prep, the training tasks and every later stage."""
        cfg = self.cfg
        (exit_stage,) = [stage for stage in stage_registry.current() if stage.exit_handler]
        with dsl.ExitHandler(self.task(exit_stage.name), name="run"):
            gate = self.task("plan", compiled_mode=cfg.mode.kind, compiled_num_nodes=cfg.training.num_nodes,
                             compiled_evaluate_only=cfg.evaluate_only,
                             compiled_features_from=cfg.data.features_from is not None,
                             compiled_responses=cfg.data.responses)
            tasks = {"plan": gate}
            if cfg.data.features_from is not None:  # prep, generate, extract: the source's (Stage.from_source)
                if not cfg.evaluate_only:
                    tasks["train"] = self.train_task([]).after(gate)
            else:
                tasks["prep"] = self.task("prep").after(gate)
                if self.variants is not None:  # a sweep: the later tasks are each variant's, in its loop
                    self.sweep_tasks(tasks["prep"])
                    return
                if not cfg.evaluate_only:  # evaluate only: no generate, extract or train task (Stage.trains)
                    tasks.update(self.training_tasks(tasks["prep"]))
            self.later_tasks(tasks)

    def training_tasks(self, prep: Any) -> dict[str, Any]:
        """generate (unless data.responses=dataset) and extract per shard, then train (offline fan-in, streaming,
        or the TrainJob launcher): the tasks of every run that trains."""
        tasks, extracted = self.feature_tasks(prep)
        train = self.train_task(extracted)
        # streaming: the trainer runs beside the extract loop, once responses exist
        train.after(tasks.get("generate", prep))
        tasks["train"] = train
        return tasks

    def sweep_tasks(self, prep: Any) -> None:
        """A sweep (offline): generate and extract once, then a ParallelFor over the variants, each its own run
        (its overrides: run_id `<base>-<variant>`, data.features_from the base run) with its train (on the
        trainer pool), evaluate and export tasks, and its report whatever became of them. The base run's report,
        the exit handler, ends with the variants side by side (components/report/compare.py)."""
        tasks, extracted = self.feature_tasks(prep)
        with dsl.ParallelFor(self.variants, parallelism=self.parallelism, name="variants") as variant:
            args = {"config_yaml": self.cfg_args["config_yaml"], "overrides": variant.overrides}
            ran = {"train": self.train_task(extracted, args)}
            self.later_tasks(ran, args)
            report = self.components["variant-report"](**args, stage="report", shard=-1)
            self.placed("report", report).after(*ran.values()).ignore_upstream_failure()

    def feature_tasks(self, prep: Any) -> tuple[dict[str, Any], Any]:
        """generate and extract per shard (streaming: and stream-end); the extract outputs train's offline
        fan-in collects."""
        streaming = self.cfg.mode.kind == "streaming"
        extracted: Any = []
        tasks: dict[str, Any] = {}
        gen = prep  # data.responses=dataset: prep wrote the responses, no generate task (Generate.skip_reason)
        if not stage_registry.current().get("generate").skipped_for(self.cfg):
            with dsl.ParallelFor(prep.output, parallelism=self.parallelism, name="generate-shards") as shard:
                gen = tasks["generate"] = self.task("generate", shard=shard)
        if not (streaming and self.local):
            with dsl.ParallelFor(prep.output, parallelism=self.parallelism, name="extract-shards") as s:
                ext = self.task("extract", shard=s).after(gen)
            tasks["extract"] = ext
            if streaming:  # EOS or FAILED for the trainer, whatever became of the extract tasks
                self.task("stream-end").after(ext).ignore_upstream_failure()
            else:
                extracted = dsl.Collected(ext.outputs["Output"])
        return tasks, extracted

    def train_task(self, extracted: Any, cfg_args: dict[str, Any] | None = None) -> Any:
        """The train task: one pod, or the TrainJob launcher for several nodes."""
        if self.cfg.training.num_nodes > 1:
            return self.placed("train-launcher", self.components["train-launcher"](
                **(cfg_args or self.cfg_args), extracted=extracted, **self.trainjob), pool="cpu")
        streaming = self.cfg.mode.kind == "streaming"
        return self.task("train", cfg_args, extracted=extracted, run_producers=streaming and self.local)

    def later_tasks(self, tasks: dict[str, Any], cfg_args: dict[str, Any] | None = None) -> None:
        """Every declared stage not wired by hand (evaluate, export, an extension's), in registry order, after its
        upstream tasks (or prep): it reads its inputs from the store. `cfg_args`: a sweep variant's."""
        reg = stage_registry.current()
        for stage in reg:
            if stage.name in WIRED or stage.exit_handler or stage.skipped_for(self.cfg):
                continue
            if stage.per_shard:
                raise ValueError(f"stage {stage.name!r}: the pipeline fans out only generate and extract per "
                                 "shard; declare it per_shard=False (it may still loop over shards itself)")
            task = self.task(stage.name, cfg_args)
            # what it reads in this run (Registry.upstream_in) and this DAG has a task of (not a source run's)
            upstream = [n for n in reg.upstream_in(stage, self.cfg) if n in tasks]
            for name in upstream or ("prep" if "prep" in tasks else "plan",):
                task.after(tasks[name])
            tasks[stage.name] = task


def build_pipeline(cfg: RunConfig, registry: str | None = None, tag: str | None = None, *,
                   local: bool = False, parallelism: int = 0, images: dict[str, str] | None = None,
                   variants: list[dict[str, Any]] | None = None, cluster: ClusterDefaults | None = None) -> Any:
    """The pipeline function for `cfg`: its defaults come from `cfg`, its shape from mode, num_nodes,
    `cfg.evaluate_only`, data.features_from and `variants`.

    variants: a sweep (pipelines/sweep.py `pipeline_variants`): each item {name, overrides} is one variant run
    reading the base run's features; the pipeline then has a `variants` parameter with these as its default.

    local: the build for kfp.local, which differs in three honest ways. It runs sibling tasks one after another,
    so in streaming mode the train task runs the extraction producers itself (background process) instead of a
    concurrent extract loop. GPU counts are literals: kfp.local cannot resolve a pipeline parameter used as a
    resource inside a ParallelFor (and ignores resources anyway). No retries: a local failure is not a preemption.
    parallelism: shards in flight per ParallelFor (0 = all; KFP needs a literal).
    images: pool -> image, instead of the images of `registry`/`tag` (`run-local --runner docker --image`).
    cluster: the defaults of the parameters outside the run config (a release's Secrets, TrainJob settings).
    """
    images = images or stage_images(registry, tag)
    cluster = cluster or ClusterDefaults()
    c = _components(images, cfg)
    pools = cfg.pools
    # One line (JSON is YAML): KFP echoes defaults into a comment header, and a multi-line default breaks the file.
    default_yaml = json.dumps(cfg.model_dump(mode="json"), sort_keys=False)

    sweep = variants is not None

    def flashdraft_pipeline(
        config_yaml: str = default_yaml,
        overrides: dict = {},  # noqa: B006 (a KFP parameter default, never mutated)
        s3_secret_name: str = cluster.s3_secret_name,
        tracking_secret_name: str = cluster.tracking_secret_name,
        hub_secret_name: str = cluster.hub_secret_name,
        cpu_node_selector: dict = pools.cpu.node_selector,
        cpu_tolerations: list = pools.cpu.tolerations,
        inference_node_selector: dict = pools.inference.node_selector,
        inference_tolerations: list = pools.inference.tolerations,
        inference_gpus: int = pools.inference.accelerator_count,
        trainer_node_selector: dict = pools.trainer.node_selector,
        trainer_tolerations: list = pools.trainer.tolerations,
        trainer_gpus: int = pools.trainer.accelerator_count,
        trainjob_namespace: str = cluster.trainjob_namespace,
        trainjob_runtime: str = cluster.trainjob_runtime,
        variants: list = variants or [],  # noqa: B006 (a KFP parameter default, never mutated)
    ):
        params = {
            "cpu": PoolParams(cpu_node_selector, cpu_tolerations, None),
            "inference": PoolParams(inference_node_selector, inference_tolerations,
                                    pools.inference.accelerator_count if local else inference_gpus),
            "trainer": PoolParams(trainer_node_selector, trainer_tolerations,
                                  pools.trainer.accelerator_count if local else trainer_gpus),
        }
        trainjob = {"image": images["trainer"], "namespace": trainjob_namespace, "node_selector":
                    trainer_node_selector, "tolerations": trainer_tolerations, "gpus_per_node": trainer_gpus,
                    "s3_secret_name": s3_secret_name, "tracking_secret_name": tracking_secret_name,
                    "hub_secret_name": hub_secret_name, "runtime_ref": trainjob_runtime}
        secrets = SecretNames(s3_secret_name, tracking_secret_name, hub_secret_name)
        _Wiring(cfg, c, {"config_yaml": config_yaml, "overrides": overrides}, params, secrets, trainjob,
                local, parallelism, variants if sweep else None).wire()

    if not sweep:  # KFP reads the parameters from the signature: a run that is no sweep has no `variants`
        signature = inspect.signature(flashdraft_pipeline)
        flashdraft_pipeline.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for p in signature.parameters.values() if p.name != "variants"])
    return dsl.pipeline(name=PIPELINE_NAME, description="Train a DFlash drafter: responses and hidden states from "
                        "the target on the inference pool, training on the trainer pool, features in object "
                        "storage.")(flashdraft_pipeline)


CHANNEL = "pipelinechannel--"


def declare_channels_on_enclosing_dags(spec: Any) -> None:
    """Fill a gap of the KFP 2.17 compiler, in place on the PipelineSpec proto.

    A pipeline parameter used only as a resource placeholder (`set_accelerator_limit(inference_gpus)`) becomes an
    input of the task inside an ExitHandler or ParallelFor, but not of the DAGs around it, and KFP's driver then
    fails the task: "parent DAG does not have input parameter pipelinechannel--inference_gpus". Each such input
    is declared on its DAG and fed from the parent, up to the root parameter (found by the k8s test tier).
    """
    owner = {}
    for parent, comp in [("root", spec.root), *spec.components.items()]:
        for task in comp.dag.tasks.values():
            owner[task.component_ref.name] = (parent, task)
    root_inputs = spec.root.input_definitions.parameters

    def declare(dag: str, name: str) -> None:
        params = spec.components[dag].input_definitions.parameters
        if name in params:
            return
        params[name].parameter_type = root_inputs[name.removeprefix(CHANNEL)].parameter_type
        parent, task = owner[dag]
        task.inputs.parameters[name].component_input_parameter = name.removeprefix(CHANNEL) if parent == "root" \
            else name
        if parent != "root":
            declare(parent, name)

    for dag, comp in list(spec.components.items()):
        for task in comp.dag.tasks.values():
            for source in task.inputs.parameters.values():
                ref = source.component_input_parameter
                if ref.startswith(CHANNEL) and ref.removeprefix(CHANNEL) in root_inputs:
                    declare(dag, ref)


def compile_pipeline(cfg: RunConfig, output: str, registry: str | None = None, tag: str | None = None,
                     parallelism: int = 0, variants: list[dict[str, Any]] | None = None,
                     cluster: ClusterDefaults | None = None) -> str:
    """Write the compiled pipeline (PipelineSpec + kubernetes platform spec: two YAML documents) to `output`
    (`variants`: a sweep's, `cluster`: a release's parameter defaults; build_pipeline)."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    pipeline = build_pipeline(cfg, registry, tag, parallelism=parallelism, variants=variants, cluster=cluster)
    declare_channels_on_enclosing_dags(pipeline.pipeline_spec)
    compiler.Compiler().compile(pipeline, package_path=output)
    return output
