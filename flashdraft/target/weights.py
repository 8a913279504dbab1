"""The target's tensors the drafter reads straight from the target's safetensors, never loading the whole target:
the frozen embedding and LM head (memory-mapped), and the decoder layers and final norm that `drafter.init=target`
starts from. Hub ids download only the index and the shards holding those tensors.

Below flashdraft/target/model.py (which resolves a target to its folder or Hub id and calls these through
`target_embeddings` / `target_init`): this module reads files and imports nothing of flashdraft's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from safetensors import safe_open


def _is_embedding(name: str) -> bool:
    return name.endswith(("embed_tokens.weight", "lm_head.weight"))


def _checkpoint_file(model_dir, revision: str | None, name: str) -> Path | None:
    """One file of a checkpoint: a local folder's, or downloaded from the Hub (None: the checkpoint has none)."""
    local = Path(str(model_dir))
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    try:
        return Path(hf_hub_download(str(model_dir), name, revision=revision))
    except EntryNotFoundError:
        return None


def _weight_map(model_dir, revision: str | None) -> tuple[dict[str, str], Path | None]:
    """(tensor name -> the file holding it, the single model.safetensors or None), from the index alone where the
    checkpoint is sharded (no shard fetched)."""
    index = _checkpoint_file(model_dir, revision, "model.safetensors.index.json")
    if index is not None:
        return json.loads(index.read_text())["weight_map"], None
    single = _checkpoint_file(model_dir, revision, "model.safetensors")
    if single is None:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    with safe_open(str(single), "pt") as f:
        return {k: "model.safetensors" for k in f.keys()}, single


def _weight_files(model_dir, revision: str | None, wanted=_is_embedding) -> dict[str, Path]:
    """Map tensor name -> local safetensors file for the names `wanted` accepts, downloading only the index and
    the shards they live in (hf ids)."""
    weight_map, single = _weight_map(model_dir, revision)
    if single is not None:
        return {k: single for k in weight_map if wanted(k)}
    return {k: _checkpoint_file(model_dir, revision, v) for k, v in weight_map.items() if wanted(k)}


def tensor_names(model_dir, revision: str | None) -> list[str]:
    """Every tensor name of a checkpoint, read from its index (no shard fetched) or its single file's header."""
    return list(_weight_map(model_dir, revision)[0])


def _pick(names: list[str], suffix: str) -> str | None:
    found = sorted((n for n in names if n.endswith(suffix)), key=lambda n: ("mtp" in n or "draft" in n, len(n)))
    return found[0] if found else None


SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def mmap_tensor(path: Path, name: str) -> torch.Tensor:
    """Tensor `name` of a safetensors file as a copy-on-write view of the file's pages, in the file's dtype.

    Why: the frozen embedding and LM head are the largest tensors of a drafter process; mapped, every process on
    the node shares one copy in the page cache, and nothing is read until a row is used."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    if name not in header:
        raise KeyError(f"{path}: no tensor {name!r}")
    info = header[name]
    if info["dtype"] not in SAFETENSORS_DTYPES:
        raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; frozen target tensors must be one of "
                         f"{', '.join(SAFETENSORS_DTYPES)}")
    start, end = info["data_offsets"]
    raw = torch.from_file(str(path), shared=False, size=8 + n + end, dtype=torch.uint8)
    return raw[8 + n + start:8 + n + end].view(SAFETENSORS_DTYPES[info["dtype"]]).view(info["shape"])


def load_target_embeddings(model_dir: Path | str, revision: str | None, model: str
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed [V, H], lm_head [V, H]) from the target checkpoint in `model_dir` (a folder or Hub id; `model` names
    it in errors), memory-mapped in the checkpoint's dtype (`mmap_tensor`); tied heads share the embedding."""
    files = _weight_files(model_dir, revision)
    embed_name, head_name = _pick(list(files), "embed_tokens.weight"), _pick(list(files), "lm_head.weight")
    if embed_name is None:
        raise KeyError(f"target {model}: no '*embed_tokens.weight' tensor in its safetensors")

    embed = mmap_tensor(files[embed_name], embed_name)
    head = mmap_tensor(files[head_name], head_name) if head_name is not None else embed
    return embed, head


def target_layer_prefixes(names: list[str]) -> dict[int, str]:
    """Decoder layer index -> tensor-name prefix ("model.layers.7.") in the target checkpoint (text model only)."""
    out: dict[int, str] = {}
    for n in names:
        m = re.match(r"^(.*?\blayers\.(\d+)\.)", n)
        if m and "mtp" not in n and "vision" not in n and "visual" not in n:
            out.setdefault(int(m.group(2)), m.group(1))
    return out


def load_target_init(model_dir: Path | str, revision: str | None, model: str, layer_ids: list[int]
                     ) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor | None]:
    """Per requested target decoder layer, its tensors by drafter-layer name (`self_attn.q_proj.weight`, ...), and
    the target's final norm weight: the `drafter.init=target` starting point."""

    def wanted(name: str) -> bool:
        return ".layers." in name or name.endswith("norm.weight")

    files = _weight_files(model_dir, revision, wanted)
    prefixes = target_layer_prefixes(list(files))
    missing = [i for i in layer_ids if i not in prefixes]
    if missing:
        raise KeyError(f"target {model}: no decoder layer(s) {missing} (drafter.init_layers)")

    def read(name: str) -> torch.Tensor:
        with safe_open(str(files[name]), "pt") as f:
            return f.get_tensor(name)

    layers = [{n[len(prefixes[i]):]: read(n) for n in files if n.startswith(prefixes[i])} for i in layer_ids]
    norm_name = _pick([n for n in files if ".layers." not in n and n.endswith(".norm.weight")], "norm.weight")
    return layers, (read(norm_name) if norm_name else None)



def read_tensors(model_dir, revision: str | None, wanted) -> dict[str, torch.Tensor]:
    """The tensors whose names `wanted` accepts, read from only the shards that hold them (a target's MTP head)."""
    return {name: mmap_tensor(path, name) for name, path in _weight_files(model_dir, revision, wanted).items()}
