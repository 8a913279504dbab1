"""Feature shards of a learnable rule on the tiny target, committed as extraction lays them out: the training
tests' input (tests/integration/test_train.py, test_train_heldout.py)."""

from __future__ import annotations

import torch

from flashdraft.features.manifest import codec_from_config, make_provenance, part_stats
from flashdraft.features.shard import Sample, build_shard, encode_sample
from flashdraft.storage import layout
from flashdraft.storage.store import open_store
from flashdraft.target.capture import capture_layers
from flashdraft.target.model import load_causal_lm, load_hf_config, load_tokenizer, tokenizer_fingerprint

PROMPT, RESPONSE = 8, 40


def rule_sequences(n: int, seed: int, vocab: int = 48, offset: int = 1000) -> list[tuple[str, list[int], list[int]]]:
    """Prompt of random tokens, then a response where next = perm[current] over a small token subset: a rule the
    drafter can learn, with chance-level accuracy ~1/vocab."""
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(vocab, generator=g)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        toks = torch.randint(0, vocab, (PROMPT,), generator=g).tolist()
        cur = int(torch.randint(0, vocab, (1,), generator=g))
        for _ in range(RESPONSE):
            toks.append(cur)
            cur = int(perm[cur])
        ids = [t + offset for t in toks]
        out.append((f"s{seed}-{i:04d}", ids, [0] * PROMPT + [1] * RESPONSE))
    return out


def target_features(cfg, seqs) -> list[torch.Tensor]:
    """[T, n, H] features per sequence from the tiny target (equal lengths, one batched forward)."""
    hf = load_hf_config(cfg.target)
    ids = cfg.layer_ids(hf.num_hidden_layers)
    model = load_causal_lm(cfg.target, num_layers=max(ids) + 1)
    x = torch.tensor([s[1] for s in seqs])
    with torch.no_grad(), capture_layers(model, ids, stop_after_deepest=True) as cap:
        cap.forward(input_ids=x)
        feats = cap.features()
    return [f.view(f.shape[0], len(ids), -1) for f in feats]


def write_shards(cfg, seqs, parts: int = 2) -> None:
    """Commit `seqs` as feature shards exactly as extraction lays them out (the reader's input)."""
    hf = load_hf_config(cfg.target)
    ids = cfg.layer_ids(hf.num_hidden_layers)
    prov = make_provenance(cfg, tokenizer_fingerprint(load_tokenizer(cfg.target)), hf.hidden_size, ids)
    codec = codec_from_config(cfg)
    feats = target_features(cfg, seqs)
    store = open_store(cfg.storage, cfg.run_id)
    per = -(-len(seqs) // parts)
    recorded = []
    for p in range(parts):
        rows = [(sid, len(t), encode_sample(codec, t, m, f))
                for (sid, t, m), f in zip(seqs[p * per:(p + 1) * per], feats[p * per:(p + 1) * per], strict=True)]
        data = build_shard(codec, ids, hf.hidden_size, prov, rows)
        record = store.commit(layout.feature_part_key(0, p), data, {"samples": len(rows),
                                                                    "tokens": sum(r[1] for r in rows),
                                                                    "provenance": prov})
        recorded.append({"key": layout.feature_part_key(0, p), **part_stats(record)})
    for shard in range(cfg.data.num_shards):  # the DONE records, as extraction commits them (all parts in shard 0)
        store.commit_json(layout.features_done_key(shard), {"shard": shard, "parts": recorded if shard == 0 else []})


def as_samples(cfg, seqs) -> list[Sample]:
    return [Sample(sid, torch.tensor(t), torch.tensor(m, dtype=torch.bool), f.reshape(f.shape[0], -1).bfloat16())
            for (sid, t, m), f in zip(seqs, target_features(cfg, seqs), strict=True)]


def train_cfg(tiny_cfg, **over):
    # block 4 and 4 anchors per sample keep the [slots x 49152] CE small; the random tiny LM head needs a high lr
    base = {"training.tokens_per_step": 768, "training.epochs": 1, "training.lr": 2e-2,
            "training.checkpoint_every": 3, "drafter.max_anchors": 4, "drafter.block_size": 4}
    return tiny_cfg.with_overrides({**base, **over})
