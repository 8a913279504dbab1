"""The cluster contract without a cluster: what the API server, the Kubeflow Trainer CRD, a policy scanner and the
scheduler's inputs would say about what flashdraft ships, checked by maintained tools, for every values file.

For the default values and each helm/flashdraft/ci/*.yaml, the chart's pipeline is compiled as `make chart-pipeline
VALUES=<file>` does (the ci file that turns multi-node on also with `COMPILE_ARGS="--set training.num_nodes=4"`),
and the chart is rendered by the real helm with that pipeline in files/pipeline.yaml. Then:
- every manifest validates strictly (unknown fields fail) against the Kubernetes OpenAPI schemas of the oldest and
  the newest Kubernetes the chart supports (Chart.yaml `kubeVersion`'s lower bound; it has no upper bound, so the
  newest is the newest kubernetes-validate ships), and helm accepts both as the target version;
- the TrainJob the multi-node launcher creates (rendered from the compiled launcher task's own arguments) passes the
  TrainJob CRD's openAPIV3Schema and every x-kubernetes-validations rule, evaluated by a CEL interpreter
  (tests/support/crd.py);
- checkov scans the rendered manifests and docker/*/Dockerfile; a finding passes only if
  tests/integration/checkov_accepted.yaml lists it with its reason, and every entry there must still fire;
- every task's node selector, tolerations and GPU request, read out of the compiled pipeline (support/kfp_pods.py),
  are those of the pool its values assign, and so are the TrainJob's node pods.
- every stage pod (validated strictly as a Pod) and the TrainJob's nodes take the S3 keys from the s3_secret_name
  Secret, required, and the trackers' variables from the tracking_secret_name Secret and the Hub's HF_TOKEN and
  HF_ENDPOINT from the hub_secret_name Secret, optionally; a run started with the chart's parameters.yaml names
  the chart's Secrets.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor
from support.crd import CrdValidator
from support.helm_chart import (
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    ROOT,
    chart_run_config,
    helm_run,
    value_args,
    values_id,
)
from support.kfp_pods import STAGE_POOL, CompiledPipeline, trainjob_node_pod

from flashdraft.config import RunConfig, load_config
from flashdraft.pipelines.pipeline import compile_pipeline
from flashdraft.pipelines.placement import APP_UID
from flashdraft.pipelines.runtime import stage_config
from flashdraft.pipelines.secret_env import HUB_SECRET_KEYS, S3_SECRET_KEYS, TRACKING_SECRET_KEYS
from flashdraft.pipelines.trainjob import JOBSET_NAME_LABEL, WRITABLE, render_trainjob

pytestmark = pytest.mark.helm

VALUES_FILES = [None, *CI_VALUES]
PRESET = "qwen3.6-27b"
REGISTRY, TAG = "registry.example.com/ml", "contract"
# The compile arguments `make chart-pipeline` takes with a values file (COMPILE_ARGS), where the values need them.
COMPILE_OVERRIDES = {"multinode-values": {"training.num_nodes": 4}}
# In CI the repository is cloned beside shared/ (docs/testing.md).
TRAINJOB_CRD = ROOT.parent / "shared" / "k8s" / "trainer.kubeflow.org_trainjobs.yaml"
LAUNCHER = "exec-train-multinode"
LAUNCHER_ARGS = ("image", "node_selector", "tolerations", "gpus_per_node", "s3_secret_name", "tracking_secret_name",
                 "hub_secret_name", "runtime_ref")
CHECKOV_ACCEPTED = Path(__file__).with_name("checkov_accepted.yaml")
DOCKERFILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docker").glob("*/Dockerfile"))


def merged_values(values: Path | None) -> dict[str, Any]:
    """The chart's values with `values` over them, as helm merges them (maps key by key; null deletes a key)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, val in over.items():
            if val is None:
                out.pop(key, None)
            elif isinstance(val, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], val)
            else:
                out[key] = val
        return out

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(defaults, yaml.safe_load(values.read_text()) if values else {})


@dataclass(frozen=True)
class Release:
    """One values file as a cluster gets it: the pipeline compiled for it, and the chart rendered with both."""

    name: str
    values: dict[str, Any]
    pipeline: CompiledPipeline
    manifests: list[Path]

    def docs(self) -> list[dict[str, Any]]:
        return [d for m in self.manifests for d in yaml.safe_load_all(m.read_text()) if d]


