"""Reader: deterministic order per (seed, epoch), disjoint ranks, exact resume, checks on read."""

from __future__ import annotations

import pytest
import torch
from support.feature_fixtures import commit_parts, part_bytes, provenance

from flashdraft.features.manifest import PartListError, ProvenanceError, committed_parts, recorded_parts
from flashdraft.features.parts import PartCache, read_header
from flashdraft.features.reader import OfflineReader, open_reader
from flashdraft.features.shard import EncodedFeatures, ShardFormatError
from flashdraft.storage import layout
from flashdraft.storage.store import ChecksumError, ObjectStore, open_store

LAYOUT = {0: [7, 5], 1: [6], 2: [4, 4, 3]}
TOTAL = sum(sum(v) for v in LAYOUT.values())


@pytest.fixture(params=["bf16-zstd", "fp8-zstd", "q4"])
def codec_cfg(tiny_cfg, request):
    """The tiny config storing its features with each codec family: every reader test runs on each."""
    return tiny_cfg.with_overrides({"features.codec": request.param})


@pytest.fixture()
def store(codec_cfg):
    # millisecond backoffs: the corrupted-sample test retries a checksum mismatch storage.retries times
    s = ObjectStore(f"memory://reader-{id(codec_cfg)}", backoff_s=0.001)
    commit_parts(s, codec_cfg, LAYOUT)
    return s


@pytest.fixture()
def bf16_store(tiny_cfg):
    """bf16-zstd parts only: large enough that no commit record carries its part inline (GET counts below)."""
    s = ObjectStore(f"memory://reader-bf16-{id(tiny_cfg)}")
    commit_parts(s, tiny_cfg, LAYOUT)
    return s


def ids(reader):
    return [s.sample_id for s in reader]


def test_whole_part_and_byte_range_reads_give_the_same_stream(store):
    a = [(s.sample_id, s.features) for s in OfflineReader(store, seed=9, whole_parts=True)]
    b = [(s.sample_id, s.features) for s in OfflineReader(store, seed=9, whole_parts=False)]
    assert [x for x, _ in a] == [x for x, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))


def _count_gets(store, monkeypatch) -> dict:
    counts = {"whole": 0, "range": 0}
    real = store.get

    def get(key, start=None, end=None):
        if not key.endswith(".commit"):
            whole = start is None or (start == 0 and end == store.size(key))
            counts["whole" if whole else "range"] += 1
        return real(key, start, end)

    monkeypatch.setattr(store, "get", get)
    return counts


def test_one_rank_reads_whole_parts_and_several_ranks_read_only_their_samples(bf16_store, monkeypatch):
    store = bf16_store
    counts = _count_gets(store, monkeypatch)
    assert len(ids(OfflineReader(store, seed=2))) == TOTAL
    assert counts == {"whole": len(LAYOUT[0]) + len(LAYOUT[1]) + len(LAYOUT[2]), "range": 6}  # + 6 header probes
    counts.update(whole=0, range=0)
    got = ids(OfflineReader(store, seed=2, rank=1, world_size=2))
    assert counts["whole"] == 0 and counts["range"] == len(got) + 6  # no part read whole for half its samples


def test_whole_part_cache_stays_within_its_byte_budget(store, monkeypatch):
    reference = [(s.sample_id, s.features) for s in OfflineReader(store, seed=5, shuffle_buffer=16, whole_parts=False)]
    counts = _count_gets(store, monkeypatch)
    sizes = {read_header(store, k).size for k in committed_parts(store)}  # parts, not the shards' DONE records
    budget = min(sizes) * 3 // 2  # room for one part, never two
    reader = OfflineReader(store, seed=5, shuffle_buffer=16, prefetch=12, threads=4, part_cache_bytes=budget)
    peak = []
    real_get = PartCache.get

    def get(cache, key, size):
        out = real_get(cache, key, size)
        peak.append(cache.held)
        return out

    monkeypatch.setattr(PartCache, "get", get)
    got = [(s.sample_id, s.features) for s in reader]
    assert [x for x, _ in got] == [x for x, _ in reference]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(got, reference, strict=True))
    assert all(held <= budget or held in sizes for held in peak)  # over budget only by one lone part...
    assert 0 < counts["whole"] < len(sizes) and counts["range"] > len(sizes)  # ...so some were read by range


