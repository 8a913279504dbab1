"""The compiled pipeline: DAG shape per mode, and every task's Kubernetes placement read back from the spec."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import load_config
from flashdraft.pipelines.pipeline import compile_pipeline
from flashdraft.pipelines.placement import RETRIES
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, S3_SECRET_KEYS, TRACKING_SECRET_KEYS
from flashdraft.run import registry

POOL_OF_EXECUTOR = {
    "exec-plan-gate": "cpu", "exec-prep": "cpu", "exec-report": "cpu", "exec-export": "cpu",
    "exec-generate": "inference", "exec-extract": "inference", "exec-evaluate": "inference", "exec-train": "trainer",
}
STAGE_OF_EXECUTOR = {"exec-plan-gate": "plan", **{k: k.removeprefix("exec-") for k in POOL_OF_EXECUTOR
                                                  if k != "exec-plan-gate"}}
GPU_EXECUTORS = {"exec-generate", "exec-extract", "exec-evaluate", "exec-train"}
SENTINEL_KEY, SENTINEL_SECRET = "AKIASENTINELKEY0000", "sentinel/secret+value/never-in-yaml"
# Tracker settings in the compiling environment: none of them may reach the compiled file either.
TRACKER_SENTINELS = {"MLFLOW_TRACKING_URI": "https://mlflow.sentinel.example", "MLFLOW_TRACKING_PASSWORD":
                     "sentinel-mlflow-password", "WANDB_API_KEY": "sentinel-wandb-api-key-0000"}
# The Hub's token and mirror in the compiling environment: neither may reach the compiled file.
HUB_SENTINELS = {"HF_TOKEN": "hf_sentinelHubToken0000never", "HF_ENDPOINT": "https://hub-mirror.sentinel.example"}


def _compile(tmp_path, monkeypatch, overrides=(), name="p.yaml"):
    # Credentials in the compiling environment must not leak into the compiled file.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SENTINEL_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL_SECRET)
    for var, value in (TRACKER_SENTINELS | HUB_SENTINELS).items():
        monkeypatch.setenv(var, value)
    cfg = load_config(preset="qwen3.6-27b", overrides=list(overrides))
    path = tmp_path / name
    compile_pipeline(cfg, str(path), registry="registry.example/team", tag="abc123")
    text = path.read_text()
    docs = list(yaml.safe_load_all(text))
    return cfg, text, docs


def _all_tasks(spec):
    """task name -> task spec, over the root DAG and every sub-DAG (exit handler, loops)."""
    tasks = {}
    for comp in [spec["root"], *spec["components"].values()]:
        tasks.update(comp.get("dag", {}).get("tasks", {}))
    return tasks


def test_compiled_spec_places_every_stage_on_its_pool(tmp_path, monkeypatch):
    cfg, text, docs = _compile(tmp_path, monkeypatch)
    assert len(docs) == 2, "PipelineSpec + kubernetes platform spec"
    spec, platform = docs
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = spec["deploymentSpec"]["executors"]
    assert set(POOL_OF_EXECUTOR) <= set(executors)
    for exe, pool_name in POOL_OF_EXECUTOR.items():
        k8s, container = executors[exe], containers[exe]["container"]
        pool = getattr(cfg.pools, pool_name)
        # selectors/tolerations are the pool's pipeline parameters (UI-overridable), not literals
        assert k8s["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith(
            f"{pool_name}_node_selector"), exe
        assert k8s["tolerations"][0]["tolerationJson"]["componentInputParameter"].endswith(
            f"{pool_name}_tolerations"), exe
        assert k8s["activeDeadlineSeconds"] == str(registry.current().get(STAGE_OF_EXECUTOR[exe]).timeout_s)
        secret = k8s["secretAsEnv"][0]
        assert secret["secretNameParameter"]["componentInputParameter"].endswith("s3_secret_name")
        assert {e["envVar"] for e in secret["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert not secret.get("optional"), "a pod without its S3 credentials must not start"
        assert container["resources"]["resourceCpuRequest"] == pool.cpu_request
        assert container["resources"]["resourceMemoryRequest"] == pool.memory_request
        # limits = requests; the images' uid, non-root; the caches on a volume of the pool's ephemeral storage
        assert container["resources"]["resourceCpuLimit"] == pool.cpu_request
        assert container["resources"]["resourceMemoryLimit"] == pool.memory_request
        assert k8s["securityContext"] == {"runAsUser": "10001", "runAsGroup": "10001", "runAsNonRoot": True}
        cache = next(m for m in k8s["emptyDirMounts"] if m["mountPath"] == "/cache")
        assert cache["sizeLimit"] == pool.ephemeral_storage_request and "medium" not in cache
        image_name = {"cpu": "flashdraft-base", "inference": "flashdraft-inference",
                      "trainer": "flashdraft-trainer"}[pool_name]
        assert container["image"] == f"registry.example/team/{image_name}:abc123"
        assert not any("pip install" in part for part in container["command"]), "install_kfp_package=False"
        if exe in GPU_EXECUTORS:
            acc = container["resources"]["accelerator"]
            assert acc["resourceType"] == "nvidia.com/gpu"
            assert f"{pool_name}_gpus" in acc["resourceCount"]
            shm = next(m for m in k8s["emptyDirMounts"] if m["mountPath"] == "/dev/shm")
            assert (shm["medium"], shm["sizeLimit"]) == ("Memory", pool.shm_size)
        else:
            assert "accelerator" not in container["resources"]
            assert [m["mountPath"] for m in k8s["emptyDirMounts"]] == ["/cache"]


def test_compiled_spec_retries_caching_and_parameters(tmp_path, monkeypatch):
    cfg, text, docs = _compile(tmp_path, monkeypatch)
    spec = docs[0]
    tasks = _all_tasks(spec)
    for name, task in tasks.items():
        if "componentRef" in task and not name.startswith(("for-loop", "exit-handler")):
            assert not task.get("cachingOptions", {}).get("enableCaching"), f"{name}: caching must be off"
            retry = task.get("retryPolicy")
            if name in ("generate", "extract", "train", "evaluate"):
                assert retry["maxRetryCount"] == RETRIES["num_retries"]
                assert retry["backoffDuration"] == RETRIES["backoff_duration"]
            else:
                assert retry is None, name
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["trainer_gpus"]["defaultValue"] == cfg.pools.trainer.accelerator_count == 8
    assert params["trainer_node_selector"]["defaultValue"] == cfg.pools.trainer.node_selector
    assert params["inference_tolerations"]["defaultValue"] == cfg.pools.inference.tolerations
    assert params["s3_secret_name"]["defaultValue"] == "flashdraft-s3"
    assert params["tracking_secret_name"]["defaultValue"] == "flashdraft-tracking"
    assert params["hub_secret_name"]["defaultValue"] == "flashdraft-hub"
    assert yaml.safe_load(params["config_yaml"]["defaultValue"])["run_id"] == cfg.run_id
    assert tasks["report"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED", "exit handler"
    assert SENTINEL_KEY not in text and SENTINEL_SECRET not in text


@pytest.mark.parametrize("overrides", [[], ["training.num_nodes=2"], ["mode.kind=streaming"]],
                         ids=["offline", "multinode", "streaming"])
def test_every_task_takes_tracker_and_hub_settings_from_optional_secrets(tmp_path, monkeypatch, overrides):
    """Every executor (each stage, the report, the TrainJob launcher, stream-end) mounts the tracking Secret named
    by the `tracking_secret_name` parameter and the Hub Secret (HF_TOKEN, HF_ENDPOINT) named by `hub_secret_name`,
    both optionally (a cluster without trackers, or reading only public repositories, still runs), beside the
    required S3 Secret; the compiled file holds no tracker or Hub setting from the compiling environment."""
    _, text, (spec, platform) = _compile(tmp_path, monkeypatch, overrides)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(spec["deploymentSpec"]["executors"]), "an executor without placement"
    for exe, k8s in executors.items():
        by_param = {s["secretNameParameter"]["componentInputParameter"].removeprefix("pipelinechannel--"): s
                    for s in k8s["secretAsEnv"]}
        assert set(by_param) == {"s3_secret_name", "tracking_secret_name", "hub_secret_name"}, exe
        for param, keys in (("tracking_secret_name", TRACKING_SECRET_KEYS), ("hub_secret_name", HUB_SECRET_KEYS)):
            assert by_param[param]["optional"] is True, (exe, param)
            assert [(e["secretKey"], e["envVar"]) for e in by_param[param]["keyToEnv"]] == [
                (key, key) for key in keys], (exe, param)
        assert [e["secretKey"] for e in by_param["s3_secret_name"]["keyToEnv"]] == list(S3_SECRET_KEYS), exe
        assert not any("secretName" in s for s in k8s["secretAsEnv"]), f"{exe}: a literal Secret name"
    for param in ("tracking_secret_name", "hub_secret_name"):
        assert spec["root"]["inputDefinitions"]["parameters"][param]["parameterType"] == "STRING"
    leaked = [name for name, value in (TRACKER_SENTINELS | HUB_SENTINELS).items() if value in text]
    assert not leaked, f"the compiled pipeline holds {leaked} from the compiling environment"


def test_offline_trains_after_extraction_streaming_alongside(tmp_path, monkeypatch):
    _, _, offline = _compile(tmp_path, monkeypatch)
    _, _, streaming = _compile(tmp_path, monkeypatch, ["mode.kind=streaming"], name="s.yaml")

    def loops_before_train(spec):
        tasks = _all_tasks(spec)
        loop_of = {name: task["componentRef"]["name"] for name, task in tasks.items() if name.startswith("for-loop")}
        inner = {name: set(spec["components"][comp]["dag"]["tasks"]) for name, comp in loop_of.items()}
        return {stage for loop in tasks["train"]["dependentTasks"] for stage in inner.get(loop, ())}

    assert loops_before_train(offline[0]) == {"generate", "extract"}
    assert loops_before_train(streaming[0]) == {"generate"}, "streaming: train runs beside the extract loop"
    assert "extract" in _all_tasks(streaming[0]), "the cluster DAG still has the extract producers"


def test_multinode_compiles_a_trainjob_launcher_on_the_cpu_pool(tmp_path, monkeypatch):
    _, _, docs = _compile(tmp_path, monkeypatch, ["training.num_nodes=2"])
    spec, platform = docs
    tasks = _all_tasks(spec)
    assert "train-multinode" in tasks and "train" not in tasks
    container = spec["deploymentSpec"]["executors"]["exec-train-multinode"]["container"]
    assert "accelerator" not in container["resources"]
    assert container["image"].endswith("/flashdraft-base:abc123")
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-multinode"]
    assert k8s["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith("cpu_node_selector")
    # the TrainJob's nodes take the same Secrets by name (secretKeyRef): the launcher gets the names, not values
    args = tasks["train-multinode"]["inputs"]["parameters"]
    for name in ("s3_secret_name", "tracking_secret_name", "hub_secret_name"):
        assert args[name]["componentInputParameter"] == f"pipelinechannel--{name}", name


def test_evaluate_only_compiles_without_generate_extract_and_train(tmp_path, monkeypatch):
    """A pretrained drafter with training.max_steps 0: plan gate, prep, evaluate, export (and the report), evaluate
    right after prep; the gate is told the compiled shape."""
    _, _, docs = _compile(tmp_path, monkeypatch, ["drafter.init=pretrained", "training.max_steps=0",
                                                  "drafter.init_from=hf:z-lab/Qwen3.6-27B-DFlash"])
    tasks = _all_tasks(docs[0])
    assert {"plan-gate", "prep", "evaluate", "export", "report"} <= set(tasks)
    assert not {"generate", "extract", "train", "train-multinode", "stream-end"} & set(tasks)
    assert not [t for t in tasks if t.startswith("for-loop")], "no per-shard loops"
    assert tasks["evaluate"]["dependentTasks"] == ["prep"]
    assert sorted(tasks["export"]["dependentTasks"]) == ["evaluate"]
    gate = tasks["plan-gate"]["inputs"]["parameters"]["compiled_evaluate_only"]
    assert gate["runtimeValue"]["constant"] is True


def test_compile_cli_writes_both_documents(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDRAFT_IMAGE_REGISTRY", "reg.local/x")
    monkeypatch.setenv("FLASHDRAFT_IMAGE_TAG", "t1")
    out = tmp_path / "build" / "pipeline.yaml"
    result = CliRunner().invoke(app, ["compile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == 2
    images = {e["container"]["image"] for e in docs[0]["deploymentSpec"]["executors"].values()}
    assert images == {f"reg.local/x/flashdraft-{n}:t1" for n in ("base", "inference", "trainer")}


def test_streaming_stream_end_runs_after_the_extract_loop_even_on_failure(tmp_path, monkeypatch):
    _, _, docs = _compile(tmp_path, monkeypatch, ["mode.kind=streaming"])
    tasks = _all_tasks(docs[0])
    end = tasks["stream-end"]
    assert end["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    (loop,) = end["dependentTasks"]
    assert "extract" in docs[0]["components"][tasks[loop]["componentRef"]["name"]]["dag"]["tasks"]


def test_dataset_responses_compile_without_generate_extract_follows_prep(tmp_path, monkeypatch):
    """data.responses=dataset: prep writes the responses, so no generate task; the gate is told the shape."""
    _, _, docs = _compile(tmp_path, monkeypatch, ["data.responses=dataset"])
    tasks = _all_tasks(docs[0])
    assert "generate" not in tasks and {"prep", "extract", "train", "evaluate", "export"} <= set(tasks)
    assert "exec-generate" not in docs[0]["deploymentSpec"]["executors"]
    loops = [name for name in tasks if name.startswith("for-loop")]
    assert len(loops) == 1 and tasks[loops[0]]["dependentTasks"] == ["prep"], "one per-shard loop: extract"
    gate = tasks["plan-gate"]["inputs"]["parameters"]["compiled_responses"]
    assert gate["runtimeValue"]["constant"] == "dataset"
    _, _, streaming = _compile(tmp_path, monkeypatch, ["data.responses=dataset", "mode.kind=streaming"], "s.yaml")
    stream_tasks = _all_tasks(streaming[0])
    assert "generate" not in stream_tasks and stream_tasks["train"]["dependentTasks"] == ["prep"]


def test_the_plan_gate_refuses_a_data_responses_the_dag_was_not_compiled_for():
    from flashdraft.config import ConfigError
    from flashdraft.pipelines.runtime import check_compiled_shape

    cfg = load_config(preset="tiny")
    dataset = cfg.with_overrides({"data.responses": "dataset"})
    check_compiled_shape(dataset, "offline", 1, compiled_responses="dataset")
    with pytest.raises(ConfigError, match=r"data.responses=dataset but this pipeline was compiled for "
                                          r"data.responses=target \(with a generate task\)"):
        check_compiled_shape(dataset, "offline", 1)
    with pytest.raises(ConfigError, match=r"recompile with `flashdraft compile --set data.responses=target`"):
        check_compiled_shape(cfg, "offline", 1, compiled_responses="dataset")
