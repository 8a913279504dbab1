"""Upload the compiled pipeline and start runs through the KFP v2beta1 REST API (the endpoints `kfp.Client` calls).

A small explicit client (stdlib HTTP) rather than `kfp.Client`: every request is known up front, so `--dry-run`
prints exactly what would be sent; `kfp.Client` (kfp 2.17) instead calls the healthz endpoint when it is built
(five tries 5 s apart on an API error), reads ~/.config/kfp/context.json (and writes it on multi-user Kubeflow),
prints links, and sets no request timeout (a silent endpoint would hang `submit`). The version a submit names is
the tag of the package's images (or the release's `pipeline.version`), and before any request it prints what the
run will use (`will_run`). The upload is idempotent by name: get the pipeline id (upload it the first time) ->
upload the version only if it is missing. The compiled file is sent as written (both YAML documents: the second
holds node selectors, tolerations and secrets). Auth: an in-cluster ServiceAccount token file
(KF_PIPELINES_SA_TOKEN_PATH) or a bearer token from the environment; tokens are never printed.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

API = "/apis/v2beta1"
SA_TOKEN_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
SA_TOKEN_DEFAULT_PATH = "/var/run/secrets/kubeflow/pipelines/token"
BEARER_TOKEN_ENV = "KFP_BEARER_TOKEN"
REQUEST_TIMEOUT_S = 20  # per request: a silent endpoint fails `submit` in one line well within 30 s


class KfpApiError(RuntimeError):
    """The KFP API refused a request; the message names the request and the server's answer."""


def resolve_token(env: dict[str, str] | None = None) -> str | None:
    """Bearer token: the SA token file (KF_PIPELINES_SA_TOKEN_PATH, else its standard mount) or KFP_BEARER_TOKEN."""
    env = dict(os.environ) if env is None else env
    path = env.get(SA_TOKEN_ENV) or (SA_TOKEN_DEFAULT_PATH if os.path.exists(SA_TOKEN_DEFAULT_PATH) else None)
    if path:
        if not os.path.exists(path):
            raise KfpApiError(f"{SA_TOKEN_ENV}={path}: no token file there")
        return Path(path).read_text().strip()
    return env.get(BEARER_TOKEN_ENV) or None


def _name_filter(name: str) -> str:
    """The KFP list filter kfp.Client itself uses to find an object by its display name."""
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


@dataclass
class KfpApi:
    """Minimal KFP v2beta1 client; with dry_run it records the requests it would send and sends none."""

    host: str
    token: str | None = None
    namespace: str | None = None
    dry_run: bool = False
    planned: list[dict[str, Any]] = field(default_factory=list)

    def _request(self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None,
                 upload: tuple[str, bytes] | None = None) -> dict[str, Any] | None:
        """Send one request (JSON or multipart upload); in dry-run mode record it and return None."""
        query = {k: v for k, v in (query or {}).items() if v}
        if self.dry_run:
            what: dict[str, Any] = {"method": method, "path": API + path}
            if query:
                what["query"] = query
            if body is not None:
                what["body"] = body
            if upload is not None:
                what["upload"] = {"file": upload[0], "bytes": len(upload[1])}
            self.planned.append(what)
            return None
        url = self.host.rstrip("/") + API + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if upload is not None:
            boundary = uuid.uuid4().hex
            filename, content = upload
            data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"uploadfile\"; "
                    f"filename=\"{filename}\"\r\nContent-Type: application/x-yaml\r\n\r\n").encode()
            data += content + f"\r\n--{boundary}--\r\n".encode()
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise KfpApiError(f"{method} {url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:  # refused, unresolvable, silent
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else f"{type(exc).__name__}: {exc}"
            raise KfpApiError(f"the KFP API at {self.host} does not answer ({method} {API + path}: {reason}); "
                              "check --host (or KFP_HOST) and that the endpoint is reachable from here") from None
        return json.loads(payload) if payload.strip() else {}

    # -- pipelines ------------------------------------------------------------------------------------------
    def pipeline_id(self, name: str) -> str | None:
        listed = self._request("GET", "/pipelines", {"filter": _name_filter(name), "namespace": self.namespace})
        matches = [p["pipeline_id"] for p in (listed or {}).get("pipelines", []) or [] if p.get("display_name") == name]
        if len(matches) > 1:
            raise KfpApiError(f"{len(matches)} pipelines are named {name!r}; names must be unique")
        return matches[0] if matches else None

    def version_id(self, pipeline_id: str, version: str) -> str | None:
        listed = self._request("GET", f"/pipelines/{pipeline_id}/versions", {"filter": _name_filter(version)})
        for item in (listed or {}).get("pipeline_versions", []) or []:
            if item.get("display_name") == version:
                return item["pipeline_version_id"]
        return None

    def ensure_pipeline_version(self, package: str, name: str, version: str, description: str = "") -> dict[str, str]:
        """Pipeline `name` with version `version` from `package`, uploading only what is missing.

        A first upload also creates a version named after the pipeline (KFP behaviour); the run always uses the
        version named `version`.
        """
        content = Path(package).read_bytes()
        pid = self.pipeline_id(name)
        if pid is None:
            created = self._request("POST", "/pipelines/upload", {"name": name, "display_name": name,
                                                                    "description": description,
                                                                    "namespace": self.namespace},
                                    upload=(Path(package).name, content))
            pid = (created or {}).get("pipeline_id", "<new pipeline>")
        vid = None if self.dry_run and pid.startswith("<") else self.version_id(pid, version)
        if vid is None:
            made = self._request("POST", "/pipelines/upload_version",
                                 {"name": version, "display_name": version, "pipelineid": pid,
                                  "description": description}, upload=(Path(package).name, content))
            vid = (made or {}).get("pipeline_version_id", "<new version>")
        return {"pipeline_id": pid, "pipeline_version_id": vid}

    # -- experiments and runs -------------------------------------------------------------------------------
    def ensure_experiment(self, name: str) -> str:
        listed = self._request("GET", "/experiments", {"filter": _name_filter(name), "namespace": self.namespace})
        for item in (listed or {}).get("experiments", []) or []:
            if item.get("display_name") == name:
                return item["experiment_id"]
        body = {"display_name": name, **({"namespace": self.namespace} if self.namespace else {})}
        return (self._request("POST", "/experiments", body=body) or {}).get("experiment_id", "<new experiment>")

    def create_run(self, display_name: str, experiment_id: str, ids: dict[str, str],
                   parameters: dict[str, Any]) -> dict[str, Any]:
        body = {
            "display_name": display_name,
            "experiment_id": experiment_id,
            "pipeline_version_reference": {"pipeline_id": ids["pipeline_id"],
                                           "pipeline_version_id": ids["pipeline_version_id"]},
            "runtime_config": {"parameters": parameters},
        }
        return self._request("POST", "/runs", body=body) or {"run_id": "<new run>"}

    def run_url(self, run_id: str) -> str:
        return f"{self.host.rstrip('/')}/#/runs/details/{run_id}"


def load_parameters(path: str | None) -> dict[str, Any]:
    """Run parameters from a YAML mapping (pipeline parameter name -> value)."""
    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise KfpApiError(f"{path}: run parameters must be a YAML mapping of parameter name -> value")
    return data


def with_run_config(parameters: dict[str, Any], config: Path) -> dict[str, Any]:
    """`parameters` with config_yaml set to the run config file's text (`submit --config`); refuses a second
    config_yaml in the parameters file rather than pick one."""
    if "config_yaml" in parameters:
        raise KfpApiError(f"config_yaml is set twice: by --config {config} and in the run parameters")
    if not config.is_file():
        raise KfpApiError(f"--config {config}: no such file")
    return {**parameters, "config_yaml": config.read_text()}


def check_parameters(package: str, parameters: dict[str, Any]) -> None:
    """Refuse parameter names the compiled pipeline does not declare (a typo would be silently ignored)."""
    spec = next(yaml.safe_load_all(Path(package).read_text()))
    known = set(spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}))
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise KfpApiError(f"unknown run parameter(s) {unknown}; the pipeline declares {sorted(known)}")


