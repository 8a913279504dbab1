"""The one typed run configuration.

A whole run (every stage, every pool) is described by one `RunConfig` (run.py), made of sections grouped by what
they describe (target.py, features.py, drafter.py, evaluation.py, pipeline.py). It loads from a YAML file or a
packaged preset, then takes `--set path.to.key=value` overrides (CLI) or a dict of overrides (KFP pipeline
parameters) (loader.py, overrides.py). Values that follow from others (DFlash target layer ids, the loss decay
gamma) are derived by the drafter's rules (flashdraft/config/derived.py), not typed. Validation errors name the
field and the reason.
"""

from flashdraft.config.drafter import DrafterConfig, TrainingConfig
from flashdraft.config.errors import ConfigError
from flashdraft.config.evaluation import EvalConfig, EvalSuite
from flashdraft.config.features import StorageConfig
from flashdraft.config.loader import dump_config, load_config, preset_names
from flashdraft.config.pipeline import ModeConfig, PoolConfig
from flashdraft.config.run import RunConfig, validate_config
from flashdraft.config.target import SourceSpec, TargetConfig

__all__ = [
    "ConfigError",
    "DrafterConfig",
    "EvalConfig",
    "EvalSuite",
    "ModeConfig",
    "PoolConfig",
    "RunConfig",
    "SourceSpec",
    "StorageConfig",
    "TargetConfig",
    "TrainingConfig",
    "dump_config",
    "load_config",
    "preset_names",
    "validate_config",
]
