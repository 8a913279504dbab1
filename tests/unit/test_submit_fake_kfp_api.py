"""`flashdraft submit` / `upload-pipeline` against a local stand-in for the KFP v2beta1 REST API.

No KFP API server can run here, so a small HTTP server keeps pipelines/versions/experiments/runs in memory and
records every request; the tests assert what the CLI sent (and that a second submit uploads nothing new).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.config import dump_config, load_config
from flashdraft.pipelines.pipeline import ClusterDefaults, compile_pipeline

TOKEN = "sa-token-value-must-not-be-printed"


class FakeKfp:
    def __init__(self):
        self.requests: list[dict] = []
        self.pipelines: dict[str, dict] = {}  # id -> {display_name, versions: {id: name}, files: [bytes]}
        self.experiments: dict[str, str] = {}
        self.runs: list[dict] = []

    def handle(self, method, path, query, headers, body):
        self.requests.append({"method": method, "path": path, "query": query, "auth": headers.get("Authorization"),
                              "body": body})
        api = "/apis/v2beta1"
        name = json.loads(query["filter"])["predicates"][0]["stringValue"] if "filter" in query else None
        if method == "GET" and path == f"{api}/pipelines":
            return {"pipelines": [{"pipeline_id": pid, "display_name": p["display_name"]}
                                  for pid, p in self.pipelines.items() if p["display_name"] == name]}
        if method == "POST" and path == f"{api}/pipelines/upload":
            pid = f"p{len(self.pipelines)}"
            self.pipelines[pid] = {"display_name": query["name"], "versions": {f"{pid}-v0": query["name"]},
                                   "files": [body]}
            return {"pipeline_id": pid, "display_name": query["name"]}
        if method == "GET" and path.startswith(f"{api}/pipelines/") and path.endswith("/versions"):
            versions = self.pipelines[path.split("/")[4]]["versions"]
            return {"pipeline_versions": [{"pipeline_version_id": vid, "display_name": n}
                                          for vid, n in versions.items() if n == name]}
        if method == "POST" and path == f"{api}/pipelines/upload_version":
            p = self.pipelines[query["pipelineid"]]
            vid = f"{query['pipelineid']}-v{len(p['versions'])}"
            p["versions"][vid] = query["name"]
            p["files"].append(body)
            return {"pipeline_version_id": vid, "display_name": query["name"]}
        if method == "GET" and path == f"{api}/experiments":
            return {"experiments": [{"experiment_id": eid, "display_name": n}
                                    for eid, n in self.experiments.items() if n == name]}
        if method == "POST" and path == f"{api}/experiments":
            eid = f"e{len(self.experiments)}"
            self.experiments[eid] = json.loads(body)["display_name"]
            return {"experiment_id": eid}
        if method == "POST" and path == f"{api}/runs":
            run = {"run_id": f"r{len(self.runs)}", **json.loads(body)}
            self.runs.append(run)
            return run
        return None


@pytest.fixture()
def fake_kfp():
    state = FakeKfp()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            url = urllib.parse.urlparse(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            answer = state.handle(self.command, url.path, query, self.headers, body)
            payload = json.dumps(answer if answer is not None else {"error": "not found"}).encode()
            self.send_response(200 if answer is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture()
def package(tmp_path):
    path = tmp_path / "flashdraft-pipeline.yaml"
    compile_pipeline(load_config(preset="qwen3.6-27b"), str(path), registry="reg", tag="t")
    return path


def test_submit_uploads_pipeline_and_version_once_and_creates_runs_fake_kfp_api(fake_kfp, package, tmp_path,
                                                                               monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token_file))
    params = tmp_path / "run.yaml"
    params.write_text(yaml.safe_dump({"overrides": {"training.lr": 0.0003}, "trainer_gpus": 4}))
    args = ["submit", "--package", str(package), "--params", str(params), "--version", "deadbeef",
            "--experiment", "drafters", "--host", fake_kfp.url]

    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert f"{fake_kfp.url}/#/runs/details/r0" in first.output
    assert TOKEN not in first.output
    posts = [r["path"].rsplit("/", 1)[-1] for r in fake_kfp.requests if r["method"] == "POST"]
    assert posts == ["upload", "upload_version", "experiments", "runs"]
    assert all(r["auth"] == f"Bearer {TOKEN}" for r in fake_kfp.requests)
    (pipeline,) = fake_kfp.pipelines.values()
    assert "deadbeef" in pipeline["versions"].values()
    uploaded = pipeline["files"][-1]
    assert package.read_bytes() in uploaded, "the compiled file is uploaded as written (both YAML documents)"
    assert b"platforms:" in uploaded
    run = fake_kfp.runs[0]
    assert run["experiment_id"] == "e0" and run["display_name"] == "flashdraft-deadbeef"
    assert run["pipeline_version_reference"] == {"pipeline_id": "p0", "pipeline_version_id": "p0-v1"}
    assert run["runtime_config"]["parameters"] == {"overrides": {"training.lr": 0.0003}, "trainer_gpus": 4}

    fake_kfp.requests.clear()
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    posts = [r["path"].rsplit("/", 1)[-1] for r in fake_kfp.requests if r["method"] == "POST"]
    assert posts == ["runs"], "pipeline, version and experiment exist: only the run is created"
    assert fake_kfp.runs[1]["pipeline_version_reference"]["pipeline_version_id"] == "p0-v1"


def test_upload_pipeline_adds_only_a_missing_version_fake_kfp_api(fake_kfp, package, monkeypatch):
    monkeypatch.setenv("KFP_BEARER_TOKEN", TOKEN)
    monkeypatch.delenv("KF_PIPELINES_SA_TOKEN_PATH", raising=False)
    base = ["upload-pipeline", "--package", str(package), "--name", "fd", "--host", fake_kfp.url]
    assert CliRunner().invoke(app, [*base, "--version", "v1"]).exit_code == 0
    assert CliRunner().invoke(app, [*base, "--version", "v1"]).exit_code == 0
    assert CliRunner().invoke(app, [*base, "--version", "v2"]).exit_code == 0
    (pipeline,) = fake_kfp.pipelines.values()
    assert sorted(pipeline["versions"].values()) == ["fd", "v1", "v2"]
    uploads = [r for r in fake_kfp.requests if r["method"] == "POST"]
    assert len(uploads) == 3, "pipeline once, then v1 and v2 once each"


def test_submit_dry_run_sends_nothing_and_rejects_unknown_parameters_fake_kfp_api(fake_kfp, package, tmp_path):
    ok = CliRunner().invoke(app, ["submit", "--package", str(package), "--dry-run", "--host", fake_kfp.url])
    assert ok.exit_code == 0, ok.output
    assert fake_kfp.requests == []
    planned = json.loads(ok.output[ok.output.index("\n[") + 1: ok.output.rindex("]") + 1])
    assert [p["path"].rsplit("/", 1)[-1] for p in planned if p["method"] == "POST"] == [
        "upload", "upload_version", "experiments", "runs"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer_gpu: 4\n")
    refused = CliRunner().invoke(app, ["submit", "--package", str(package), "--params", str(bad), "--dry-run"])
    assert refused.exit_code != 0 and "trainer_gpu" in refused.output


def test_version_is_the_image_tag_and_new_images_upload_a_new_version_fake_kfp_api(fake_kfp, tmp_path,
                                                                                  monkeypatch):
    """No --version: the version is the tag of the package's images, so a package compiled for new images (an
    upgrade) uploads a new version and runs it, and the same images find their version and upload nothing."""
    monkeypatch.setenv("KFP_BEARER_TOKEN", TOKEN)
    cfg = load_config(preset="qwen3.6-27b")
    for tag in ("v1", "v1", "v2"):
        package = compile_pipeline(cfg, str(tmp_path / f"{tag}.yaml"), registry="reg", tag=tag)
        res = CliRunner().invoke(app, ["submit", "--package", package, "--host", fake_kfp.url])
        assert res.exit_code == 0, res.output
        assert f"pipeline flashdraft version {tag}," in res.output
    (pipeline,) = fake_kfp.pipelines.values()
    assert sorted(pipeline["versions"].values()) == ["flashdraft", "v1", "v2"]
    assert [r["display_name"] for r in fake_kfp.runs] == ["flashdraft-v1", "flashdraft-v1", "flashdraft-v2"]
    assert fake_kfp.runs[2]["pipeline_version_reference"]["pipeline_version_id"] == "p0-v2"


RELEASE_DEFAULTS = """apiVersion: v1
kind: ConfigMap
metadata: {name: rel-flashdraft-defaults}
data:
  pipelineName: "drafter-prod"
  pipelineVersion: "2026-12-07"
  defaults.yaml: "storage: {root: 's3://b/r'}"
  parameters.yaml: |
    s3_secret_name: "team-s3"
    tracking_secret_name: "team-tracking"
    trainjob_namespace: "ml"
    trainjob_runtime: "torch-distributed"
