"""The bodies of the pipeline's KFP components: one generic body for any stage, and the few whose inputs or
outputs differ.

KFP embeds each function's source in the compiled spec and runs it in the stage image, so every import sits inside
the body and each body is a few lines: the task through the runner (`flashdraft.run.runner.run_task`: reuse,
continuation, the status record, the task's KFP metrics), which calls the stage object's own `run`, with helpers
from `pipelines/runtime.py`. `stage_task` serves every stage without a body of its own (generate, extract, stream-end,
evaluate, export, an extension's); `pipelines/pipeline.py` names each of its components after its stage. The
others differ in what they take or give: the plan gate (the compiled DAG's shape), prep (the shard list the
fan-outs read), train (the offline fan-in, the local producers), train_multinode (the TrainJob's placement) and
the report (the exit handler's status and artifacts). Only small things leave a body: a JSON summary string,
metrics, Markdown/HTML reports.
"""

# No `from __future__ import annotations`: KFP reads these annotations as real types.

from kfp import dsl
from kfp.dsl import HTML, Markdown, Metrics, Output


def stage_task(config_yaml: str, overrides: dict, stage: str, metrics: Output[Metrics], shard: int = -1) -> str:
    """Any stage's task (one shard of a per-shard stage; -1: not per-shard): the stage object's `run`, through the
    runner (it reads its inputs from the store; the DAG orders it after its upstream tasks)."""
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.to_json(run_task(cfg, stage, None if int(shard) < 0 else int(shard), metrics=metrics))


def plan_gate(config_yaml: str, overrides: dict, compiled_mode: str, compiled_num_nodes: int,
              compiled_evaluate_only: bool, compiled_features_from: bool, metrics: Output[Metrics],
              compiled_responses: str = "target") -> str:
    """Refuse the run before any GPU stage: over-budget offline plans and configs that do not fit the DAG."""
    from flashdraft.pipelines import runtime

    return runtime.plan_gate(config_yaml, overrides, compiled_mode, int(compiled_num_nodes),
                             bool(compiled_evaluate_only), bool(compiled_features_from), metrics,
                             str(compiled_responses))


def prep(config_yaml: str, overrides: dict) -> list[int]:
    """Prompts into shards; returns the shard ids that drive the ParallelFor fan-outs.

    A single output on purpose (no Metrics): kfp.local resolves ParallelFor items only from a task's default
    `Output`. Its figures reach the UI through the report step's Metrics.
    """
    from flashdraft.pipelines import runtime

    return runtime.prep_shards(config_yaml, overrides)


def train(config_yaml: str, overrides: dict, extracted: list[str], run_producers: bool,
          metrics: Output[Metrics]) -> str:
    """Train the drafter in this pod: the train stage's `run`, its launcher (torchrun when nproc_per_node > 1).

    `extracted` is the offline fan-in (empty in streaming mode). `run_producers` is the local streaming path: the
    extraction producers run in a background process inside this task, because kfp.local runs sibling tasks one
    after another and a consumer that waits for a producer scheduled after it would never finish.
    """
    from flashdraft.pipelines import runtime
    from flashdraft.run.runner import run_task

    cfg = runtime.stage_config(config_yaml, overrides)
    body = (lambda: runtime.train_with_producers(cfg)) if run_producers else None
    return runtime.to_json(run_task(cfg, "train", body=body, metrics=metrics))


def train_multinode(config_yaml: str, overrides: dict, extracted: list[str], image: str, namespace: str,
                    node_selector: dict, tolerations: list, gpus_per_node: int, s3_secret_name: str,
                    tracking_secret_name: str, hub_secret_name: str, runtime_ref: str,
                    metrics: Output[Metrics]) -> str:
    """Multi-node training: create a Kubeflow Trainer TrainJob, wait for it, surface its status."""
    from flashdraft.pipelines import runtime

    return runtime.trainjob_task(config_yaml, overrides, metrics, image=image, namespace=namespace,
                                 node_selector=node_selector, tolerations=tolerations,
                                 gpus_per_node=int(gpus_per_node), s3_secret_name=s3_secret_name,
                                 tracking_secret_name=tracking_secret_name, hub_secret_name=hub_secret_name,
                                 runtime_ref=runtime_ref)


def report(config_yaml: str, overrides: dict, status: dsl.PipelineTaskFinalStatus,
           report_html: Output[HTML], summary_md: Output[Markdown], metrics: Output[Metrics]) -> str:
    """Exit task: the run summary, written whether the run succeeded or failed: every stage's state and figures
    in the HTML/Markdown artifacts and in this step's Metrics."""
    from flashdraft.pipelines import runtime

    cfg = runtime.stage_config(config_yaml, overrides)
    return runtime.write_report(cfg, status.state, status.error_message, report_html.path, summary_md.path,
                                metrics)
