"""Shard layout: header parsing, single-sample byte ranges, crc32 checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashdraft.features.codecs import Codec, relative_error_per_layer
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


@pytest.mark.parametrize("name", ["fp8-zstd", "q4"])
def test_identical_inputs_give_identical_bytes(name):
    assert _shard(Codec(name))[1] == _shard(Codec(name))[1]


@pytest.mark.parametrize("name", ["bf16", "q4"])
def test_corrupt_sample_fails_crc_and_bad_magic_is_named(name):
    _, data = _shard(Codec(name))
    header = parse_header(data, "x.fds")
    start, end = sample_range(header, 2)
    bad = bytearray(data[start:end])
    bad[3] ^= 1
    with pytest.raises(ShardFormatError, match=r"x.fds: sample 2 \(s2\) failed its crc32"):
        decode_sample(header, 2, bytes(bad), "x.fds")
    with pytest.raises(ShardFormatError, match="bad magic"):
        parse_header(b"PK\x03\x04" + data[4:], "y.fds")


DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["bf16", "bf16-zstd", "fp8", "fp8-zstd"])
def test_shards_written_before_the_codec_registry_still_read(name):
    """tests/unit/data/v1-*.fds were written by flashdraft before q4 and the codec registry (same format version);
    the .json beside each holds what that version decoded. fp8-zstd's uses block64 scales."""
    ref = json.loads((DATA / f"v1-{name}.json").read_text())
    out = list(iter_shard((DATA / f"v1-{name}.fds").read_bytes(), f"v1-{name}.fds"))
    assert [s.input_ids.tolist() for s in out] == ref["ids"]
    assert [s.features.view(torch.int16).flatten().tolist() for s in out] == ref["features"]


def test_q4_shard_round_trip_and_header_records_its_parameters():
    codec = Codec("q4", q4_values="nf4", q4_block=16, q4_outliers=1)
    rows, data = _shard(codec)
    header = parse_header(data, "mem")
    assert header.codec == codec and json.loads(data[16:header.data_offset])["codec"]["version"] == 1
    for (sid, ids, _, feats), s in zip(rows, iter_shard(data, "mem"), strict=True):
        assert s.sample_id == sid and torch.equal(s.input_ids, ids)
        assert relative_error_per_layer(feats, s.features.reshape(feats.shape)).max() < 0.2


@pytest.mark.parametrize("codec", [{"name": "q5"}, {"name": "q4", "version": 9, "q4_block": 32}])
def test_unknown_codec_in_a_header_fails_naming_the_part_and_the_codec(codec):
    _, data = _shard(Codec("q4"))
    end = 16 + int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:end])
    header["codec"] = codec
    raw = json.dumps(header).encode()
    forged = b"FDSHARD1" + len(raw).to_bytes(8, "little") + raw
    with pytest.raises(ShardFormatError, match=r"s3://b/run/features/shard-00000/part-00003\.fds: .*"
                       + ("unknown codec 'q5'" if codec["name"] == "q5" else "q4 payload version 9")):
        parse_header(forged, "s3://b/run/features/shard-00000/part-00003.fds")
