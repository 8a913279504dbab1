"""The bodies of the pipeline's KFP components, one per stage.

KFP embeds each function's source in the compiled spec and runs it in the stage image, so every import sits inside
the body and each body is a thin call into the same entry function the `flashdraft <stage>` CLI uses (via
`flashdraft.run.runner.run_task`, which owns reuse, continuation and the status records). They are plain functions
here; `pipelines/pipeline.py` turns them into components with the right base image. A declared stage without a
component of its own (its `StageSpec.component` is None) runs through `stage_task`. Only small things leave a
body: a JSON summary string, metrics, Markdown/HTML reports.
"""

# No `from __future__ import annotations`: KFP reads these annotations as real types.

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output


def plan_gate(config_yaml: str, overrides: dict, compiled_mode: str, compiled_num_nodes: int,
              compiled_evaluate_only: bool, metrics: Output[Metrics]) -> str:
    """Refuse the run before any GPU stage: over-budget offline plans and configs that do not fit the DAG."""
    from flashdraft.components.plan.planner import run_plan
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import check_run, run_task

    cfg = runtime.stage_config(config_yaml, overrides)

    def body() -> dict:
        runtime.check_compiled_shape(cfg, compiled_mode, int(compiled_num_nodes), bool(compiled_evaluate_only))
        check_run(cfg)  # a changed setting no committed stage can carry on from stops the run here
        return run_plan(cfg)

    return runtime.finish(run_task(cfg, "plan", body=body, metrics=metrics), metrics)


def prep(config_yaml: str, overrides: dict) -> list[int]:
    """Prompts into shards; returns the shard ids that drive the ParallelFor fan-outs.

    A single output on purpose (no Metrics): kfp.local resolves ParallelFor items only from a task's default
    `Output`. Its figures reach the UI through the report step's Metrics.
    """
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    summary = run_task(cfg, "prep")
    return list(range(int(summary.num_shards)))


def generate(config_yaml: str, overrides: dict, shard: int, metrics: Output[Metrics]) -> str:
    """Target responses for one prompt shard."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.to_json(run_task(cfg, "generate", int(shard), metrics=metrics))


def extract(config_yaml: str, overrides: dict, shard: int, metrics: Output[Metrics]) -> str:
    """Hidden states of one response shard into the object store (never a KFP artifact)."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.to_json(run_task(cfg, "extract", int(shard), metrics=metrics))


def stream_end(config_yaml: str, overrides: dict) -> str:
    """Streaming: after the extract loop (even a failed one), tell the trainer the stream ended or failed."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.to_json(run_task(cfg, "stream-end"))


def train(config_yaml: str, overrides: dict, extracted: list[str], run_producers: bool,
          metrics: Output[Metrics]) -> str:
    """Train the drafter in this pod (torchrun when nproc_per_node > 1).

    `extracted` is the offline fan-in (empty in streaming mode). `run_producers` is the local streaming path: the
    extraction producers run in a background process inside this task, because kfp.local runs sibling tasks one
    after another and a consumer that waits for a producer scheduled after it would never finish.
    """
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    body = runtime.train_with_producers if run_producers else runtime.train_in_pod
    return runtime.finish(run_task(cfg, "train", body=lambda: body(cfg), metrics=metrics), metrics)


def train_multinode(config_yaml: str, overrides: dict, extracted: list[str], image: str, namespace: str,
                    node_selector: dict, tolerations: list, gpus_per_node: int, s3_secret_name: str,
                    runtime_ref: str, metrics: Output[Metrics]) -> str:
    """Multi-node training: create a Kubeflow Trainer TrainJob, wait for it, surface its status."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)

    def body() -> dict:
        return runtime.run_trainjob(cfg, config_yaml=config_yaml, overrides=overrides, image=image,
                                    namespace=namespace, node_selector=node_selector, tolerations=tolerations,
                                    gpus_per_node=int(gpus_per_node), s3_secret_name=s3_secret_name,
                                    runtime_ref=runtime_ref)

    return runtime.finish(run_task(cfg, "train", body=body, metrics=metrics), metrics)


def evaluate(config_yaml: str, overrides: dict, metrics: Output[Metrics]) -> str:
    """Acceptance length (tau) of the trained drafter against the target."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.finish(run_task(cfg, "evaluate", metrics=metrics), metrics)


def export(config_yaml: str, overrides: dict, metrics: Output[Metrics]) -> str:
    """Export the trained drafter for vLLM / SGLang."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.to_json(run_task(cfg, "export", metrics=metrics))


def stage_task(config_yaml: str, overrides: dict, stage: str, metrics: Output[Metrics]) -> str:
    """Any declared stage without a component of its own: its declared run function, through the runner (it
    reads its inputs from the store; the DAG orders it after its upstream tasks)."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.finish(run_task(cfg, stage, metrics=metrics), metrics)


def report(config_yaml: str, overrides: dict, status: dsl.PipelineTaskFinalStatus,
           report_html: Output[HTML], summary_md: Output[Markdown], metrics: Output[Metrics]) -> str:
    """Exit task: the run summary, written whether the run succeeded or failed: every stage's state and figures
    in the HTML/Markdown artifacts and in this step's Metrics."""
    from flashdraft.pipelines import runtime

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.write_report(cfg, status.state, status.error_message, report_html.path, summary_md.path,
                                metrics)
