"""The codec registry: every feature codec's name, parameters and byte accounting, in one place.

Config validation (`features.codec`), the shard header (`Codec.from_params`), the planner's bytes per token and
extraction's verification tolerance all ask this module, so a codec is added here once and nowhere else.
It imports neither torch nor numpy: the config and the planner load it without the encoder. It sits in `config`,
the bottom layer, because config validation needs it; the encoders (flashdraft/features/codecs.py) build on it.

Byte accounting is exact for what a codec writes before entropy coding (`raw_bytes_per_token`). For the
zstd codecs the stored size depends on the data; the planner multiplies by a measured ratio
(`plan.zstd_ratio`, defaults from `make bench` on SmolLM2 features) and `bytes_per_token` says so by taking the
ratio as an argument instead of guessing one.
"""

from __future__ import annotations

from dataclasses import dataclass

# fp8 per-token or per-64-channel scales
FP8_SCALES = ("token", "block64")
FP8_BLOCK = 64
# 4-bit family (`q4`): the 16 values a code stands for, the block the scale covers, the scale's format
Q4_VALUES = ("e2m1", "int4", "nf4")
Q4_BLOCKS = (16, 32, 64)
Q4_SCALES = ("e4m3", "e8m0", "bf16")
Q4_VERSION = 1  # bumped when the q4 payload layout changes; readers refuse versions they do not know


class CodecSpecError(ValueError):
    """A codec name or parameter that is not in the registry (the message names the parameter)."""


@dataclass(frozen=True)
class CodecSpec:
    """What the rest of flashdraft may know about a codec without encoding anything."""

    name: str
    family: str            # "bf16", "fp8" or "q4": the payload layout before entropy coding
    lossless: bool
    entropy_coded: bool    # zstd over the payload: stored size = raw size x a data-dependent ratio
    verify_tolerance: float  # relative RMS error per layer `features verify` accepts against a fresh forward
    description: str


CODEC_SPECS: dict[str, CodecSpec] = {s.name: s for s in (
    # lossless: only float reassociation between extraction's forward and verify's (~1e-3 in fp32);
    # lossy: ~2x the error measured on SmolLM2 features (fp8 ~2-3%, q4 ~8-10%)
    CodecSpec("bf16", "bf16", True, False, 1e-2, "raw bf16 [T, n, H]"),
    CodecSpec("bf16-zstd", "bf16", True, True, 1e-2, "zstd(high-byte plane | low-byte plane)"),
    CodecSpec("fp8", "fp8", False, False, 0.06, "bf16 scales | e4m3 values"),
    CodecSpec("fp8-zstd", "fp8", False, True, 0.06, "zstd(fp8 payload)"),
    CodecSpec("q4", "q4", False, False, 0.2, "4-bit codes (e2m1/int4/nf4) with block scales, optional outliers kept "
              "in bf16 and an optional Hadamard rotation undone on decode"),
)}
CODECS = tuple(CODEC_SPECS)


def codec_spec(name: str) -> CodecSpec:
    if name not in CODEC_SPECS:
        raise CodecSpecError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return CODEC_SPECS[name]


