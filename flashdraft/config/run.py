"""The root of the run config: `RunConfig` holds every section, checks what spans sections, derives the values
that follow from others (the DFlash layer ids), and `validate_config` turns a plain dict into one, with errors that
name each invalid field."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from flashdraft.config.base import Section
from flashdraft.config.derived import dflash_layer_ids
from flashdraft.config.drafter import DrafterConfig, TrainingConfig
from flashdraft.config.errors import ConfigError
from flashdraft.config.evaluation import EvalConfig, ExportConfig
from flashdraft.config.features import FeaturesConfig, StorageConfig
from flashdraft.config.overrides import apply_overrides, drop_stale_target_facts
from flashdraft.config.pipeline import ModeConfig, PlanConfig, PoolsConfig
from flashdraft.config.target import DataConfig, GenerationConfig, TargetConfig
from flashdraft.config.tracking import TrackingConfig


class RunConfig(Section):
    """A whole run: every stage reads its sections of this one object."""

    run_id: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                        description="the run's name and its folder under storage.root; a new run_id starts "
                                    "from nothing, the same one resumes from what is committed")
    target: TargetConfig = Field(description=TargetConfig.__doc__)
    data: DataConfig = Field(default_factory=DataConfig, description=DataConfig.__doc__)
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description=GenerationConfig.__doc__)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, description=FeaturesConfig.__doc__)
    drafter: DrafterConfig = Field(default_factory=DrafterConfig, description=DrafterConfig.__doc__)
    training: TrainingConfig = Field(default_factory=TrainingConfig, description=TrainingConfig.__doc__)
    eval: EvalConfig = Field(default_factory=EvalConfig, description=EvalConfig.__doc__)
    export: ExportConfig = Field(default_factory=lambda: ExportConfig(), description=ExportConfig.__doc__)
    storage: StorageConfig = Field(default_factory=StorageConfig, description=StorageConfig.__doc__)
    mode: ModeConfig = Field(default_factory=ModeConfig, description=ModeConfig.__doc__)
    pools: PoolsConfig = Field(default_factory=PoolsConfig, description=PoolsConfig.__doc__)
    plan: PlanConfig = Field(default_factory=PlanConfig, description=PlanConfig.__doc__)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description=TrackingConfig.__doc__)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        width = self.target.hidden_size
        if self.drafter.hidden_size is not None and width is not None and self.drafter.hidden_size != width:
            raise ValueError(f"drafter.hidden_size {self.drafter.hidden_size} != target hidden size {width} (the "
                             "drafter reads the target's embedding and LM head; unset it to follow the target)")
        if self.training.max_steps == 0 and self.drafter.init != "pretrained":
            raise ValueError("training.max_steps=0 evaluates a pretrained drafter without training: set "
                             "drafter.init=pretrained and drafter.init_from, or max_steps >= 1")
        if self.evaluate_only and self.mode.kind == "streaming":
            raise ValueError("training.max_steps=0 (evaluate only) runs no training: use mode.kind=offline")
        if self.data.features_from is not None and self.mode.kind == "streaming":
            raise ValueError("data.features_from reads another run's stored features: use mode.kind=offline (a "
                             "streaming run keeps none to read)")
        ids = self.features.layer_ids
        if ids is not None:
            if len(ids) != self.features.num_features:
                raise ValueError(
                    f"features.layer_ids has {len(ids)} ids but features.num_features={self.features.num_features}"
                )
            if sorted(set(ids)) != list(ids):
                raise ValueError(f"features.layer_ids must be strictly increasing, got {ids}")
            if self.target.num_layers is not None and max(ids) >= self.target.num_layers:
                raise ValueError(
                    f"features.layer_ids contains {max(ids)} but the target has {self.target.num_layers} layers "
                    f"(ids are 0-based decoder-layer outputs, so the largest allowed is {self.target.num_layers - 1})"
                )
            if min(ids) < 0:
                raise ValueError(f"features.layer_ids must be >= 0, got {ids}")
        return self

    # -- derived values -------------------------------------------------------------------------------------
    @property
    def evaluate_only(self) -> bool:
        """A pretrained drafter evaluated as is: plan, prep, evaluate, export and report run; generate, extract and
        train do not (their Stage.trains; the DAG is built without them)."""
        return self.drafter.init == "pretrained" and self.training.max_steps == 0

    def layer_ids(self, num_layers: int | None = None) -> list[int]:
        """The target layer ids to capture: explicit, else the DFlash rule over the target's layer count."""
        if self.features.layer_ids is not None:
            return list(self.features.layer_ids)
        n = num_layers or self.target.num_layers
        if n is None:
            raise ConfigError("target.num_layers is unknown: set it, or resolve it from the model config first")
        return dflash_layer_ids(n, self.features.num_features)

    def with_overrides(self, overrides: dict[str, Any] | list[str]) -> RunConfig:
        data = self.model_dump(mode="json")
        model = data["target"]["model"]
        apply_overrides(data, overrides)
        drop_stale_target_facts(data, model, overrides)
        return validate_config(data, source="overrides")


def _format_errors(exc: ValidationError, source: str) -> str:
    """One line: every invalid field with its reason, and where the fields are described."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        hint = _did_you_mean(err["loc"]) if err["type"] == "extra_forbidden" else ""
        problems.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}{hint}")
    return (f"invalid run config ({source}): {'; '.join(problems)} (`flashdraft config-reference SECTION` "
            "describes every field)")


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """` (did you mean training.max_steps?)` for a mistyped field (`--set training.max_step=10`): the closest
    field name of the section the typo sits in; "" when none is close."""
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return ""
        model = sub
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {'.'.join([*(str(p) for p in loc[:-1]), close[0]])}?)" if close else ""


def validate_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