def test_order_is_deterministic_per_seed_and_epoch_and_complete(store, codec_cfg):
    a = OfflineReader(store, seed=3, shuffle_buffer=4, expected_provenance=provenance(codec_cfg))
    b = OfflineReader(store, seed=3, shuffle_buffer=4)
    e0 = ids(a)
    assert e0 == ids(b) and sorted(e0) == sorted(set(e0)) and len(e0) == TOTAL
    e1 = ids(a)  # iterating again moves to the next epoch
    assert a.epoch == 2 and sorted(e1) == sorted(e0) and e1 != e0
    assert ids(OfflineReader(store, seed=4, shuffle_buffer=4)) != e0


def test_samples_have_the_documented_types(store):
    s = next(iter(OfflineReader(store)))
    assert s.input_ids.dtype == torch.int64 and s.loss_mask.dtype == torch.bool
    assert s.features.dtype == torch.bfloat16 and s.features.shape == (len(s.input_ids), 5 * 256)


def test_deferred_decode_leaves_only_device_decodable_features_encoded_and_decodes_to_the_same_bits(store,
                                                                                                     codec_cfg):
    eager = {s.sample_id: s for s in OfflineReader(store, seed=2)}
    deferred = list(OfflineReader(store, seed=2, defer_decode=True))
    assert [s.sample_id for s in deferred] == list(eager)
    q4 = codec_cfg.features.codec == "q4"
    assert all(isinstance(s.features, EncodedFeatures) == q4 for s in deferred)
    for s in deferred:
        got = s.decoded("cpu")
        assert isinstance(got.features, torch.Tensor) and torch.equal(got.input_ids, eager[s.sample_id].input_ids)
        assert torch.equal(got.features, eager[s.sample_id].features), s.sample_id
    if q4:  # a payload that went bad after its crc32 check names the part and sample
        bad = deferred[0].features
        broken = EncodedFeatures(bad.codec, bad.payload[:-3], bad.num_tokens, bad.num_layers, bad.hidden, bad.where)
        with pytest.raises(ShardFormatError, match=r"features/shard-.*\.fds: sample \d+ \(.*\): q4: expected"):
            broken.decode()


