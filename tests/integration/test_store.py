"""The object store behaves the same on memory://, file:// and a real S3 server (rclone serve s3)."""

import pytest

from flashdraft.storage.store import (
    ChecksumError,
    NotCommittedError,
    ObjectStore,
    StoreError,
    StoreUnavailableError,
    open_store,
)

pytestmark = pytest.mark.integration


def test_put_get_range_list_delete(any_store: ObjectStore):
    any_store.put("a/b/one.bin", b"0123456789")
    any_store.put("a/two.bin", b"xyz")
    assert any_store.get("a/b/one.bin") == b"0123456789"
    assert any_store.get("a/b/one.bin", 2, 5) == b"234"
    assert any_store.size("a/b/one.bin") == 10
    assert any_store.list("a") == ["a/b/one.bin", "a/two.bin"]
    assert any_store.list("missing") == []
    any_store.delete("a/two.bin")
    assert not any_store.exists("a/two.bin")
    any_store.delete("a/two.bin")  # deleting twice is fine
    with pytest.raises(FileNotFoundError, match="two.bin"):
        any_store.get("a/two.bin")


def test_commit_protocol(any_store: ObjectStore):
    any_store.put("shards/partial.bin", b"half written")  # a crashed writer: data without a record
    rec = any_store.commit("shards/good.bin", b"payload", meta={"samples": 3})
    assert rec.size == 7 and any_store.read_commit("shards/good.bin").meta == {"samples": 3}
    assert any_store.list_committed("shards") == ["shards/good.bin"]
    assert any_store.get_verified("shards/good.bin") == b"payload"
    with pytest.raises(NotCommittedError, match="partial.bin"):
        any_store.get_verified("shards/partial.bin")
    big = bytes(range(256)) * 100  # above INLINE_MAX_BYTES: read from the object itself
    any_store.commit("shards/big.bin", big)
    any_store.put("shards/big.bin", big[:-1] + b"!")  # silent corruption after commit
    with pytest.raises(ChecksumError, match="big.bin"):
        any_store.get_verified("shards/big.bin")
    any_store.uncommit("shards/big.bin")
    assert any_store.list_committed("shards") == ["shards/good.bin"]


def test_a_small_object_recommitted_is_atomic_and_a_large_one_is_uncommitted_first(any_store: ObjectStore):
    any_store.commit_json("latest.json", {"step": 2})
    any_store.put_json("latest.json", {"step": 4})  # a writer killed between the object and its record
    assert any_store.get_json_verified("latest.json") == {"step": 2}, "the old commit, whole"
    any_store.commit_json("latest.json", {"step": 4})
    assert any_store.get_json_verified("latest.json") == {"step": 4}
    old, new = b"a" * 20000, b"b" * 20000
    any_store.commit("w.bin", old)
    deletes = []
    real_delete = any_store.delete
    any_store.delete = lambda key: (deletes.append(key), real_delete(key))[1]
    any_store.commit("w.bin", old)  # the same bytes again (a retried commit): nothing is uncommitted
    assert deletes == []
    any_store.commit("w.bin", new)
    assert deletes == ["w.bin.commit"] and any_store.get_verified("w.bin") == new


def test_json_and_child(any_store: ObjectStore):
    run = any_store.child("run-1")
    run.commit_json("metrics/x.json", {"tau": 2.5})
    assert run.get_json_verified("metrics/x.json") == {"tau": 2.5}
    assert "run-1/metrics/x.json" in any_store.list_committed("")
    # a run named by its URI (a reader record) opens read-only with this store's filesystem and credentials
    other = any_store.at(run.root + "/")
    assert other.root == run.root and other.read_only and other.get_json_verified("metrics/x.json") == {"tau": 2.5}
    with pytest.raises(StoreError, match="another scheme"):
        any_store.at("gs://bucket/run-1")


def test_s3_store_from_config_has_no_credentials_in_repr(s3_storage):
    store = open_store(s3_storage, "r1")
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert "flashdraft-test-secret" not in repr(store)


