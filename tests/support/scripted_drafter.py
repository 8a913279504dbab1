"""A drafter that proposes the target's own continuation, known in advance (the speculative-decoding tests)."""

from __future__ import annotations

import torch


class ScriptedDrafter:
    """Proposes the target's own continuation (known in advance), optionally corrupted from draft slot
    `wrong_from` on, so exactly that many drafts match in every full cycle. It records (context length, last
    token) per call so a test can check that the context covers exactly the verified tokens but the newest."""

    def __init__(self, reference: list[int], prompt_len: int, block: int, wrong_from: int | None = None):
        self.reference, self.prompt_len, self.block, self.wrong_from = reference, prompt_len, block, wrong_from
        self.feature_width: int | None = None
        self.calls: list[tuple[int, int]] = []
        self.context_len = 0

    def new_session(self) -> ScriptedDrafter:
        self.context_len = 0
        return self

    def extend(self, features: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
        self.context_len += features.shape[0]
        self.feature_width = features.shape[1]

    def propose(self, last_token: int, num_drafts: int | None = None) -> torch.Tensor:
        done = self.context_len - self.prompt_len + 1      # tokens generated so far
        self.calls.append((self.context_len, last_token))
        n = self.block - 1 if num_drafts is None else num_drafts
        out = list(self.reference[done: done + n])
        out += [0] * (n - len(out))
        if self.wrong_from is not None and self.wrong_from < n:
            out[self.wrong_from] = (out[self.wrong_from] + 1) % 1000
        return torch.tensor(out)