@dataclass(frozen=True)
class CodecParams:
    """A codec and its parameters, as every shard header and provenance record holds them (`as_dict`).

    Parameters that do not apply to `name` keep their defaults and are not recorded, so the records of codecs
    that existed before a parameter was added are unchanged (old shards still match their configs)."""

    name: str
    fp8_scale: str = "token"
    zstd_level: int = 1
    q4_values: str = "nf4"
    q4_block: int = 64
    q4_scale: str = "bf16"
    q4_outliers: int = 8
    q4_rotate: int = 0
    version: int = Q4_VERSION

    def __post_init__(self) -> None:
        spec = codec_spec(self.name)
        _choose("fp8_scale", self.fp8_scale, FP8_SCALES)
        if spec.family == "q4":
            _choose("q4_values", self.q4_values, Q4_VALUES)
            _choose("q4_block", self.q4_block, Q4_BLOCKS)
            _choose("q4_scale", self.q4_scale, Q4_SCALES)
            if not 0 <= self.q4_outliers <= 64:
                raise CodecSpecError(f"q4_outliers must be in [0, 64], got {self.q4_outliers}")
            if self.q4_rotate and (self.q4_rotate & (self.q4_rotate - 1) or not 16 <= self.q4_rotate <= 1024):
                raise CodecSpecError(f"q4_rotate must be 0 or a power of two in [16, 1024], got {self.q4_rotate}")
            if self.version != Q4_VERSION:
                raise CodecSpecError(f"q4 payload version {self.version} is not readable by this flashdraft "
                                     f"(it reads version {Q4_VERSION})")

    @property
    def spec(self) -> CodecSpec:
        return CODEC_SPECS[self.name]

    @property
    def lossless(self) -> bool:
        return self.spec.lossless

    @classmethod
    def from_dict(cls, params: dict):
        """The codec a recorded parameter dict (a shard header or provenance record) describes."""
        unknown = sorted(set(params) - {f for f in CodecParams.__dataclass_fields__})
        if unknown:
            raise CodecSpecError(f"codec {params.get('name')!r}: unknown parameters {unknown}")
        return cls(**params)

    def as_dict(self) -> dict:
        out: dict = {"name": self.name}
        family = self.spec.family
        if family == "fp8":
            out["fp8_scale"] = self.fp8_scale
        if family == "q4":
            out.update(version=self.version, q4_values=self.q4_values, q4_block=self.q4_block,
                       q4_scale=self.q4_scale, q4_outliers=self.q4_outliers, q4_rotate=self.q4_rotate)
        if self.spec.entropy_coded:
            out["zstd_level"] = self.zstd_level
        return out

    def check_geometry(self, hidden: int) -> None:
        """Raise unless this codec can store rows of `hidden` values."""
        family = self.spec.family
        if family == "fp8" and self.fp8_scale == "block64" and hidden % FP8_BLOCK:
            raise CodecSpecError(f"fp8 block64 scales need hidden size divisible by {FP8_BLOCK}, got {hidden}")
        if family == "q4":
            for what, size in (("q4_block", self.q4_block), ("q4_rotate", self.q4_rotate)):
                if size and hidden % size:
                    raise CodecSpecError(f"{what}={size} needs hidden size divisible by it, got {hidden}")
            if self.q4_outliers > hidden:
                raise CodecSpecError(f"q4_outliers={self.q4_outliers} exceeds hidden size {hidden}")

    def raw_bytes_per_row(self, hidden: int) -> int:
        """Bytes one (token, layer) row of `hidden` values takes before entropy coding: the codec's own count."""
        self.check_geometry(hidden)
        family = self.spec.family
        if family == "bf16":
            return 2 * hidden
        if family == "fp8":
            return hidden + 2 * (1 if self.fp8_scale == "token" else hidden // FP8_BLOCK)
        blocks = hidden // self.q4_block
        scales = blocks * (2 if self.q4_scale == "bf16" else 1) + (2 if self.q4_scale == "e4m3" else 0)
        return hidden // 2 + scales + 4 * self.q4_outliers  # outliers: bf16 value + uint16 channel

    def raw_bytes_per_token(self, hidden: int, num_layers: int) -> int:
        return num_layers * self.raw_bytes_per_row(hidden)

    def bytes_per_token(self, hidden: int, num_layers: int, zstd_ratio: float | None = None) -> float:
        """Stored feature bytes per token (ids and mask not included). Entropy-coded codecs need the measured
        `zstd_ratio` (stored / raw); for the others it must be None or is ignored."""
        raw = self.raw_bytes_per_token(hidden, num_layers)
        if not self.spec.entropy_coded:
            return float(raw)
        if zstd_ratio is None:
            raise CodecSpecError(f"{self.name}: stored size depends on the data; pass a measured zstd ratio")
        return raw * zstd_ratio


def _choose(field: str, value, choices: tuple) -> None:
    if value not in choices:
        raise CodecSpecError(f"unknown {field} {value!r}; choose one of {', '.join(map(str, choices))}")
