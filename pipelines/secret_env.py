"""Which environment variables a run's pods take from which Kubernetes Secret.

Credentials never travel as pipeline parameters, in logs or in the compiled YAML: a pipeline parameter names the
Secret, and the kubelet puts its keys into the pod's env, each key as the variable of the same name. Stage pods get
them through kfp-kubernetes' `use_secret_as_env` (pipelines/placement.py), the TrainJob's nodes through
`secretKeyRef` (pipelines/trainjob.py); both read the key lists here, and the Helm chart's schema allows exactly
TRACKING_SECRET_KEYS in `tracking.env` (a test compares them) and HUB_SECRET_KEYS as `hub.token`/`hub.endpoint`.
"""

from __future__ import annotations

from typing import Any

# boto3/s3fs. Required: a run cannot work without its store, and a missing key fails the pod at start, by name.
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# What the trackers read (flashdraft/tracking/sinks.py, docs/tracking.md). Optional: a cluster without trackers has
# no such Secret, and one that holds only some keys (an MLflow server without auth) sets only those.
TRACKING_SECRET_KEYS = (
    "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_INSECURE_TLS",
    "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "WANDB_MODE",
)
# What huggingface_hub and `datasets` read (docs/configuration.md "Hub access"): a token for gated or private
# repositories, and the Hub's URL where a cluster has its own mirror. Optional: public repositories on the public
# Hub need neither. Every stage pod gets them, not only the ones that read the Hub today: which stages do depends on
# the config (a target given as a Hub id or a path, `hf:` sources and suites, a drafter.init_from `hf:` drafter).
# HF_ENDPOINT is no secret, but it travels with the token because they name the same Hub (a mirror's token).
HUB_SECRET_KEYS = ("HF_TOKEN", "HF_ENDPOINT")


def secret_key_refs(secret_name: str, keys: tuple[str, ...], *, optional: bool) -> list[dict[str, Any]]:
    """Kubernetes EnvVar entries that take each of `keys` from Secret `secret_name` (a TrainJob's env)."""
    refs = []
    for key in keys:
        selector: dict[str, Any] = {"name": secret_name, "key": key}
        if optional:
            selector["optional"] = True
        refs.append({"name": key, "valueFrom": {"secretKeyRef": selector}})
    return refs