def test_s3_wrong_credentials_fail_clearly(s3_storage, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    store = open_store(s3_storage, "r1")
    with pytest.raises(Exception) as exc:
        store.put("k", b"v")
    assert "wrong" not in str(exc.value)


def test_unsupported_scheme():
    from flashdraft.storage.store import StoreError

    with pytest.raises(StoreError, match="gs"):
        ObjectStore("gs://bucket/x")


def test_credentials_from_mounted_secret_dir(s3_storage, monkeypatch, tmp_path):
    """A Kubernetes Secret mounted as files works without AWS_* variables in the environment."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text("flashdraft-test\n")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text("flashdraft-test-secret\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("FLASHDRAFT_S3_SECRET_DIR", str(secret))
    store = open_store(s3_storage, "secret-run")
    store.commit("x.bin", b"abc")
    assert store.get_verified("x.bin") == b"abc"
    (secret / "AWS_SECRET_ACCESS_KEY").unlink()
    from flashdraft.storage.store import StoreError

    with pytest.raises(StoreError, match="AWS_SECRET_ACCESS_KEY"):
        open_store(s3_storage, "secret-run")


def test_transient_errors_are_retried_and_permanent_ones_are_not(tmp_path, monkeypatch):
    store = ObjectStore(f"file://{tmp_path}", retries=3, backoff_s=0.001)
    store.put("k", b"value")
    real_cat, calls = store.fs.cat_file, {"n": 0}

    def flaky(path, start=None, end=None):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("connection reset by peer")
        return real_cat(path, start=start, end=end)

    monkeypatch.setattr(store.fs, "cat_file", flaky)
    assert store.get("k") == b"value" and calls["n"] == 3
    calls["n"] = -10  # always failing now: gives up after `retries` attempts, naming the key and the count
    with pytest.raises(StoreUnavailableError, match=r"get .*/k failed 4 times") as exc:
        store.get("k")
    assert calls["n"] == -10 + 4 and isinstance(exc.value.__cause__, ConnectionError)
    monkeypatch.setattr(store.fs, "cat_file", real_cat)
    with pytest.raises(FileNotFoundError):
        store.get("missing")


def test_large_reads_on_s3_are_parallel_range_gets_that_reassemble_exactly(s3_storage, monkeypatch):
    import os

    store = open_store(s3_storage.model_copy(update={"read_chunk_bytes": 2**16}), "chunked")
    data = os.urandom(5 * 2**16 + 123)  # 6 chunks, the last one short
    store.commit("big.bin", data)
    ranges = []
    real_get = store.get

    def get(key, start=None, end=None):
        ranges.append((key, start, end))
        return real_get(key, start, end)

    monkeypatch.setattr(store, "get", get)
    assert store.get_verified("big.bin") == data
    assert sorted(r[1:] for r in ranges if r[0] == "big.bin") == [
        (s, min(s + 2**16, len(data))) for s in range(0, len(data), 2**16)]
    ranges.clear()
    assert store.get_chunked("big.bin", 1000, 1000 + 2**17 + 5) == data[1000:1000 + 2**17 + 5]  # a sample's span
    assert len(ranges) == 3
    monkeypatch.setattr(store, "get", real_get)
    store.put("big.bin", data[: 3 * 2**16])  # truncated after commit: some ranges now lie past its end
    with pytest.raises(ChecksumError, match="big.bin"):
        store.get_verified("big.bin")


@pytest.mark.parametrize("key, remedy", [
    ("features/shard-00001/part-00000.fds", "recompute them with `flashdraft run-local --from extract`"),
    ("responses/shard-00000/chunk-00000.parquet", "recompute them with `flashdraft run-local --from generate`"),
    ("scratch/big.bin", None),  # no stage writes there: no remedy to name
])
def test_corrupt_at_rest_names_the_stage_to_recompute_from(tmp_path, key, remedy):
    """Bytes that stay wrong on every re-read: the one-line ChecksumError says which `--from` recomputes them
    (the stage whose declared outputs hold the key)."""
    store = ObjectStore(f"file://{tmp_path}/run", retries=0)
    big = bytes(range(256)) * 100
    store.commit(key, big)
    (tmp_path / "run" / key).write_bytes(big[:-1] + b"!")
    with pytest.raises(ChecksumError) as err:
        store.get_verified(key)
    message = str(err.value)
    assert key in message and "\n" not in message
    if remedy is None:
        assert "--from" not in message
    else:
        assert remedy in message and "stored bytes are corrupt" in message


def test_a_read_only_store_gives_up_without_stage_advice(tmp_path, monkeypatch):
    """status/report --run open their store read-only: past the retry budget they advise running the command
    again, never rerunning a stage (they are not one). A closed port stands in for a dead endpoint."""
    import socket

    from flashdraft.config import StorageConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    storage = StorageConfig(root="s3://bkt/run", endpoint_url=f"http://127.0.0.1:{port}")
    for read_only, advice in ((True, "run the command again once it answers"), (False, "rerun the stage")):
        store = ObjectStore(storage.root, storage, retries=1, backoff_s=0.01, read_only=read_only)
        with pytest.raises(StoreUnavailableError) as err:
            store.list("status/")
        assert advice in str(err.value)
        assert read_only is ("rerun the stage" not in str(err.value))
