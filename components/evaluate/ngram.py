"""Prompt lookup (vLLM's `{"method": "ngram"}`): drafts copied from the prompt and output so far, no training.

The proposer matches the last n tokens of the sequence (prompt + verified output + the newest token), n from
`prompt_lookup_max` down to `prompt_lookup_min`, against every earlier position; the longest n that matches
wins, and of its matches the earliest, as vLLM's proposer picks; the drafts are the (up to) k tokens that
followed it. No match: no drafts, and the cycle is a plain target step. It decodes through the same speculative
decoder as the trained drafter (spec.py), so its tau, tokens/s and lossless check compare directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The (up to) k tokens after the earliest earlier occurrence of the longest suffix of `tokens` whose length
    is in [min_n, max_n]; [] when none occurs."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n):
            if tokens[start: start + n] == suffix:
                return tokens[start + n: start + n + k]
    return []


@dataclass
class NgramSession:
    """One sequence: the token ids verified so far (the features are not read)."""

    proposer: NgramProposer
    tokens: list[int] = field(default_factory=list)

    def extend(self, features: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        if tokens is None:
            raise ValueError("prompt lookup needs the verified token ids: the decoder passed none")
        self.tokens.extend(int(t) for t in tokens.reshape(-1).tolist())

    def propose(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor:
        k = self.proposer.max_drafts if num_drafts is None else num_drafts
        p = self.proposer
        return torch.tensor(lookup([*self.tokens, int(last_token)], p.prompt_lookup_min, p.prompt_lookup_max, k),
                            dtype=torch.long)


@dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup with vLLM's parameters (eval.prompt_lookup: vLLM's defaults); `max_drafts` is the longest k
    evaluate tries (the drafter's B-1)."""

    max_drafts: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    def new_session(self) -> NgramSession:
        return NgramSession(self)

    def speculative_config(self, num_drafts: int) -> dict:
        """What vLLM serves this baseline with at k = `num_drafts`."""
        return {"method": "ngram", "num_speculative_tokens": num_drafts,
                "prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
