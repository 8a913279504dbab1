"""`drafter.init: pretrained`: a drafter read from each format and place (z-lab, speculators, flashdraft's own
checkpoint, a store URI, the Hugging Face cache) drafts exactly what its source drafts; a setting or a target that
contradicts the checkpoint is refused in one line; a DFlash checkpoint starts a DFlash2 drafter."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.evaluate_fixtures import export_perturbed_drafter

from flashdraft.config import ConfigError
from flashdraft.drafter.attention import BlockLayout
from flashdraft.drafter.persistence import build_drafter
from flashdraft.drafter.pretrained import read_parent, weights_digest
from flashdraft.storage.store import open_store
from flashdraft.target.model import load_hf_config


@pytest.fixture()
def source(tiny_cfg, tmp_path):
    """A seeded tiny drafter with perturbed norms, committed as the run's final checkpoint and exported (float32)
    as z-lab and speculators folders, locally and in the run's store."""
    cfg = tiny_cfg.with_overrides({"export.dtype": "float32", "export.formats": ["zlab", "speculators"]})
    return cfg, export_perturbed_drafter(cfg, tmp_path / "out", seed=5, step=7)


def _pretrained(cfg, init_from: str, **sets):
    child = cfg.with_overrides({"run_id": "child", "drafter.init": "pretrained", "drafter.init_from": init_from,
                                **sets})
    return child, build_drafter(child, load_hf_config(child.target), seed=11).eval()


def _same_drafts(a, b) -> None:
    g = a.geometry
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(20, g.num_features * g.hidden_size, generator=gen)
    anchors, ids = torch.tensor([4, 9, 12]), torch.randint(0, 1000, (20,), generator=gen)
    args = (feats, BlockLayout(20, g.block_size, anchors), torch.arange(20), ids[anchors], anchors)
    with torch.no_grad():
        assert torch.equal(a.logits(a(*args)), b.logits(b(*args)))
        assert torch.equal(a.propose_block(feats, 3), b.propose_block(feats, 3))


@pytest.mark.parametrize("where", ["zlab", "speculators", "checkpoints", "store-export", "checkpoint-folder"])
def test_a_pretrained_drafter_drafts_exactly_what_its_source_drafts(source, tmp_path, where):
    cfg, model = source
    store = open_store(cfg.storage, cfg.run_id)
    init_from = {"zlab": str(tmp_path / "out" / "zlab"), "speculators": str(tmp_path / "out" / "speculators"),
                 "checkpoints": store.url("checkpoints/"), "store-export": store.url("export/zlab/"),
                 "checkpoint-folder": str(tmp_path / "ckpt")}[where]
    if where == "checkpoint-folder":  # a checkpoint copied out of the store is a plain drafter folder
        shutil.copytree(cfg.storage.root.removeprefix("file://") + "/tiny/checkpoints/step-00000007",
                        tmp_path / "ckpt")
    _, loaded = _pretrained(cfg, init_from)
    _same_drafts(model, loaded)
    assert loaded.geometry.target_layer_ids == model.geometry.target_layer_ids
    assert loaded.geometry.trainable_mask and torch.equal(loaded.mask_embedding, model.mask_embedding)



def test_a_speculators_folder_that_leaves_the_last_target_layer_implicit_reads_it_back(tiny_cfg, tmp_path):
    """speculators' own converter leaves a z-lab layer id equal to the target's last layer out of
    aux_hidden_state_layer_ids (vLLM captures the last layer anyway): the fc's width says it feeds the drafter."""
    cfg = tiny_cfg.with_overrides({"export.dtype": "float32", "export.formats": ["speculators"],
                                   "features.num_features": 3, "features.layer_ids": [1, 4, 7]})
    model = export_perturbed_drafter(cfg, tmp_path / "out")
    conf = tmp_path / "out" / "speculators" / "config.json"
    c = json.loads(conf.read_text())
    assert c["aux_hidden_state_layer_ids"] == [2, 5, 8]  # capture ids: z-lab id + 1; 8 = the tiny target's last
    conf.write_text(json.dumps({**c, "aux_hidden_state_layer_ids": [2, 5]}))  # as speculators' converter writes it
    _, loaded = _pretrained(cfg, str(conf.parent))
    assert loaded.geometry.target_layer_ids == model.geometry.target_layer_ids == [1, 4, 7]
    _same_drafts(model, loaded)

def test_the_parent_is_named_by_source_format_and_weights_digest(source, tmp_path):
    folder = tmp_path / "out" / "zlab"
    parent = read_parent(str(folder))
    import hashlib

    assert parent.identity.format == "zlab" and parent.identity.revision is None
    assert parent.identity.sha256 == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    assert read_parent(str(tmp_path / "out" / "speculators"), num_target_layers=8).identity.format == "speculators"
    assert weights_digest(str(folder)) == parent.identity.sha256
    store_export = open_store(source[0].storage, "tiny").url("export/zlab/")
    assert weights_digest(store_export) == read_parent(store_export).identity.sha256 == parent.identity.sha256


