"""The `.fds` feature shard: many samples in one object, self-describing, one sample fetchable by byte range.

Layout (all integers little-endian)::

    0   8 bytes   magic b"FDSHARD1"
    8   u64       header length L
    16  L bytes   header JSON (utf-8, space-padded so the data section starts on a 64-byte boundary)
    16+L          data: per sample, contiguous: input_ids int32[T] | loss_mask uint8[T] | codec payload

The header holds the codec parameters, the provenance (see manifest.py) and one row per sample:
``[sample_id, num_tokens, offset, length, crc32]`` with offset relative to the data section. A reader gets the
header with one small range read (`HEADER_PROBE` bytes, a second read only for huge headers) and then each
sample with one range read; the per-sample crc32 lets byte-range reads be verified without the whole object
(whole-object reads are checked against the sha256 in the commit record as well).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from flashdraft.features.codecs import Codec, CodecError

MAGIC = b"FDSHARD1"
FORMAT_VERSION = 1
HEADER_PROBE = 64 * 1024
_ALIGN = 64


class ShardFormatError(ValueError):
    """Bytes that are not a valid shard, or a sample whose crc32 does not match (names the shard and sample)."""


@dataclass(frozen=True)
class EncodedFeatures:
    """A sample's features still in its codec's bytes (crc32 already checked), to be decoded where the trainer
    computes. Why: a q4 payload is ~0.27x of bf16, so on a GPU trainer the 4-bit bytes cross PCIe and become
    bf16 on the device (torch ops, the same bits as the CPU decoder) instead of the host CPU decoding, and
    copying, ~4x the bytes. The readers produce it only when asked (`defer_decode`)."""

    codec: Codec
    payload: bytes | memoryview
    num_tokens: int
    num_layers: int
    hidden: int
    where: str  # "<part url>: sample <index> (<id>)", for errors

    def decode(self, device: str | torch.device | None = None) -> torch.Tensor:
        """bfloat16 [T, n*H] on `device` (default CPU)."""
        try:
            return self.codec.decode(self.payload, self.num_tokens, self.num_layers, self.hidden, device)
        except CodecError as exc:
            raise ShardFormatError(f"{self.where}: {exc}") from None


@dataclass
class Sample:
    """One training sample as the reader yields it."""

    sample_id: str
    input_ids: torch.Tensor   # int64 [T]
    loss_mask: torch.Tensor   # bool [T]
    features: torch.Tensor | EncodedFeatures  # bfloat16 [T, n*H], layers in increasing id order (or still encoded)

    def decoded(self, device: str | torch.device | None = None) -> Sample:
        """This sample with its features as a tensor: encoded ones decoded on `device`, a tensor left as is."""
        if not isinstance(self.features, EncodedFeatures):
            return self
        return Sample(self.sample_id, self.input_ids, self.loss_mask, self.features.decode(device))


@dataclass(frozen=True)
class SampleEntry:
    sample_id: str
    num_tokens: int
    offset: int
    length: int
    crc32: int


@dataclass(frozen=True)
class ShardHeader:
    codec: Codec
    layer_ids: list[int]
    hidden_size: int
    provenance: dict
    samples: list[SampleEntry]
    data_offset: int

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @property
    def size(self) -> int:
        """Bytes of the whole shard object (header + every sample, stored contiguously)."""
        return self.data_offset + sum(s.length for s in self.samples)


def encode_sample(codec: Codec, input_ids, loss_mask, features: torch.Tensor) -> bytes:
    """One sample's contiguous blob. features: [T, n, H]."""
    ids = np.asarray(input_ids, dtype=np.int32)
    mask = np.asarray(loss_mask, dtype=np.uint8)
    t = len(ids)
    if len(mask) != t or features.shape[0] != t:
        raise ShardFormatError(f"token count mismatch: {t} input_ids, {len(mask)} loss_mask, "
                               f"{features.shape[0]} feature rows")
    return ids.tobytes() + mask.tobytes() + codec.encode(features)