def test_ranks_are_disjoint_and_even(store):
    per_rank = [ids(OfflineReader(store, seed=1, rank=r, world_size=4)) for r in range(4)]
    flat = [x for r in per_rank for x in r]
    assert len(set(flat)) == len(flat) == TOTAL - TOTAL % 4
    assert {len(r) for r in per_rank} == {TOTAL // 4}
    assert len(OfflineReader(store, rank=0, world_size=4)) == TOTAL // 4


def test_resume_from_state_dict_continues_exactly(store):
    full = ids(OfflineReader(store, seed=5, rank=1, world_size=2))
    first = OfflineReader(store, seed=5, rank=1, world_size=2)
    it = iter(first)
    head = [next(it).sample_id for _ in range(5)]
    state = first.state_dict()
    assert state == {"seed": 5, "epoch": 0, "consumed": 5}
    second = OfflineReader(store, seed=5, rank=1, world_size=2)
    second.load_state_dict(state)
    assert head + ids(second) == full


def test_corrupted_sample_is_reported_with_its_shard(store):
    key = layout.feature_part_key(1, 0)
    data = bytearray(store.get(key))
    data[-5] ^= 0x10
    store.put(key, bytes(data))
    with pytest.raises(ShardFormatError, match=r"shard-00001/part-00000.fds: sample \d+ .* crc32"):
        ids(OfflineReader(store, shuffle=False, whole_parts=False))  # byte ranges: per-sample crc32
    with pytest.raises(ChecksumError, match="shard-00001/part-00000.fds"):
        ids(OfflineReader(store, shuffle=False, whole_parts=True))  # whole parts: sha256 of the commit record


def test_provenance_mismatch_is_refused_with_the_fields(tiny_cfg):
    s = ObjectStore(tiny_cfg.storage.root).child(tiny_cfg.run_id)
    commit_parts(s, tiny_cfg, {0: [2], 1: []})
    assert len(ids(open_reader(tiny_cfg))) == 2
    other = tiny_cfg.with_overrides({"features.layer_ids": [0, 2, 4, 6, 7], "features.codec": "fp8"})
    with pytest.raises(ProvenanceError) as err:
        ids(open_reader(other))
    assert "layer_ids: data has [1, 2, 3, 4, 5], config expects [0, 2, 4, 6, 7]" in str(err.value)
    assert "codec: data has {'name': 'bf16-zstd'" in str(err.value) and "tokenizer_sha" not in str(err.value)


def test_dataloader_workers_split_disjointly(tiny_cfg, tmp_path):
    s = ObjectStore(f"file://{tmp_path}/dl")
    commit_parts(s, tiny_cfg, LAYOUT)
    per_rank = []
    for rank in range(2):
        reader = OfflineReader(s, seed=2, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(reader, batch_size=None, num_workers=2, collate_fn=lambda x: x)
        per_rank.append([x.sample_id for x in loader])
    flat = per_rank[0] + per_rank[1]
    assert len(flat) == len(set(flat)) == TOTAL - TOTAL % 2
    assert len(per_rank[0]) == len(per_rank[1])


@pytest.mark.parametrize("how", ["deleted", "unlisted"])
def test_training_refuses_a_recorded_part_the_store_does_not_hold(tiny_cfg, monkeypatch, how):
    """Offline training's part list is extract's DONE records: a part the store lost, or one its listing misses
    (an eventually consistent store, a source partly cleared), is refused by name, never silently not trained."""
    from flashdraft.components.train.distributed import DistEnv
    from flashdraft.components.train.schedule import build_schedule

    cfg = tiny_cfg.with_overrides({"data.num_shards": 3})
    store = open_store(cfg.storage, cfg.run_id)
    commit_parts(store, cfg, LAYOUT)
    gone = layout.feature_part_key(2, 1)
    if how == "deleted":
        store.uncommit(gone)
    else:
        listed = ObjectStore.list
        monkeypatch.setattr(ObjectStore, "list", lambda self, prefix="": [k for k in listed(self, prefix)
                                                                          if not k.startswith(gone)])
    with pytest.raises(PartListError, match=rf"/{gone} is recorded in \S+/features/shard-00002/DONE but the store "
                                            r"does not list it as committed \(1 of 6"):
        build_schedule(cfg, DistEnv(0, 1, 0, torch.device("cpu")))


def test_training_refuses_a_shard_whose_extraction_has_not_finished(tiny_cfg):
    cfg = tiny_cfg.with_overrides({"data.num_shards": 4})
    commit_parts(open_store(cfg.storage, cfg.run_id), cfg, LAYOUT)
    with pytest.raises(PartListError, match=r"features/shard-00003/DONE is not committed: extraction of shard 3"):
        open_reader(cfg)


@pytest.mark.parametrize("whole_parts", [True, False])
def test_a_part_re_committed_during_training_is_refused_not_decoded_with_its_stale_header(tiny_cfg, whole_parts):
    """The epoch order comes from the recorded parts' headers; a part re-committed with other bytes afterwards
    (a concurrent writer) is refused by name, whether read whole (sha256 against the DONE record) or by sample
    ranges (crc32, then its commit record against the DONE record)."""
    store = ObjectStore(f"memory://recommit-{whole_parts}", backoff_s=0.001)
    commit_parts(store, tiny_cfg, LAYOUT)
    reader = OfflineReader(store, parts=recorded_parts(store, 3), shuffle=False, whole_parts=whole_parts)
    reader.epoch_order()  # every header read
    key = layout.feature_part_key(0, 0)
    data, meta = part_bytes(tiny_cfg, 5, 5, 7)  # other samples under the same key
    store.commit(key, data, meta)
    with pytest.raises(PartListError, match=rf"{key} was re-committed since \S+/shard-00000/DONE recorded it"):
        ids(reader)
