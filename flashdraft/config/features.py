"""Config sections of the features extract writes and train reads (which layers, how encoded, how cut into parts)
and of the store every stage reads and writes through."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from flashdraft.config.base import Section
from flashdraft.config.codecs import (
    CODECS,
    Q4_BLOCKS,
    Q4_SCALES,
    Q4_VALUES,
    CodecParams,
    CodecSpecError,
    codec_spec,
)

STORAGE_SCHEMES = ("file", "s3", "memory")
CPU_FORWARD_TOKENS = 1024  # extraction forward size on CPU (see FeaturesConfig.forward_tokens)


def split_uri(uri: str) -> tuple[str, str]:
    """(scheme, path) of a store or source URI; a bare path is a `file` path."""
    scheme, sep, path = uri.partition("://")
    return (scheme, path) if sep else ("file", uri)


class FeaturesConfig(Section):
    """The target hidden states extract writes and train reads: which layers, how they are encoded, how they are
    cut into parts."""

    num_features: int = Field(default=5, ge=1, description="target layers captured per token (the DFlash "
                              "paper's 5); the drafter's fusion input is num_features x hidden")
    layer_ids: list[int] | None = Field(
        default=None, description="0-based decoder-layer outputs to capture, strictly increasing; default: the "
        "DFlash rule (uniform from 1 to L-3) over target.num_layers")
    codec: str = Field(
        default="bf16-zstd", description=f"on-store encoding of the features, one of {', '.join(CODECS)}: bf16 is "
        "lossless for a bf16 target; fp8 halves the bytes (lossy); q4 (4-bit, 0.27x, lossy, the q4_* fields); "
        "-zstd adds zstd compression. The codec registry (flashdraft/config/codecs.py) defines them; "
        "read by extract (writes), train (reads), plan (bytes)")
    fp8_scale: Literal["token", "block64"] = Field(
        default="token", description="fp8 codecs: one scale per token row, or one per 64 channels of a row "
        "(block64: more scales, less error)")
    zstd_level: int = Field(default=1, ge=-7, le=22, description="-zstd codecs: zstd compression level (higher: "
                            "smaller parts, slower extraction)")
    # q4 defaults: the lowest error per layer at <= 0.27x of bf16 (measurements: docs/shard-format.md)
    q4_values: Literal[Q4_VALUES] = Field(  # type: ignore[valid-type]
        default="nf4", description="q4: the 16 values a 4-bit code stands for (FP4 e2m1, int4, NF4)")
    q4_block: Literal[Q4_BLOCKS] = Field(  # type: ignore[valid-type]
        default=64, description="q4: values per block scale (e2m1 with e4m3 per 16 is NVFP4's layout, 0.28x of bf16)")
    q4_scale: Literal[Q4_SCALES] = Field(  # type: ignore[valid-type]
        default="bf16", description="q4: block scale format: e4m3 under a bf16 scale per row (NVFP4), e8m0 "
        "(MXFP4, a power of two) or bf16")
    q4_outliers: int = Field(default=8, ge=0, le=64, description="q4: largest magnitudes per row kept exactly "
                             "(bf16 + channel, 4 bytes each): SmolLM2's massive activations cost a 4-bit block "
                             "its resolution; 8 halve the error for 0.003x of bf16 (benchmarks/bench_codecs.py)")
    q4_rotate: int = Field(default=0, ge=0, description="q4: Hadamard rotation width before quantising (0: none)")
    shard_bytes: int = Field(
        default=512 * 2**20, ge=1024, description="a feature part closes at the first sample boundary past this "
        "many encoded bytes (the unit of upload, commit, streaming window and reader cache)")
    backend: Literal["hf", "vllm"] = Field(
        default="hf", description="extraction engine: hf = transformers forward with output hooks; vllm = vLLM's "
        "forward with the same layer taps (checked equal to hf in the vLLM test tier)")
    batch_tokens: int = Field(default=8192, ge=16, description="tokens per extraction batch (the writer's unit)")
    forward_tokens: int | None = Field(
        default=None, ge=16, description="padded tokens per target forward; default: batch_tokens on a GPU, "
        f"{CPU_FORWARD_TOKENS} on a CPU (cache-sized: measured faster than larger forwards there)")
    queue_depth: int = Field(default=4, ge=1, description="encoded batches in flight to the uploader")

    def forward_tokens_on(self, device: str) -> int:
        """Tokens per target forward on `device` (the forward_tokens default is device-dependent)."""
        if self.forward_tokens is not None:
            return self.forward_tokens
        return self.batch_tokens if device.startswith("cuda") else min(self.batch_tokens, CPU_FORWARD_TOKENS)

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        codec_spec(v)  # the registry names the choices
        return v

    @model_validator(mode="after")
    def _codec_params(self) -> FeaturesConfig:
        try:
            self.codec_params()
        except CodecSpecError as exc:
            raise ValueError(str(exc)) from None
        return self

    def codec_params(self) -> CodecParams:
        """The configured codec as the registry describes it (byte accounting, lossless, recorded parameters)."""
        return CodecParams(self.codec, fp8_scale=self.fp8_scale, zstd_level=self.zstd_level,
                           q4_values=self.q4_values, q4_block=self.q4_block, q4_scale=self.q4_scale,
                           q4_outliers=self.q4_outliers, q4_rotate=self.q4_rotate)


class StorageConfig(Section):
    """Where a run's objects live (every stage reads and writes through it). S3 credentials are never here: they
    come from the AWS_* environment variables or the Secret folder named by FLASHDRAFT_S3_SECRET_DIR."""

    root: str = Field(default="file://./runs", description="store root URI: file://PATH, s3://BUCKET/PREFIX or "
                      "memory:// (tests); a run's objects live under <root>/<run_id>/")
    endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for a non-AWS server (MinIO, SeaweedFS, Ceph); default: "
        "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS itself")
    region: str | None = Field(default=None, description="S3 region; default: the AWS environment's")
    path_style: bool = Field(default=True, description="S3 path-style addressing (endpoint/bucket/key), what "
                             "self-hosted servers expect; false = virtual-hosted (bucket.endpoint/key)")
    budget_bytes: int | None = Field(
        default=None, ge=0, description="bytes the run may keep in the store; plan refuses an offline run whose "
        "feature estimate exceeds it (and names streaming mode as the alternative). None = no limit")
    read_chunk_bytes: int = Field(default=8 * 2**20, ge=2**16, description="S3: whole-object reads above this "
                                  "size are split into parallel range GETs of this size")
    read_threads: int = Field(default=8, ge=1, description="S3: parallel range GETs per store")
    retries: int = Field(default=6, ge=0, description="retries of one store operation after a transient error "
                         "(throttling, 5xx, reset, timeout, checksum mismatch on read); the store is the only "
                         "retry layer (botocore's and s3fs's own retries are off)")
    retry_base_s: float = Field(default=0.25, gt=0, description="backoff before retry k: a random 50-100% of "
                                "retry_base_s * 2**k, capped at retry_max_s (defaults: ~16 s of outage ridden out)")
    retry_max_s: float = Field(default=8.0, gt=0, description="the longest single backoff")
    lease_expiry_s: float = Field(
        default=180.0, gt=0, description="a task's lease (one writer per task) lapses this long after its last "
        "renewal: how long a retry waits for a dead pod's lease; it outlasts several missed heartbeats and the "
        "retry budget of one renewal (docs/failure-model.md#leases)")
    lease_heartbeat_s: float = Field(
        default=30.0, gt=0, description="how often a running task renews its lease; a second writer of the task is "
        "refused once it sees a renewal, so within about this long")

    @field_validator("root")
    @classmethod
    def _scheme(cls, v: str) -> str:
        scheme, _ = split_uri(v)
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(f"unsupported storage scheme {scheme!r} in {v!r}; use one of {STORAGE_SCHEMES}")
        return v

    @model_validator(mode="after")
    def _lease_timing(self) -> StorageConfig:
        if self.lease_heartbeat_s * 2 > self.lease_expiry_s:
            raise ValueError(f"storage.lease_heartbeat_s={self.lease_heartbeat_s} must be at most half of "
                             f"storage.lease_expiry_s={self.lease_expiry_s}: a lease must survive a missed renewal")
        return self
