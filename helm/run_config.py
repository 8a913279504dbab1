"""Write the run config the chart's pipeline is compiled with: a preset, with the chart's pools and storage.

`make chart-pipeline` renders the chart's defaults ConfigMap from the same values file the release uses and
compiles the pipeline from this config, so the uploaded pipeline's default parameters (node selectors,
tolerations, GPU counts, storage root) are the cluster's, not the preset's. Chart values replace the preset's
values key by key (a node selector is replaced as a whole, not merged), so a preset's GPU label cannot leak into
a cluster that labels its nodes differently.

Usage: helm template ... --show-only templates/configmap-defaults.yaml | python run_config.py PRESET OUT.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from flashdraft.config import dump_config, load_config


def chart_run_config(configmap_yaml: str, preset: str) -> str:
    configmap = yaml.safe_load(configmap_yaml)
    if not configmap or configmap.get("kind") != "ConfigMap" or "defaults.yaml" not in configmap.get("data", {}):
        raise SystemExit("expected the chart's defaults ConfigMap (helm template --show-only "
                         "templates/configmap-defaults.yaml) on stdin")
    fragment = yaml.safe_load(configmap["data"]["defaults.yaml"])
    overrides = {f"{section}.{key}": value
                 for section, body in fragment.items() if section == "storage"
                 for key, value in body.items()}
    overrides |= {f"pools.{pool}.{key}": value
                  for pool, body in fragment.get("pools", {}).items()
                  for key, value in body.items()}
    return dump_config(load_config(preset=preset).with_overrides(overrides))


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    preset, out = argv
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(chart_run_config(sys.stdin.read(), preset))


if __name__ == "__main__":
    main(sys.argv[1:])
