"""Every pipeline-parameter reference in the compiled spec resolves the way KFP's driver resolves it.

KFP 2.17 leaves a parameter used only as a resource placeholder (the GPU counts) off the DAGs around the task;
`declare_channels_on_enclosing_dags` adds it. The k8s tier (tests/k8s/test_placement.py) follows every reference
to a pod; this is the fast offline check of the same property.
"""

from __future__ import annotations

import pytest
import yaml

from flashdraft.config import load_config
from flashdraft.pipelines.pipeline import compile_pipeline


@pytest.mark.parametrize("overrides", [{}, {"mode.kind": "streaming"}, {"training.num_nodes": 2}],
                         ids=["offline", "streaming", "multinode"])
def test_every_dag_declares_the_inputs_its_tasks_read(tmp_path, overrides):
    path = tmp_path / "p.yaml"
    compile_pipeline(load_config(preset="qwen3.6-27b", overrides=overrides), str(path), "r.example", "t")
    spec = next(yaml.safe_load_all(path.read_text()))
    dags = {"root": spec["root"], **{k: v for k, v in spec["components"].items() if "dag" in v}}
    unresolved = []
    for name, dag in dags.items():
        declared = set(dag.get("inputDefinitions", {}).get("parameters", {}))
        for task_name, task in dag["dag"]["tasks"].items():
            for param in task.get("inputs", {}).get("parameters", {}).values():
                ref = param.get("componentInputParameter")
                if ref and ref not in declared:
                    unresolved.append(f"{name}/{task_name} reads {ref}")
    assert not unresolved, unresolved
    # The GPU counts really reach the GPU tasks inside the loops and the exit handler.
    loops = [c for c in spec["components"].values() if "dag" in c and "generate" in c["dag"]["tasks"]]
    assert "pipelinechannel--inference_gpus" in loops[0]["inputDefinitions"]["parameters"]