def build_shard(codec: Codec, layer_ids: list[int], hidden_size: int, provenance: dict,
                samples: list[tuple[str, int, bytes]]) -> bytes:
    """Assemble a shard from encoded samples [(sample_id, num_tokens, blob)]. Deterministic for equal inputs."""
    rows, offset = [], 0
    for sample_id, t, blob in samples:
        rows.append([sample_id, t, offset, len(blob), zlib.crc32(blob)])
        offset += len(blob)
    header = {"format": "flashdraft-features", "version": FORMAT_VERSION, "codec": codec.params(),
              "layer_ids": list(layer_ids), "hidden_size": hidden_size, "provenance": provenance,
              "columns": ["sample_id", "num_tokens", "offset", "length", "crc32"], "samples": rows}
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * ((-(16 + len(raw))) % _ALIGN)
    return b"".join([MAGIC, struct.pack("<Q", len(raw)), raw, *(blob for _, _, blob in samples)])


def header_length(prefix: bytes, where: str) -> int:
    """Total bytes before the data section, from the first 16 bytes of a shard."""
    if len(prefix) < 16 or prefix[:8] != MAGIC:
        raise ShardFormatError(f"{where}: not a flashdraft feature shard (bad magic)")
    return 16 + struct.unpack("<Q", prefix[8:16])[0]


def parse_header(data: bytes, where: str) -> ShardHeader:
    """`data` starts at byte 0 of the shard and holds at least the whole header."""
    end = header_length(data, where)
    if len(data) < end:
        raise ShardFormatError(f"{where}: truncated header ({len(data)} < {end} bytes)")
    try:
        h = json.loads(data[16:end])
        codec = Codec.from_params(h["codec"])
        if h.get("version") != FORMAT_VERSION:
            raise ShardFormatError(f"{where}: shard format version {h.get('version')} != {FORMAT_VERSION}")
        samples = [SampleEntry(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in h["samples"]]
        return ShardHeader(codec=codec, layer_ids=[int(i) for i in h["layer_ids"]], hidden_size=int(h["hidden_size"]),
                           provenance=h["provenance"], samples=samples, data_offset=end)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, ShardFormatError):
            raise
        raise ShardFormatError(f"{where}: invalid header: {exc}") from None


def sample_range(header: ShardHeader, index: int) -> tuple[int, int]:
    """Absolute [start, end) byte range of sample `index` inside the shard object."""
    e = header.samples[index]
    start = header.data_offset + e.offset
    return start, start + e.length


def decode_sample(header: ShardHeader, index: int, blob: bytes | memoryview, where: str,
                  check_crc: bool = True, defer: bool = False) -> Sample:
    """Check the sample's crc32 (skip only for bytes already verified, e.g. inside a sha256-checked part) and
    decode it; `defer` leaves the features encoded (`EncodedFeatures`) for codecs that decode on a device."""
    e = header.samples[index]
    if len(blob) != e.length or (check_crc and zlib.crc32(blob) != e.crc32):
        raise ShardFormatError(f"{where}: sample {index} ({e.sample_id}) failed its crc32 check "
                               f"(corrupt or truncated bytes)")
    t = e.num_tokens
    buf = memoryview(blob)
    ids = torch.from_numpy(np.frombuffer(buf[: 4 * t], dtype=np.int32).astype(np.int64))
    mask = torch.from_numpy(np.frombuffer(buf[4 * t: 5 * t], dtype=np.uint8).astype(bool))
    deferred = defer and header.codec.decodes_on_device
    payload = bytes(buf[5 * t:]) if deferred else buf[5 * t:]  # kept: a copy, not a view pinning the whole part
    feats = EncodedFeatures(header.codec, payload, t, len(header.layer_ids), header.hidden_size,
                            f"{where}: sample {index} ({e.sample_id})")
    return Sample(sample_id=e.sample_id, input_ids=ids, loss_mask=mask, features=feats if deferred else feats.decode())


def iter_shard(data: bytes, where: str):
    """Every sample of a whole shard held in memory, in stored order."""
    header = parse_header(data, where)
    for i in range(len(header.samples)):
        start, end = sample_range(header, i)
        yield decode_sample(header, i, memoryview(data)[start:end], where)
