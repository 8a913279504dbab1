"""The test Hub server (tests/support/hub_server.py) answers the Hub clients flashdraft uses as huggingface.co would:
datasets' config and split listing, a streamed split, the card's gating fields, a model snapshot, and a branch that
moves when a test commits (a revision pinned to the old commit still reads the old files)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support.hub_server import GSM8K, NEMOTRON, TINY_MODEL, subprocess_env


def _python(code: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_datasets_listing_and_streaming(hub_server, tmp_path):
    """A fresh process with only HF_ENDPOINT set lists configs and splits, streams rows and refuses a missing config
    and a wrong split as the Hub does."""
    out = _python(f"""
        import datasets
        print(datasets.get_dataset_config_names("{GSM8K}"))
        print(datasets.get_dataset_split_names("{NEMOTRON}"))
        rows = list(datasets.load_dataset("{NEMOTRON}", split="chat", streaming=True))
        print(len(rows), rows[0]["messages"][0]["role"])
        for kwargs in ({{"path": "{GSM8K}", "split": "test"}}, {{"path": "{NEMOTRON}", "split": "train"}}):
            try:
                datasets.load_dataset(streaming=True, **kwargs)
            except ValueError as e:
                print(str(e).splitlines()[0])
        """, subprocess_env(hub_server, tmp_path / "hf"))
    lines = out.splitlines()
    assert lines[0] == "['main', 'socratic']"
    assert "'chat'" in lines[1] and "'multilingual_fr'" in lines[1] and "'train'" not in lines[1]
    assert lines[2] == "12 user"
    assert lines[3] == "Config name is missing."
    assert lines[4].startswith("Bad split: train. Available splits: [")


def test_model_snapshot_and_moving_branch(hub_server, hub_model, tmp_path):
    """The tiny model downloads whole at its commit; a commit on a copied repository moves main while the old sha
    still resolves to the old files."""
    old = hub_server.copy("google-research-datasets/mbpp", "flashdraft-test/mbpp-moving")
    new = hub_server.commit("flashdraft-test/mbpp-moving", {"NOTE.md": "moved"})
    assert new != old
    out = _python(f"""
        from pathlib import Path
        from huggingface_hub import HfApi, snapshot_download
        path = Path(snapshot_download("{TINY_MODEL}", revision="{hub_model.sha}"))
        print(sorted(p.name for p in path.iterdir()))
        api = HfApi()
        print(api.model_info("{TINY_MODEL}", revision="main").sha)
        print(api.dataset_info("flashdraft-test/mbpp-moving", revision="main").sha)
        old = [s.rfilename for s in api.dataset_info("flashdraft-test/mbpp-moving", revision="{old}").siblings]
        print("NOTE.md" in old)
        """, subprocess_env(hub_server, tmp_path / "hf"))
    files, model_sha, head, old_has_note = out.splitlines()
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(eval(files))
    assert model_sha == hub_model.sha
    assert head == new and old_has_note == "False"