@pytest.fixture(scope="session")
def releases(helm, tmp_path_factory) -> dict[str, Release]:
    """values id -> Release: `make chart-pipeline VALUES=<file>` and `helm template -f <file>`, in a scratch copy
    of the chart (the working tree's files/pipeline.yaml is neither needed nor touched)."""
    out: dict[str, Release] = {}
    for values in VALUES_FILES:
        name = values_id(values)
        work = tmp_path_factory.mktemp(f"contract-{name}")
        chart = work / "flashdraft"
        shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("pipeline.yaml"))
        (work / "run.yaml").write_text(chart_run_config(helm, chart, values, PRESET))
        cfg = load_config(work / "run.yaml", overrides=COMPILE_OVERRIDES.get(name))
        compile_pipeline(cfg, str(chart / "files" / "pipeline.yaml"), REGISTRY, TAG)
        helm_run(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, *value_args(values),
                 "--output-dir", str(work / "rendered"))
        pipeline = CompiledPipeline(*yaml.safe_load_all((chart / "files" / "pipeline.yaml").read_text()))
        out[name] = Release(name, merged_values(values), pipeline, sorted((work / "rendered").rglob("*.yaml")))
    return out


def _supported_versions() -> tuple[str, str]:
    """(oldest, newest) Kubernetes minor the chart supports: Chart.yaml's kubeVersion lower bound, and the newest
    kubernetes-validate has schemas for (the range is open above)."""
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+\.\d+)\.\d+(-0)?", constraint.strip())
    assert match, f"Chart.yaml kubeVersion {constraint!r}: expected an open range '>=1.N.0-0' (see its comment)"
    return match.group(1), major_minor(latest_version())


OLDEST, NEWEST = _supported_versions()


