"""docs/serving.md says what an export really writes: a tiny drafter, evaluated, is exported the way the doc says
(`flashdraft export`, default folder, `--speculators`), and the doc's own paths, file table, manifest and serve
command are checked against that folder and the run's store; the model card carries the run's figures; the
store's export folder is exactly the served folder (its commit record lives beside it) and stays exactly-once."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from support.shared_runs import copy_run
from typer.testing import CliRunner

from flashdraft.cli.main import app
from flashdraft.components.export.card import card_meta
from flashdraft.components.export.export import (
    ExportError,
    commit_export,
    download_export,
    read_export,
)
from flashdraft.components.export.report_section import drafter_uris
from flashdraft.run.provenance import current
from flashdraft.storage import layout
from flashdraft.storage.exports import UnsafeNameError
from flashdraft.storage.store import ChecksumError, ObjectStore, open_store, sha256_hex

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def doc_blocks() -> list[str]:
    """Every fenced code block of docs/serving.md, continuation lines joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```\w*\n(.*?)```", DOC.read_text(), flags=re.S)]


def doc_file_table() -> dict[str, str]:
    """The z-lab folder's file table: file name -> its description."""
    out = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            for name in re.findall(r"`([^`]+)`", cells[0]):
                out[name] = cells[1]
    return out


@pytest.fixture(scope="module")
def exported(tiny_evaluated, tmp_path_factory):
    """The session's tiny evaluation (prep, a committed drafter, evaluate; tests/support/shared_runs.py), copied,
    then `flashdraft export --speculators` run from a fresh folder as the doc shows it (default --out:
    exports/<run_id>/)."""
    tmp = tmp_path_factory.mktemp("serving")
    cfg, sets = copy_run(tiny_evaluated, tmp)
    cwd = Path.cwd()
    os.chdir(tmp)
    try:
        args = ["export", "--preset", "tiny", "--speculators", *[a for k, v in sets.items()
                                                                 for a in ("--set", f"{k}={v}")]]
        res = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, res.output
    return cfg, tmp, tiny_evaluated["metrics"]


def test_the_docs_paths_file_table_and_serve_command_match_a_real_export(exported):
    cfg, cwd, _ = exported
    named = {p for block in doc_blocks() for p in re.findall(r"exports/<run_id>/(\w+)", block)}
    assert named == {"zlab", "speculators"}, named
    for fmt in named:  # every folder the doc names exists where it says, relative to where the command ran
        folder = cwd / "exports" / cfg.run_id / fmt
        assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file(), folder
        assert (folder / "README.md").is_file(), f"{folder}: no model card"
    zlab = cwd / "exports" / cfg.run_id / "zlab"
    table = doc_file_table()
    assert set(table) - {"mask_embedding.pt"} == {f.name for f in zlab.iterdir()}, \
        "the doc's file table is exactly what is written, and the pickle only when asked"
    assert all("only with" in table[f] for f in ("mask_embedding.pt", "mask_embedding.safetensors"))
    assert "export.mask_embedding_pt: true" in table["mask_embedding.pt"]

    store = open_store(cfg.storage, cfg.run_id)
    for fmt in named:  # the store's folder is the served folder, byte for byte: no *.commit inside
        folder = cwd / "exports" / cfg.run_id / fmt
        assert store.list(layout.export_prefix(fmt)) == sorted(layout.export_prefix(fmt) + f.name
                                                               for f in folder.iterdir())
        assert read_export(store, fmt) == {f.name: f.read_bytes() for f in folder.iterdir()}
    manifest = re.search(r"`(export/<format>\.manifest\.json)`", DOC.read_text()).group(1)
    assert store.is_committed(manifest.replace("<format>", "zlab")), "the manifest the doc names is committed"
    assert drafter_uris(store)[:2] == [store.url("export/speculators"), store.url("export/zlab")], "the report's"

    # the doc's vLLM command and the card's take the same speculative config; the card's names this folder
    doc_cmd = next(c for c in doc_blocks() if "--speculative-config" in c)
    doc_spec = json.loads(shlex.split(doc_cmd[doc_cmd.index("--speculative-config"):])[1])
    card = (zlab / "README.md").read_text()
    card_cmd = re.search(r"```bash\n(.*?)```", card, flags=re.S).group(1).replace("\\\n", " ")
    tokens = shlex.split(card_cmd)
    assert tokens[:3] == ["vllm", "serve", cfg.target.model]
    card_spec = json.loads(tokens[tokens.index("--speculative-config") + 1])
    assert set(card_spec) == set(doc_spec) and card_spec["method"] == doc_spec["method"] == "dflash"
    assert card_spec["model"] == doc_spec["model"].replace("<run_id>", cfg.run_id)
    assert (cwd / card_spec["model"]).resolve() == zlab.resolve()
    assert card_spec["num_speculative_tokens"] == cfg.drafter.block_size - 1