def test_hf_repo_is_read_through_the_cache_offline(source, tmp_path, monkeypatch):
    """A Hub repo laid out as huggingface_hub's cache holds it (snapshots/<commit>/, refs/main): read offline,
    by branch and by commit, with the commit recorded."""
    cfg, model = source
    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--someone--tiny-dflash"
    shutil.copytree(tmp_path / "out" / "zlab", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    for spec in ("hf:someone/tiny-dflash", f"hf:someone/tiny-dflash@{commit}"):
        _, loaded = _pretrained(cfg, spec)
        _same_drafts(model, loaded)
        parent = read_parent(spec)
        assert parent.identity.revision == commit and weights_digest(spec) == parent.identity.sha256
    with pytest.raises(ConfigError, match=r"hf:someone/absent.*Hugging Face cache"):
        _pretrained(cfg, "hf:someone/absent")


@pytest.mark.parametrize(("sets", "message"), [
    ({"drafter.num_layers": 2}, r"drafter\.num_layers=2 contradicts .* whose value is 1: set drafter.num_layers: 1"),
    ({"drafter.block_size": 16}, r"drafter\.block_size=16 contradicts .* whose value is 8"),
    ({"drafter.num_heads": 2}, r"drafter\.num_heads=2 contradicts .* whose value is 4"),
    ({"drafter.mask_token_id": 3}, r"drafter\.mask_token_id=3 contradicts"),
    ({"drafter.sliding_window": 4}, r"drafter\.sliding_window=4 contradicts .* whose value is null"),
    ({"features.layer_ids": [1, 2, 3, 4, 6]},
     r"features\.layer_ids=\[1, 2, 3, 4, 6\] contradicts .* \[1, 2, 3, 4, 5\]: set features.layer_ids"),
])
def test_a_setting_that_contradicts_the_checkpoint_is_refused_in_one_line(source, tmp_path, sets, message):
    cfg, _ = source
    with pytest.raises(ConfigError, match=message) as err:
        _pretrained(cfg, str(tmp_path / "out" / "zlab"), **sets)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("edit", "message"), [
    ({"hidden_size": 512}, r"made for another target: its hidden size is 512, tiny-qwen3's is 256"),
    ({"vocab_size": 1000}, r"made for another target: its vocabulary is 1000"),
    ({"num_target_layers": 30}, r"made for another target: its decoder layers is 30"),
])
def test_a_checkpoint_for_another_target_is_refused_in_one_line(source, tmp_path, edit, message):
    cfg, _ = source
    folder = tmp_path / "other"
    shutil.copytree(tmp_path / "out" / "zlab", folder)
    c = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**c, **edit}))
    with pytest.raises(ConfigError, match=message) as err:
        _pretrained(cfg, str(folder))
    assert "\n" not in str(err.value)


def test_not_a_drafter_and_missing_folder_are_refused(source, tmp_path):
    cfg, _ = source
    with pytest.raises(ConfigError, match="no such folder"):
        _pretrained(cfg, str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither drafter_config.json .* nor config.json"):
        _pretrained(cfg, str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="drafter.init=pretrained needs drafter.init_from"):
        cfg.with_overrides({"drafter.init": "pretrained"})
    with pytest.raises(ConfigError, match="training.max_steps=0 evaluates a pretrained drafter"):
        cfg.with_overrides({"training.max_steps": 0})


def test_a_dflash_checkpoint_starts_a_dflash2_drafter(source, tmp_path):
    cfg, model = source
    child, loaded = _pretrained(cfg, str(tmp_path / "out" / "zlab"), **{"drafter.kind": "dflash2",
                                                                        "drafter.conv_group_size": 64})
    assert loaded.geometry.kind == "dflash2" and loaded.candidate_selector is not None
    own = model.state_dict()
    for name, value in loaded.state_dict().items():
        if name in own:
            assert torch.equal(value, own[name]), name
    fresh = build_drafter(child.with_overrides({"drafter.init": "random", "drafter.init_from": None}),
                          load_hf_config(child.target), seed=11)
    assert torch.equal(loaded.candidate_selector.predecessor_codebook, fresh.candidate_selector.predecessor_codebook)
    # and a DFlash2 checkpoint does not start a DFlash run
    dflash2 = tmp_path / "d2"
    from flashdraft.drafter.persistence import save_drafter

    save_drafter(loaded, dflash2)
    with pytest.raises(ConfigError, match=r"drafter\.kind=\"dflash\" contradicts .*: set drafter.kind: dflash2"):
        _pretrained(cfg, str(dflash2))


@pytest.mark.parametrize("where", ["checkpoints", "store-export", "unrecorded"])
def test_a_store_drafter_is_read_verified_or_refused(source, tmp_path, where):
    """drafter.init_from=<store URI> reads committed bytes verified (a checkpoint against its commit records, a
    run's export/<format>/ against its manifest): a byte flipped at rest stops the run naming the key; a store
    folder whose files nothing vouches for is refused rather than read as is."""
    from flashdraft.storage.store import ChecksumError

    cfg, _ = source
    store = open_store(cfg.storage, cfg.run_id)
    folder = {"checkpoints": "checkpoints/step-00000007", "store-export": "export/zlab",
              "unrecorded": "copied/zlab"}[where]
    if where == "unrecorded":  # an export copied within the store by hand: no record travels with it
        for name, data in ((k.rsplit("/", 1)[-1], store.get(k)) for k in store.list("export/zlab/")):
            store.put(f"{folder}/{name}", data)
    path = tmp_path / "runs" / cfg.run_id / folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    init_from = store.url("checkpoints/" if where == "checkpoints" else folder)
    error, match = ((ConfigError, "has no commit record and no export manifest lists it") if where == "unrecorded"
                    else (ChecksumError, rf"checksum mismatch for \S*{folder}/model.safetensors"))
    with pytest.raises(error, match=match):
        _pretrained(cfg, init_from)
