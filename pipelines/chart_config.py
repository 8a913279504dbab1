"""The run config the chart's pipeline is compiled with: a preset, with the chart's pools and storage.

`make chart-pipeline` renders the chart's defaults ConfigMap from the same values file the release uses and
compiles the pipeline from this config, so the uploaded pipeline's default parameters (node selectors,
tolerations, GPU counts, storage root) are the cluster's, not the preset's. Chart values replace the preset's
values key by key (a node selector is replaced as a whole, not merged), so a preset's GPU label cannot leak into
a cluster that labels its nodes differently.

The Secrets' names and the TrainJob's namespace and runtime are run parameters outside the run config: they go to
`--parameters-output` (pipelines/pipeline.py ClusterDefaults), which `flashdraft compile --parameters` reads, so the
uploaded pipeline names the release's Secrets.

`flashdraft chart-config --preset PRESET --output OUT.yaml` reads the rendered ConfigMap on stdin (`helm template ...
--show-only templates/configmap-defaults.yaml`). It is a `flashdraft` command, not a script beside the chart: a
script run from helm/ puts helm/ first on sys.path, where the chart folder helm/flashdraft/ imports as a namespace
package and shadows the installed flashdraft (issue 39); nothing under helm/ is Python, and a test keeps it so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from flashdraft.config import dump_config, load_config
from flashdraft.pipelines.pipeline import ClusterDefaults


def defaults_data(configmap_yaml: str) -> dict[str, str]:
    """The `data` of the chart's defaults ConfigMap, or a one-line error saying what was expected."""
    configmap = yaml.safe_load(configmap_yaml)
    if not isinstance(configmap, dict) or configmap.get("kind") != "ConfigMap" or \
            "defaults.yaml" not in (configmap.get("data") or {}):
        raise ValueError("expected the chart's defaults ConfigMap (helm template --show-only "
                         "templates/configmap-defaults.yaml)")
    return configmap["data"]


def chart_cluster_defaults(configmap_yaml: str) -> ClusterDefaults:
    """The release's Secrets and TrainJob settings, from the ConfigMap's run parameters (parameters.yaml)."""
    params = yaml.safe_load(defaults_data(configmap_yaml)["parameters.yaml"])
    return ClusterDefaults(**{f.name: params[f.name] for f in dataclasses.fields(ClusterDefaults)})


def read_cluster_defaults(path: Path) -> ClusterDefaults:
    """`compile --parameters FILE`: a YAML mapping of ClusterDefaults' fields (what `chart-config
    --parameters-output` writes); an unknown key is refused naming it and the file."""
    data: Any = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping of pipeline parameter defaults")
    known = [f.name for f in dataclasses.fields(ClusterDefaults)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown parameter(s) {unknown}; allowed: {known}")
    return ClusterDefaults(**data)


def chart_run_config(configmap_yaml: str, preset: str) -> str:
    fragment = yaml.safe_load(defaults_data(configmap_yaml)["defaults.yaml"])
    overrides = {f"{section}.{key}": value
                 for section, body in fragment.items() if section == "storage"
                 for key, value in body.items()}
    overrides |= {f"pools.{pool}.{key}": value
                  for pool, body in fragment.get("pools", {}).items()
                  for key, value in body.items()}
    return dump_config(load_config(preset=preset).with_overrides(overrides))