def test_the_supported_range_is_a_real_range_and_helm_enforces_its_bound(helm, tmp_path):
    assert tuple(map(int, OLDEST.split("."))) < tuple(map(int, NEWEST.split(".")))
    chart = tmp_path / "flashdraft"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("pipeline.yaml"))
    off = ("--set", "pipeline.upload.enabled=false")
    for version in (OLDEST, NEWEST):
        helm_run(helm, "template", RELEASE, str(chart), *off, "--kube-version", f"{version}.0")
    older = f"1.{int(OLDEST.split('.')[1]) - 1}.0"
    proc = helm_run(helm, "template", RELEASE, str(chart), *off, "--kube-version", older, check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr, proc.stderr


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("values", VALUES_FILES, ids=values_id)
def test_every_manifest_validates_strictly_against_the_kubernetes_schemas(releases, values, version):
    docs = releases[values_id(values)].docs()
    assert len(docs) >= 8
    failures = []
    for doc in docs:
        where = f"{doc['kind']} {doc['metadata']['name']}"
        try:  # a kind without a schema raises too: nothing passes unchecked
            assert kubernetes_validate.validate(doc, version, strict=True) == version
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not failures, f"against Kubernetes {version}:\n" + "\n".join(failures)


def test_strict_validation_catches_an_unknown_and_a_mistyped_field(releases):
    job = next(d for d in releases["default"].docs() if d["kind"] == "Job")
    for version in (OLDEST, NEWEST):
        unknown = copy.deepcopy(job)
        unknown["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
        mistyped = copy.deepcopy(job)
        mistyped["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = [1]
        for bad in (unknown, mistyped):
            with pytest.raises(kubernetes_validate.ValidationError):
                kubernetes_validate.validate(bad, version, strict=True)


# --- the TrainJob against the Kubeflow Trainer CRD ---------------------------------------------------------------


@pytest.fixture(scope="session")
def trainjob_crd() -> CrdValidator:
    if not TRAINJOB_CRD.is_file():
        pytest.fail(f"{TRAINJOB_CRD} is missing: the Kubeflow Trainer TrainJob CRD comes with shared/ beside the clone")
    return CrdValidator(TRAINJOB_CRD)


# A train task fingerprint as flashdraft/run/runner.py makes them (16 hex digits): the launcher puts it on the job.
FINGERPRINT = "0123456789abcdef"


def launcher_trainjob(pipeline: CompiledPipeline, namespace: str) -> tuple[RunConfig, dict[str, Any]]:
    """The TrainJob the multi-node launcher task creates, from the arguments the compiled pipeline passes it by
    default (as its component body does: the config it ships, KFP's float GPU count as an int)."""
    cfg = stage_config(pipeline.task_input(LAUNCHER, "config_yaml"), pipeline.task_input(LAUNCHER, "overrides"))
    args = {arg: pipeline.task_input(LAUNCHER, arg) for arg in LAUNCHER_ARGS}
    args["gpus_per_node"] = int(args["gpus_per_node"])
    return cfg, render_trainjob(cfg, fingerprint=FINGERPRINT, namespace=namespace, **args)


@pytest.fixture(scope="session")
def trainjobs(releases, tmp_path_factory) -> dict[str, tuple[RunConfig, dict[str, Any]]]:
    """The chart's multi-node release's TrainJob, and the one of `make compile` with the preset at 4 nodes."""
    chart_release = releases["multinode-values"]
    namespace = chart_release.values["multiNode"]["trainJobNamespace"]
    path = tmp_path_factory.mktemp("compile") / "pipeline.yaml"
    compile_pipeline(load_config(preset=PRESET, overrides={"training.num_nodes": 4}), str(path), REGISTRY, TAG)
    preset_pipeline = CompiledPipeline(*yaml.safe_load_all(path.read_text()))
    return {"chart-multinode": launcher_trainjob(chart_release.pipeline, namespace),
            "make-compile": launcher_trainjob(preset_pipeline, "team")}


def test_every_crd_rule_compiles_and_reads_only_self_and_old_self(trainjob_crd):
    assert len(trainjob_crd.rules) >= 15, "the CRD lost its validation rules: is this the Trainer CRD?"
    for rule in trainjob_crd.rules:
        program = cel.compile(rule.rule)
        assert set(program.variables()) <= {"self", "oldSelf"}, (rule.path, rule.rule)


@pytest.mark.parametrize("source", ["chart-multinode", "make-compile"])
def test_the_launchers_trainjob_passes_the_crd_schema_and_rules(trainjob_crd, trainjobs, source):
    _, job = trainjobs[source]
    assert job["spec"]["trainer"]["numNodes"] == 4
    assert trainjob_crd.errors(job) == []
    # Re-applied unchanged (a retried launcher): the immutability rules hold too.
    assert trainjob_crd.rule_errors(job, old=copy.deepcopy(job)) == []
    checked = {r.path for r in trainjob_crd.rules if not r.transition}
    assert {"", "spec.trainer.numProcPerNode"} <= checked
    # what a retried launcher compares before adopting it (pipelines/trainjob.py `adoption`)
    meta = job["metadata"]
    assert meta["annotations"]["flashdraft.io/task-fingerprint"] == FINGERPRINT
    assert meta["labels"]["flashdraft.io/task-fingerprint"] == FINGERPRINT


def _broken(job: dict[str, Any], change) -> dict[str, Any]:
    bad = copy.deepcopy(job)
    change(bad)
    return bad


@pytest.mark.parametrize(("change", "error"), [
    (lambda j: j["spec"]["trainer"].update(numProcPerNode=0),
     "spec.trainer.numProcPerNode: numProcPerNode must be greater than or equal to 1"),
    (lambda j: j["metadata"].update(name="My_Run-train"), "<root>: metadata.name must match RFC 1035"),
    (lambda j: j["metadata"].update(name="r" * 64), "<root>: metadata.name must be no more than 63 characters"),
    (lambda j: j["spec"].update(managedBy="someone-else"), "spec.managedBy: ManagedBy must be"),
], ids=["numProcPerNode-0", "name-not-dns-label", "name-too-long", "managedBy-unknown"])
def test_a_trainjob_breaking_a_cel_rule_is_refused(trainjob_crd, trainjobs, change, error):
    _, job = trainjobs["chart-multinode"]
    errors = trainjob_crd.errors(_broken(job, change))
    assert any(e.startswith(error) for e in errors), errors


def test_changing_an_immutable_field_on_update_is_refused(trainjob_crd, trainjobs):
    _, job = trainjobs["chart-multinode"]
    new = _broken(job, lambda j: j["spec"]["trainer"].update(numNodes=8))
    assert trainjob_crd.rule_errors(new) == [], "on create there is no old object: transition rules do not apply"
    assert "spec.trainer: field is immutable (self == oldSelf)" in trainjob_crd.rule_errors(new, old=job)


@pytest.mark.parametrize(("change", "error"), [
    (lambda j: j["spec"].update(podTemplateOverrides=[]), "spec: Additional properties are not allowed "
                                                         "('podTemplateOverrides' was unexpected)"),
    (lambda j: j["spec"]["trainer"].update(numNodes="four"), "spec.trainer.numNodes: 'four' is not of type"),
    (lambda j: j["spec"]["trainer"]["resourcesPerNode"]["limits"].update({"nvidia.com/gpu": 8.5}),
     "spec.trainer.resourcesPerNode.limits.nvidia.com/gpu: 8.5 is not valid under any of the given schemas"),
    (lambda j: j["spec"].pop("runtimeRef"), "spec: 'runtimeRef' is a required property"),
    (lambda j: j.update(apiVersion="trainer.kubeflow.org/v1"), "<root>: trainer.kubeflow.org/v1/TrainJob is not"),
], ids=["stale-field", "numNodes-string", "gpu-float", "no-runtimeRef", "wrong-version"])
def test_a_trainjob_breaking_the_schema_is_refused(trainjob_crd, trainjobs, change, error):
    _, job = trainjobs["make-compile"]
    errors = trainjob_crd.errors(_broken(job, change))
    assert any(e.startswith(error) for e in errors), errors


# --- policy scan -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    check: str
    where: str  # a Dockerfile's path, or Kind/namespace/name of a rendered object

    def __str__(self) -> str:
        return f"{self.check} {self.where}"


def _checkov() -> str:
    exe = os.environ.get("FLASHDRAFT_CHECKOV") or str(ROOT / ".venv-checkov" / "bin" / "checkov")
    if not Path(exe).is_file():
        pytest.fail(f"{exe} is missing: run `make checkov-venv` (checkov in its own venv: its pins clash with ours)")
    return exe


@dataclass(frozen=True)
class Scan:
    """One checkov run: each failed finding with the values files it fires for ("docker" for a Dockerfile), and
    the ids of the checks that passed somewhere."""

    failed: dict[Finding, set[str]]
    passed: set[str]
    resources: set[str]  # Kind/namespace/name of every object scanned


# The pods that run outside the chart, scanned with it: each stage pod of the compiled pipeline (as KFP's driver
# builds it, support/kfp_pods.py) and the TrainJob's node pod, as Pod/<NAMESPACE>/pipeline-<stage> and
# Pod/<NAMESPACE>/trainjob-node.
PIPELINE_POD, TRAINJOB_POD = "pipeline-", "trainjob-node"
# The label KFP's driver puts on every v2 task pod (a NetworkPolicy written for the chart's pods does not select it).
KFP_POD_LABELS = {"pipelines.kubeflow.org/v2_component": "true"}
# What a pipeline task cannot set through kfp-kubernetes 2.17, by check: every stage pod fails it until the cluster
# sets it (docs/security.md, "What a pipeline cannot set"). Not an accepted finding: it applies to the stage pods
# only, and a test checks it still fires on each of them (remove it when KFP can set it).
KFP_CANNOT_SET = {"CKV_K8S_22": "readOnlyRootFilesystem: kfp-kubernetes sets only runAsUser/runAsGroup/runAsNonRoot"}


def _pod_manifest(name: str, spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": spec}


def _outside_pods(releases, trainjobs, folder: Path) -> dict[str, str]:
    """Write each release's stage pods and each TrainJob's node pod to `folder`; file -> values id."""
    written = {}
    for release in releases.values():
        for pod in release.pipeline.stage_pods():
            path = folder / f"{release.name}-{pod.executor}.yaml"
            path.write_text(yaml.safe_dump(_pod_manifest(PIPELINE_POD + pod.stage, pod.spec, KFP_POD_LABELS)))
            written[str(path)] = release.name
    for source, (_, job) in trainjobs.items():
        path = folder / f"trainjob-{source}.yaml"
        labels = {JOBSET_NAME_LABEL: job["metadata"]["name"]}
        path.write_text(yaml.safe_dump(_pod_manifest(TRAINJOB_POD, trainjob_node_pod(job), labels)))
        written[str(path)] = source
    return written


@pytest.fixture(scope="session")
def checkov_scan(releases, trainjobs, tmp_path_factory) -> Scan:
    """checkov once over every rendered manifest, the pipeline's and the TrainJob's pods, and every Dockerfile
    (offline: --skip-download)."""
    values_of = {str(m): r.name for r in releases.values() for m in r.manifests}
    values_of.update(_outside_pods(releases, trainjobs, tmp_path_factory.mktemp("outside-pods")))
    files = list(values_of)
    proc = subprocess.run(
        [_checkov(), "--framework", "kubernetes", "dockerfile", "--skip-download", "--compact",
         "-o", "json", *[a for f in [*files, *DOCKERFILES] for a in ("-f", f)]],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == {"kubernetes", "dockerfile"}, [r["check_type"] for r in reports]
    for report in reports:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        assert report["summary"]["passed"] > 0
    found: dict[Finding, set[str]] = {}
    passed = {r["check_id"] for report in reports for r in report["results"]["passed_checks"]}
    resources = {"/".join(r["resource"].split(".")[:3]) for report in reports if report["check_type"] == "kubernetes"
                 for kind in ("passed_checks", "failed_checks") for r in report["results"][kind]}
    for report in reports:
        for result in report["results"]["failed_checks"]:
            if report["check_type"] == "dockerfile":
                finding, where = Finding(result["check_id"], result["file_path"].lstrip("/")), "docker"
            else:
                kind, namespace, name = result["resource"].split(".")[:3]
                finding = Finding(result["check_id"], f"{kind}/{namespace}/{name}")
                where = values_of[result["file_abs_path"]]
            found.setdefault(finding, set()).add(where)
    return Scan(found, passed, resources)


def _accepted() -> dict[Finding, str]:
    entries = yaml.safe_load(CHECKOV_ACCEPTED.read_text())
    accepted = {}
    for entry in entries:
        assert set(entry) == {"check", "where", "reason"} and entry["reason"].strip(), entry
        accepted[Finding(entry["check"], entry["where"])] = entry["reason"]
    assert len(accepted) == len(entries), "an accepted finding is listed twice"
    return accepted


def _matches(entry: Finding, finding: Finding) -> bool:
    """An accepted entry's `where` may end in * (every stage pod: Pod/<ns>/pipeline-*)."""
    return entry.check == finding.check and fnmatch.fnmatchcase(finding.where, entry.where)


def _outside_pod(where: str) -> bool:
    return where.startswith(f"Pod/{NAMESPACE}/{PIPELINE_POD}") or where == f"Pod/{NAMESPACE}/{TRAINJOB_POD}"


def _kfp_cannot_set(finding: Finding) -> bool:
    return finding.check in KFP_CANNOT_SET and finding.where.startswith(f"Pod/{NAMESPACE}/{PIPELINE_POD}")


def test_checkov_finds_nothing_new_and_every_accepted_finding_still_fires(checkov_scan):
    accepted = _accepted()
    new = sorted(str(f) + f" (values: {', '.join(sorted(v))})" for f, v in checkov_scan.failed.items()
                 if not _kfp_cannot_set(f) and not any(_matches(a, f) for a in accepted))
    stale = sorted(str(a) for a in accepted if not any(_matches(a, f) for f in checkov_scan.failed))
    assert not new, f"checkov findings: fix them, or accept each in {CHECKOV_ACCEPTED.name} with a reason:\n" + \
        "\n".join(new)
    assert not stale, f"{CHECKOV_ACCEPTED.name} lists findings that no longer fire: remove them\n" + "\n".join(stale)


# The checks issue 39 names; none may be among the accepted findings.
REQUIRED_POLICIES = {
    "CKV_K8S_20": "no privilege escalation", "CKV_K8S_23": "non-root containers", "CKV_K8S_40": "a high UID",
    "CKV_K8S_17": "no host PID", "CKV_K8S_18": "no host IPC", "CKV_K8S_19": "no host network",
    "CKV_K8S_16": "not privileged", "CKV_K8S_22": "read-only root filesystem", "CKV_K8S_10": "CPU requests",
    "CKV_K8S_11": "CPU limits", "CKV_K8S_12": "memory requests", "CKV_K8S_13": "memory limits",
    "CKV_K8S_28": "no NET_RAW", "CKV_DOCKER_3": "a non-root USER in the image", "CKV_DOCKER_8": "not USER root last",
}


def test_the_required_policies_ran_and_are_never_accepted(checkov_scan):
    assert not {f.check for f in _accepted()} & set(REQUIRED_POLICIES)
    missing = {c: what for c, what in REQUIRED_POLICIES.items() if c not in checkov_scan.passed}
    assert not missing, f"checkov no longer runs (or nothing passes) these checks: {missing}"


def test_the_pipelines_and_the_trainjobs_pods_break_no_required_policy(releases, checkov_scan):
    """The stage pods and the TrainJob's nodes were scanned, and the only required policy a stage pod fails is
    what kfp-kubernetes cannot set (each stage pod still fails it: the list is not stale); a TrainJob node fails
    none."""
    broken = {f: v for f, v in checkov_scan.failed.items() if f.check in REQUIRED_POLICIES}
    outside = {f for f in broken if _outside_pod(f.where)}
    assert {f for f in outside if not _kfp_cannot_set(f)} == set(), sorted(map(str, outside))
    stages = {pod.stage for r in releases.values() for pod in r.pipeline.stage_pods()}
    for check in KFP_CANNOT_SET:
        assert {f.where for f in outside if f.check == check} == {
            f"Pod/{NAMESPACE}/{PIPELINE_POD}{stage}" for stage in stages}, check
    scanned = {r for r in checkov_scan.resources if _outside_pod(r)}
    assert scanned == {f"Pod/{NAMESPACE}/{PIPELINE_POD}{s}" for s in stages} | {f"Pod/{NAMESPACE}/{TRAINJOB_POD}"}


def test_the_pods_pin_the_uid_the_images_run_as():
    """The uid the stage pods and the TrainJob's nodes run as (a restricted pod names it) is each image's USER."""
    for dockerfile in DOCKERFILES:
        (uid,) = re.findall(r"^ARG APP_UID=(\d+)$", (ROOT / dockerfile).read_text(), re.M)
        assert int(uid) == APP_UID, dockerfile
    assert yaml.safe_load((CHART / "values.yaml").read_text())["securityContext"]["runAsUser"] == APP_UID
    # the TrainJob node's writable volumes are the images' working directory and the user's home
    assert 'useradd --uid "$APP_UID" --create-home --shell /usr/sbin/nologin flashdraft' in \
        (ROOT / "docker" / "install.sh").read_text()
    assert {"/work", "/home/flashdraft"} <= set(WRITABLE.values())
    assert all(re.search(r"^WORKDIR /work$", (ROOT / d).read_text(), re.M) for d in DOCKERFILES)


def test_dockerfile_base_images_are_pinned():
    """What CKV_DOCKER_7 cannot see through `FROM ${ARG}`: the ARG's default names a version, not latest."""
    for dockerfile in DOCKERFILES:
        text = (ROOT / dockerfile).read_text()
        (arg,) = re.findall(r"^FROM \$\{(\w+)\}", text, re.M)
        (default,) = re.findall(rf"^ARG {arg}=(\S+)$", text, re.M)
        tag = default.rpartition(":")[2]
        assert ":" in default and tag != "latest" and re.search(r"\d", tag), f"{dockerfile}: {arg}={default}"


# --- placement read from the compiled pipeline -------------------------------------------------------------------


def _pool_placement(values: dict[str, Any], pool: str) -> tuple[dict[str, str], list[dict[str, Any]],
                                                                 dict[str, float]]:
    """(node selector, tolerations, accelerator limits as numbers) that `values` assign to `pool`."""
    spec = values["pools"][pool]
    selector = {k: v for k, v in spec["nodeSelector"].items() if v is not None}
    gpus = {spec["acceleratorType"]: float(spec["acceleratorCount"])} if pool != "cpu" and spec["acceleratorType"] \
        else {}
    return selector, spec["tolerations"], gpus


@pytest.mark.parametrize("values", VALUES_FILES, ids=values_id)
def test_every_task_runs_on_the_pool_its_values_assign(releases, values):
    release = releases[values_id(values)]
    pods = release.pipeline.stage_pods()
    assert {p.stage for p in pods} <= set(STAGE_POOL), "a stage was added or renamed: say where it must run"
    assert {"plan", "generate", "extract", "evaluate"} <= {p.stage for p in pods}
    for pod in pods:
        selector, tolerations, gpus = _pool_placement(release.values, STAGE_POOL[pod.stage])
        limits = pod.spec["containers"][0]["resources"]["limits"]
        assert pod.spec.get("nodeSelector", {}) == selector, pod.stage
        assert pod.spec.get("tolerations", []) == tolerations, pod.stage
        # KFP hands the GPU-count parameter over as a JSON number ("1.0" in the pod: the same quantity as 1)
        assert {k: float(v) for k, v in limits.items() if k not in ("cpu", "memory")} == gpus, pod.stage


def test_the_trainjobs_nodes_run_on_the_trainer_pool(releases, trainjobs):
    release = releases["multinode-values"]
    assert "train-launcher" in {p.stage for p in release.pipeline.stage_pods()}
    selector, tolerations, gpus = _pool_placement(release.values, "trainer")
    _, job = trainjobs["chart-multinode"]
    (node,) = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == selector and pod["tolerations"] == tolerations
    assert {k: float(v) for k, v in job["spec"]["trainer"]["resourcesPerNode"]["limits"].items()
            if k not in ("cpu", "memory", "ephemeral-storage")} == gpus


# --- credentials: the Secrets every pod takes its env from ------------------------------------------------------


def _secret_env(env: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """env name -> its secretKeyRef, for the entries that come from a Secret."""
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}


def _expected_secret_env(s3: str, tracking: str, hub: str) -> dict[str, dict[str, Any]]:
    return {**{k: {"name": s3, "key": k} for k in S3_SECRET_KEYS},
            **{k: {"name": tracking, "key": k, "optional": True} for k in TRACKING_SECRET_KEYS},
            **{k: {"name": hub, "key": k, "optional": True} for k in HUB_SECRET_KEYS}}


@pytest.mark.parametrize("values", VALUES_FILES, ids=values_id)
def test_every_pod_takes_s3_keys_required_and_tracker_settings_optionally(releases, values):
    """Each stage pod as KFP's driver builds it (and validated as a Pod, strictly), and the TrainJob's nodes: the
    S3 keys from the s3_secret_name Secret, required; the tracker variables from the tracking_secret_name Secret,
    optional, so a cluster without that Secret still runs."""
    release = releases[values_id(values)]
    pipeline_params = release.pipeline.spec["root"]["inputDefinitions"]["parameters"]
    want = _expected_secret_env(*(pipeline_params[f"{name}_secret_name"]["defaultValue"]
                                  for name in ("s3", "tracking", "hub")))
    for pod in release.pipeline.stage_pods():
        (container,) = pod.spec["containers"]
        assert _secret_env(container["env"]) == want, pod.stage
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.stage}, "spec": pod.spec}
        for version in (OLDEST, NEWEST):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_trainjobs_nodes_take_the_same_secret_env(trainjobs):
    for source, (_, job) in trainjobs.items():
        assert _secret_env(job["spec"]["trainer"]["env"]) == _expected_secret_env(
            "flashdraft-s3", "flashdraft-tracking", "flashdraft-hub"), source


def _run_with_parameters(pipeline: CompiledPipeline, parameters: dict[str, Any]) -> CompiledPipeline:
    """The pipeline as KFP runs it when a run is created with `parameters` (the chart's parameters.yaml): each
    root parameter resolves to the run's value instead of the compiled default."""
    spec = copy.deepcopy(pipeline.spec)
    for name, value in parameters.items():
        spec["root"]["inputDefinitions"]["parameters"][name]["defaultValue"] = value
    return CompiledPipeline(spec, {"platforms": {"kubernetes": {"deploymentSpec": {"executors": pipeline.k8s}}}})


@pytest.mark.parametrize("values", VALUES_FILES, ids=values_id)
def test_a_run_with_the_charts_parameters_takes_the_charts_secrets(releases, values):
    """Started with the run parameters the chart writes (parameters.yaml), every stage pod and, multi-node, the
    TrainJob's nodes take their env from the Secrets the chart names: existing-secret-values names its own S3,
    tracking and Hub Secrets (hub.existingSecret), the others the chart's `<fullname>-*`."""
    release = releases[values_id(values)]
    (defaults,) = [d for d in release.docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith(
        "-defaults")]
    parameters = yaml.safe_load(defaults["data"]["parameters.yaml"])
    hub = release.values["hub"]["existingSecret"] or f"{RELEASE}-hub"
    assert parameters["hub_secret_name"] == defaults["data"]["hubSecretName"] == hub
    want = _expected_secret_env(parameters["s3_secret_name"], parameters["tracking_secret_name"], hub)
    run = _run_with_parameters(release.pipeline, parameters)
    for pod in run.stage_pods():
        (container,) = pod.spec["containers"]
        assert _secret_env(container["env"]) == want, pod.stage
    if LAUNCHER in run.containers:
        _, job = launcher_trainjob(run, "team")
        assert _secret_env(job["spec"]["trainer"]["env"]) == want
