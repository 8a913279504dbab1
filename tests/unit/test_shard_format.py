"""Shard layout: header parsing, single-sample byte ranges, crc32 checks."""

from __future__ import annotations

import pytest
import torch

from flashdraft.features.codecs import Codec
from flashdraft.features.shard import (
    ShardFormatError,
    build_shard,
    decode_sample,
    encode_sample,
    iter_shard,
    parse_header,
    sample_range,
)


def _shard(codec: Codec, lengths=(5, 17, 9)):
    g = torch.Generator().manual_seed(1)
    rows, samples = [], []
    for i, t in enumerate(lengths):
        ids = torch.randint(0, 1000, (t,), generator=g)
        mask = torch.rand(t, generator=g) > 0.5
        feats = torch.randn(t, 2, 64, generator=g).to(torch.bfloat16)
        rows.append((f"s{i}", ids, mask, feats))
        samples.append((f"s{i}", t, encode_sample(codec, ids.tolist(), mask.tolist(), feats)))
    return rows, build_shard(codec, [1, 3], 64, {"hidden_size": 64}, samples)


def test_round_trip_and_single_sample_range():
    rows, data = _shard(Codec("bf16-zstd"))
    assert data[:8] == b"FDSHARD1"
    out = list(iter_shard(data, "mem"))
    for (sid, ids, mask, feats), s in zip(rows, out, strict=True):
        assert s.sample_id == sid and s.input_ids.dtype == torch.int64 and s.loss_mask.dtype == torch.bool
        assert torch.equal(s.input_ids, ids) and torch.equal(s.loss_mask, mask)
        assert torch.equal(s.features, feats.reshape(len(ids), -1))
    header = parse_header(data, "mem")
    assert header.data_offset % 64 == 0 and header.num_tokens == 31
    start, end = sample_range(header, 1)
    assert decode_sample(header, 1, data[start:end], "mem").sample_id == "s1"


def test_identical_inputs_give_identical_bytes():
    assert _shard(Codec("fp8-zstd"))[1] == _shard(Codec("fp8-zstd"))[1]


def test_corrupt_sample_fails_crc_and_bad_magic_is_named():
    _, data = _shard(Codec("bf16"))
    header = parse_header(data, "x.fds")
    start, end = sample_range(header, 2)
    bad = bytearray(data[start:end])
    bad[3] ^= 1
    with pytest.raises(ShardFormatError, match=r"x.fds: sample 2 \(s2\) failed its crc32"):
        decode_sample(header, 2, bytes(bad), "x.fds")
    with pytest.raises(ShardFormatError, match="bad magic"):
        parse_header(b"PK\x03\x04" + data[4:], "y.fds")