def test_the_model_card_carries_the_run(exported):
    cfg, cwd, evaluated = exported
    card = (cwd / "exports" / cfg.run_id / "zlab" / "README.md").read_text()
    meta = card_meta(card)
    fd = meta["flashdraft"]
    assert meta["base_model"] == cfg.target.model and "speculative-decoding" in meta["tags"]
    assert fd["version"] == current().flashdraft and fd["commit"] == current().commit
    assert {k: fd["target"][k] for k in ("model", "revision", "source")} == {
        "model": cfg.target.model, "revision": cfg.target.revision, "source": cfg.target.source}
    # a built (not Hub) target: no commit, the digest of its weight files instead (flashdraft/run/target_pin.py)
    assert fd["target"]["commit"] is None and re.fullmatch(r"[0-9a-f]{64}", fd["target"]["weights_sha256"])
    assert fd["drafter"]["block_size"] == cfg.drafter.block_size and fd["drafter"]["kind"] == "dflash"
    assert fd["drafter"]["target_layer_ids"] == [1, 2, 3, 4, 5] and fd["training"]["step"] == 1
    heldout = evaluated.suites[0]
    assert fd["eval"]["suites"]["heldout"]["tau"] == heldout.tau
    assert fd["eval"]["lossless"] == f"passed on {evaluated.lossless.prompts} prompts"
    assert f"| heldout | {heldout.prompts} | default | {heldout.tau:.2f} | passed |" in card
    assert "speedup" not in card, "no timings: the same evaluation gives the same card bytes"
    assert "Lossless check: passed on" in card and "builtin:demo" in card and "license" in card.lower()
    recs = fd["num_speculative_tokens"]  # the evaluated device's k first, then each GPU type's, modelled
    assert recs[0]["num_speculative_tokens"] == evaluated.draft_length.num_drafts
    assert recs[0]["device"] == evaluated.draft_length.device_name and recs[0]["basis"].startswith("measured")
    assert all(1 <= r["num_speculative_tokens"] <= cfg.drafter.block_size - 1 for r in recs)
    assert any(r["basis"].startswith("modelled") for r in recs[1:])
    assert f"| {recs[0]['device']} | {recs[0]['num_speculative_tokens']} | measured" in card
    spec = card_meta((cwd / "exports" / cfg.run_id / "speculators" / "README.md").read_text())["flashdraft"]
    assert spec["format"] == "speculators"


def test_an_export_folder_is_committed_once_by_its_manifest(tmp_path):
    store = ObjectStore("memory://serving-doc/run")
    with pytest.raises(ExportError, match="zlab.manifest.json is not committed"):
        read_export(store, "zlab")
    store.put("export/zlab/config.json.commit", b"{}")  # an older flashdraft's per-file record
    commit_export(store, "zlab", {"config.json": b"{}", "extra.bin": b"x" * 10})
    commit_export(store, "zlab", {"config.json": b'{"a": 1}', "model.safetensors": b"w" * 100})
    assert store.list("export/zlab/") == ["export/zlab/config.json", "export/zlab/model.safetensors"], \
        "files of the earlier export and old records are gone"
    assert read_export(store, "zlab") == {"config.json": b'{"a": 1}', "model.safetensors": b"w" * 100}
    store.put("export/zlab/model.safetensors", b"v" * 100)  # corrupted at rest
    with pytest.raises(ChecksumError, match="export/zlab/model.safetensors"):
        read_export(store, "zlab")
    store.uncommit("export/zlab.manifest.json")  # as after a crash before the manifest: nothing is readable
    with pytest.raises(ExportError):
        read_export(store, "zlab")
    assert download_export(store, tmp_path) == {} and list(tmp_path.iterdir()) == []


def test_the_local_copy_is_named_in_the_export_summary(exported, tmp_path):
    """run-local's copy of the export (download_export) is what metrics/export.json names as each format's local
    folder: the record a script reads says what the console printed, and the rest of the summary is unchanged."""
    cfg, _, _ = exported
    store = open_store(cfg.storage, cfg.run_id)
    before = store.get_json_verified(layout.metrics_key("export"))
    folders = download_export(store, tmp_path / "exports" / cfg.run_id)
    assert set(folders) == {"zlab", "speculators"}
    after = store.get_json_verified(layout.metrics_key("export"))
    assert {fmt: f["local"] for fmt, f in after["formats"].items()} == {fmt: str(p) for fmt, p in folders.items()}
    for fmt, f in after["formats"].items():
        assert {k: v for k, v in f.items() if k != "local"} == \
            {k: v for k, v in before["formats"][fmt].items() if k != "local"}
    assert {k: v for k, v in after.items() if k != "formats"} == {k: v for k, v in before.items() if k != "formats"}


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", ["format", "file", "dot-file"])
def test_names_from_the_store_stay_inside_the_local_folder(tmp_path, bad):
    """download_export takes format names from listed keys and file names from the manifest: a committed
    `export/...manifest.json` (format `..`) or a manifest naming `../../x` is refused before the local folder is
    touched (the format `..` would otherwise swap out and delete the whole exports/ tree)."""
    store = ObjectStore(f"memory://names-{bad}/run")
    commit_export(store, "zlab", {"config.json": b"{}", "model.safetensors": b"w" * 10})
    if bad == "format":
        commit_export(store, "..", {"config.json": b"{}"})
    else:
        name = "../../x" if bad == "file" else ".."
        store.put(f"export/zlab/{name}", b"evil")
        manifest = store.get_json_verified("export/zlab.manifest.json")
        manifest["files"][name] = {"sha256": sha256_hex(b"evil"), "size": 4}
        store.commit_json("export/zlab.manifest.json", manifest)
    out = tmp_path / "exports" / "run"
    (out / "zlab").mkdir(parents=True)
    (out / "zlab" / "config.json").write_text("earlier")
    (tmp_path / "exports" / "other.txt").write_text("keep")
    before = _tree(tmp_path)
    with pytest.raises(UnsafeNameError, match=r"refusing the name '(\.\.|\.\./\.\./x)'"):
        download_export(store, out)
    assert _tree(tmp_path) == before and not (tmp_path / "x").exists()