def package_defaults(package: str) -> dict[str, Any]:
    """The compiled pipeline's run parameters with their defaults (the Kubeflow UI's prefilled run form)."""
    spec = next(yaml.safe_load_all(Path(package).read_text()))
    params = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {name: p.get("defaultValue") for name, p in params.items()}


def package_images(package: str) -> list[str]:
    """Every image the compiled pipeline's executors run."""
    spec = next(yaml.safe_load_all(Path(package).read_text()))
    return sorted({e["container"]["image"] for e in spec.get("deploymentSpec", {}).get("executors", {}).values()
                   if "container" in e})


def image_tag(package: str) -> str:
    """The tag all the package's images share: the pipeline version a submit names by default, so a version is
    the image build it runs (an upgrade to new images is a new version)."""
    tags = {image.rsplit(":", 1)[-1] for image in package_images(package) if ":" in image.rsplit("/", 1)[-1]}
    if len(tags) != 1:
        raise KfpApiError(f"{package}: its images carry tags {sorted(tags)}, not one; pass --version")
    return tags.pop()


def will_run(package: str, parameters: dict[str, Any], name: str, version: str) -> list[str]:
    """What a run of `package` with `parameters` uses, in a few lines: the pipeline and version, the store and its
    endpoint, the Secrets' names, each pool's GPUs and node selector, the images. Read from the package and the
    parameters (the values KFP will pass), not from what the user meant to configure."""
    from flashdraft.config import validate_config

    values = package_defaults(package) | parameters
    if "config_yaml" not in values:
        raise KfpApiError(f"{package}: not a flashdraft pipeline (it has no config_yaml parameter)")
    cfg = validate_config(yaml.safe_load(values["config_yaml"]), source="config_yaml")  # JSON as compiled, or YAML
    cfg = cfg.with_overrides(values.get("overrides") or {})
    lines = [f"pipeline {name} version {version}, run_id {cfg.run_id}",
             f"store {cfg.storage.root} (bucket {urllib.parse.urlparse(cfg.storage.root).netloc or '-'}, endpoint "
             f"{cfg.storage.endpoint_url or 'AWS S3'}), "
             f"S3 Secret {values['s3_secret_name']}, tracking Secret {values['tracking_secret_name']} (optional), "
             f"Hub Secret {values.get('hub_secret_name', '-')} (optional)"]
    for pool in ("cpu", "inference", "trainer"):
        spec = getattr(cfg.pools, pool)
        gpus = f"{int(values[f'{pool}_gpus'])} x {spec.gpu_type or spec.accelerator_type}" if pool != "cpu" \
            else "no GPU"
        lines.append(f"pool {pool}: {gpus}, node selector {json.dumps(values[f'{pool}_node_selector'])}")
    lines.append(f"images {', '.join(package_images(package))}")
    return lines

