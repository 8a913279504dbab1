"""The run config the chart's pipeline is compiled with: a preset, with the chart's pools and storage.

`make chart-pipeline` renders the chart's defaults ConfigMap from the same values file the release uses and
compiles the pipeline from this config, so the uploaded pipeline's default parameters (node selectors,
tolerations, GPU counts, storage root) are the cluster's, not the preset's. Chart values replace the preset's
values key by key (a node selector is replaced as a whole, not merged), so a preset's GPU label cannot leak into
a cluster that labels its nodes differently.

`flashdraft chart-config --preset PRESET --output OUT.yaml` reads the rendered ConfigMap on stdin (`helm template ...
--show-only templates/configmap-defaults.yaml`). It is a `flashdraft` command, not a script beside the chart: a
script run from helm/ puts helm/ first on sys.path, where the chart folder helm/flashdraft/ imports as a namespace
package and shadows the installed flashdraft (issue 39); nothing under helm/ is Python, and a test keeps it so.
"""

from __future__ import annotations

import yaml

from flashdraft.config import dump_config, load_config


def chart_run_config(configmap_yaml: str, preset: str) -> str:
    configmap = yaml.safe_load(configmap_yaml)
    if not configmap or configmap.get("kind") != "ConfigMap" or "defaults.yaml" not in configmap.get("data", {}):
        raise ValueError("expected the chart's defaults ConfigMap (helm template --show-only "
                         "templates/configmap-defaults.yaml) on stdin")
    fragment = yaml.safe_load(configmap["data"]["defaults.yaml"])
    overrides = {f"{section}.{key}": value
                 for section, body in fragment.items() if section == "storage"
                 for key, value in body.items()}
    overrides |= {f"pools.{pool}.{key}": value
                  for pool, body in fragment.get("pools", {}).items()
                  for key, value in body.items()}
    return dump_config(load_config(preset=preset).with_overrides(overrides))