"""


def test_submit_with_the_release_and_a_run_config_prints_what_will_run_fake_kfp_api(fake_kfp, tmp_path):
    """--chart: the release's pipeline name and version; --config: another run config (the smoke run's) on the same
    pipeline as config_yaml; the summary shows the package's defaults under the run's parameters."""
    cfg = load_config(preset="qwen3.6-27b", overrides={"storage.root": "s3://team-bucket/runs",
                                                       "storage.endpoint_url": "https://s3.team.example",
                                                       "pools.inference.gpu_type": "h100"})
    cluster = ClusterDefaults(s3_secret_name="team-s3", tracking_secret_name="team-tracking")
    package = compile_pipeline(cfg, str(tmp_path / "p.yaml"), registry="reg.example", tag="t9", cluster=cluster)
    chart = tmp_path / "chart-defaults.yaml"
    chart.write_text(RELEASE_DEFAULTS)
    smoke = tmp_path / "smoke.yaml"
    smoke.write_text(dump_config(load_config(preset="qwen3.6-27b-smoke", overrides={
        "storage.root": "s3://team-bucket/runs", "pools.inference.gpu_type": "h100"})))
    params = tmp_path / "run.yaml"
    params.write_text(yaml.safe_dump({"trainer_gpus": 4, "trainer_node_selector": {"pool": "b200-spot"}}))
    res = CliRunner().invoke(app, ["submit", "--package", package, "--chart", str(chart), "--config", str(smoke),
                                   "--params", str(params), "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[:7] == [
        "will run:",
        "  pipeline drafter-prod version 2026-12-07, run_id qwen36-27b-smoke",
        "  store s3://team-bucket/runs (bucket team-bucket, endpoint AWS S3), S3 Secret team-s3, tracking Secret "
        "team-tracking (optional), Hub Secret flashdraft-hub (optional)",
        "  pool cpu: no GPU, node selector {}",
        '  pool inference: 1 x h100, node selector {"nvidia.com/gpu.product": '
        '"NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"}',
        '  pool trainer: 4 x b200, node selector {"pool": "b200-spot"}',
        "  images reg.example/flashdraft-base:t9, reg.example/flashdraft-inference:t9, "
        "reg.example/flashdraft-trainer:t9"]
    assert fake_kfp.requests == []
    planned = json.loads(res.output[res.output.index("\n[") + 1: res.output.rindex("]") + 1])
    upload = next(p for p in planned if p["path"].endswith("/pipelines/upload"))
    assert upload["query"]["name"] == "drafter-prod"
    run = planned[-1]["body"]
    assert run["runtime_config"]["parameters"]["config_yaml"] == smoke.read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(yaml.safe_dump({"config_yaml": "{}"}))
    refused = CliRunner().invoke(app, ["submit", "--package", package, "--config", str(smoke), "--params",
                                       str(twice), "--dry-run"])
    assert refused.exit_code != 0 and "config_yaml is set twice" in refused.output


def test_compiled_defaults_name_the_release_secrets(tmp_path):
    """compile --parameters (what chart-config --parameters-output writes): the UI's run form names the release's
    Secrets; an unknown key is refused naming it and the file."""
    params = tmp_path / "params.yaml"
    params.write_text("s3_secret_name: team-s3\ntracking_secret_name: team-tracking\ntrainjob_namespace: ml\n")
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(app, ["compile", "--preset", "qwen3.6-27b-smoke", "--parameters", str(params),
                                   "--output", str(out)])
    assert res.exit_code == 0, res.output
    spec = next(yaml.safe_load_all(out.read_text()))
    defaults = {k: v.get("defaultValue") for k, v in spec["root"]["inputDefinitions"]["parameters"].items()}
    assert (defaults["s3_secret_name"], defaults["tracking_secret_name"], defaults["trainjob_namespace"],
            defaults["trainjob_runtime"]) == ("team-s3", "team-tracking", "ml", "torch-distributed")
    params.write_text("s3_secret: x\n")
    bad = CliRunner().invoke(app, ["compile", "--preset", "qwen3.6-27b-smoke", "--parameters", str(params),
                                   "--output", str(out)])
    assert bad.exit_code != 0 and "s3_secret" in bad.output and str(params) in bad.output
