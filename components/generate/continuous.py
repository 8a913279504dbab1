"""Continuous batching for the `hf` backend: every decode step runs the rows still generating, nothing else.

Why: transformers `generate` over static batches keeps every row of a batch in every step until its longest reply
ends (finished rows and left padding keep costing GEMM rows), and its growing cache is re-concatenated each step.
On a CPU the decode step is GEMM-bound, so the rows it spends on finished replies are the waste. Here:

* waiting prompts are prefilled together, packed end to end in one row (no padding; each attends to itself only,
  positions from 0; up to `pack_tokens` tokens, so the GEMMs get many rows), and each one's keys and values are
  copied into a free slot of a preallocated cache (`SlotCache`);
* a decode step runs every occupied slot at once, each row at its own position, masked to its own columns;
* a row that emits a stop token or reaches `max_new_tokens` leaves at once (the last slot moves into its place)
  and waiting prompts are prefilled into the freed slots.

All rows share one write column, so a step writes one new column for every row; a row's columns are the last
(prompt + generated) before it. The window [start, end) spans the oldest live row; when the buffer runs out of
columns the live window moves back to column 0 (one copy every few dozen steps).

Works for decoders whose every layer keeps a plain key/value cache (`supports_slots`); a hybrid (linear attention)
or sliding-window target uses transformers `generate` over static batches instead (backends.py).

Numerics: a packed prefill and a decode step run their GEMMs over many rows at once, and a batched fp32 GEMM may
round differently from a one-row one, so a near-tie argmax could flip against decoding each prompt alone (greedy
tokens were identical on every prompt tested: tests/unit/test_generate_continuous.py, and 128/128 demo prompts
against static `generate` batches in benchmarks/bench_generate.py).
Sampling draws each row from its own `torch.Generator` seeded with the prompt's seed, so a sampled reply depends
on its prompt and seed only, not on which prompts shared its steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def supports_slots(model) -> bool:
    """Whether every decoder layer of `model` keeps a plain (full attention) key/value cache."""
    text = model.config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None)
    if types:
        return all(t == "full_attention" for t in types)
    return getattr(text, "sliding_window", None) is None or not getattr(text, "use_sliding_window", True)


@dataclass
class Window:
    """The columns a decode step reads, shared by every layer: rows `[0, rows)` are live, `first[r]` is row r's
    first column, a step writes column `end`."""

    slots: int
    end: int
    rows: int = 0
    first: list[int] = field(default_factory=list)

    @property
    def start(self) -> int:
        return min(self.first[:self.rows]) if self.rows else self.end


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values for every slot in one preallocated [slots, heads, columns, dim] buffer; a decode
    step writes its column in place (no concatenation) and attends over views of the live window."""

    is_sliding = False

    def __init__(self, window: Window, slots: int, columns: int):
        super().__init__()
        self.window, self.slots, self.columns = window, slots, columns

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        shape = (self.slots, key_states.shape[1], self.columns)
        self.keys = key_states.new_zeros((*shape, key_states.shape[-1]))
        self.values = value_states.new_zeros((*shape, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.window
        n = key_states.shape[-2]
        self.keys[:w.rows, :, w.end:w.end + n] = key_states
        self.values[:w.rows, :, w.end:w.end + n] = value_states
        return self.keys[:w.rows, :, w.start:w.end + n], self.values[:w.rows, :, w.start:w.end + n]

    def place(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put a prefilled prompt's [heads, n, dim] keys and values in `slot`, ending just before column `end`."""
        if not self.is_initialized:
            self.lazy_initialization(keys[None], values[None])
        end, n = self.window.end, keys.shape[-2]
        self.keys[slot, :, end - n:end] = keys
        self.values[slot, :, end - n:end] = values

    def move(self, src: int, dst: int, start: int, end: int) -> None:
        self.keys[dst, :, start:end] = self.keys[src, :, start:end]
        self.values[dst, :, start:end] = self.values[src, :, start:end]

    def shift(self, rows: int, start: int, end: int, base: int) -> None:
        """Move the live columns [start, end) of the first `rows` slots to [base, base + end - start)."""
        live = end - start
        self.keys[:rows, :, base:base + live] = self.keys[:rows, :, start:end].clone()
        self.values[:rows, :, base:base + live] = self.values[:rows, :, start:end].clone()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.window.end - self.window.start + query_length, 0

    def get_seq_length(self) -> int:
        return self.window.end - self.window.start

    def get_max_length(self) -> int:
        return self.columns


class SlotCache(Cache):
    """A `Cache` of `SlotLayer`s sharing one `Window`. `floor`: the longest prompt it will take, so the write
    column never drops below it (a prompt is placed in the columns just before `end`)."""

    def __init__(self, num_layers: int, slots: int, floor: int, max_new_tokens: int, margin: int = 64):
        self.window = Window(slots, end=floor, first=[0] * slots)
        self.floor = floor
        # a live row spans at most floor + max_new_tokens columns; `margin` more are steps between two shifts
        self.columns = floor + max_new_tokens + margin
        super().__init__(layers=[SlotLayer(self.window, slots, self.columns) for _ in range(num_layers)])

    def reserve(self, needed: int) -> None:
        """Make room for `needed` more columns after `end`, moving the live window back to the buffer's start."""
        w = self.window
        if w.end + needed <= self.columns:
            return
        start, live = w.start, w.end - w.start
        base = max(0, self.floor - live)
        for layer in self.layers:
            if layer.is_initialized:
                layer.shift(w.rows, start, w.end, base)
        w.first = [f - start + base for f in w.first]
        w.end = base + live

    def mask(self, device) -> torch.Tensor:
        """[rows, 1, 1, columns read + 1] bool: each row attends to its own columns and the one being written."""
        w = self.window
        cols = torch.arange(w.start, w.end + 1, device=device)
        first = torch.tensor(w.first[:w.rows], device=device)
        return (cols[None, :] >= first[:, None])[:, None, None, :]


@dataclass
class Row:
    """One prompt being answered: its index in the call, the ids generated so far, its position and sampler."""

    index: int
    prompt_len: int
    ids: list[int]
    generator: torch.Generator | None = None

    @property
    def position(self) -> int:
        """Position of the newest token (the next step's input)."""
        return self.prompt_len + len(self.ids) - 1


@dataclass
class DecodeResult:
    """Generated ids per prompt (in prompt order) and the decode steps it took."""

    ids: list[list[int]]
    steps: int


class ContinuousDecoder:
    """Answers a list of prompts with at most `slots` rows decoding at once (see the module docstring)."""

    def __init__(self, model, slots: int, max_new_tokens: int, stop_ids: list[int], warpers=None, margin: int = 64,
                 pack_tokens: int = 256):
        self.model, self.slots, self.max_new, self.margin = model, slots, max_new_tokens, margin
        self.pack_tokens = pack_tokens
        self.stop_ids = set(stop_ids)
        self.warpers = warpers  # a transformers LogitsProcessorList when sampling, None for greedy
        self.num_layers = model.config.get_text_config(decoder=True).num_hidden_layers

    def _pick(self, logits: torch.Tensor, rows: list[Row]) -> list[int]:
        """Next token of each row: argmax, or a draw from the warped distribution with the row's own generator."""
        if self.warpers is None:
            return logits.argmax(-1).tolist()
        probs = torch.softmax(self.warpers(None, logits.float()), dim=-1)
        return [int(torch.multinomial(probs[n], 1, generator=row.generator)) for n, row in enumerate(rows)]

    def _done(self, row: Row) -> bool:
        return row.ids[-1] in self.stop_ids or len(row.ids) >= self.max_new

    def _admit(self, cache: SlotCache, rows: list[Row], batch: list[tuple[int, list[int], int]]) -> list[Row]:
        """Prefill the (index, prompt, seed) `batch` in one forward, packed end to end (each prompt attends to
        itself only, positions from 0), take each one's first token and put every row that goes on in a free slot.
        Returns the new rows (finished ones included)."""
        device = self.model.device
        lens = [len(p) for _, p, _ in batch]
        ends = torch.tensor(lens, device=device).cumsum(0)
        seg = torch.repeat_interleave(torch.arange(len(batch), device=device), torch.tensor(lens, device=device))
        pos = torch.cat([torch.arange(n, device=device) for n in lens])
        causal = pos[:, None] >= pos[None, :]
        mask = (seg[:, None] == seg[None, :]) & causal
        ids = torch.tensor([t for _, p, _ in batch for t in p], device=device)
        out = self.model(input_ids=ids[None], position_ids=pos[None], attention_mask=mask[None, None],
                         use_cache=True, logits_to_keep=ends - 1)
        new = [Row(i, n, [], torch.Generator(device=device).manual_seed(seed) if self.warpers else None)
               for (i, _, seed), n in zip(batch, lens, strict=True)]
        w = cache.window
        for row, token, end in zip(new, self._pick(out.logits[0], new), ends.tolist(), strict=True):
            row.ids.append(token)
            if self._done(row):
                continue
            for layer, prefilled in zip(cache.layers, out.cache.layers, strict=True):
                layer.place(w.rows, prefilled.keys[0, :, end - row.prompt_len:end],
                            prefilled.values[0, :, end - row.prompt_len:end])
            w.first[w.rows] = w.end - row.prompt_len
            w.rows += 1
            rows.append(row)
        return new

    def _step(self, cache: SlotCache, rows: list[Row]) -> list[Row]:
        """One decode step over every live row; returns the rows it finished (already out of their slots)."""
        w = cache.window
        device = self.model.device
        ids = torch.tensor([[r.ids[-1]] for r in rows], device=device)
        pos = torch.tensor([[r.position] for r in rows], device=device)
        logits = self.model(input_ids=ids, position_ids=pos, attention_mask=cache.mask(device), cache=cache,
                            use_cache=True, logits_to_keep=1).logits[:, -1]
        w.end += 1
        for row, token in zip(rows, self._pick(logits, rows), strict=True):
            row.ids.append(token)
        finished = []
        for slot in reversed(range(len(rows))):
            if self._done(rows[slot]):
                finished.append(rows[slot])
                self._vacate(cache, rows, slot)
        return finished

    @staticmethod
    def _vacate(cache: SlotCache, rows: list[Row], slot: int) -> None:
        """Free `slot`: the last live row moves into it."""
        w = cache.window
        last = w.rows - 1
        if slot != last:
            for layer in cache.layers:
                layer.move(last, slot, w.first[last], w.end)
            w.first[slot] = w.first[last]
            rows[slot] = rows[last]
        rows.pop()
        w.rows -= 1

    def _next_pack(self, waiting: list[int], prompts: list[list[int]], seeds: list[int], free: int
                   ) -> list[tuple[int, list[int], int]]:
        """The next waiting prompts for one packed prefill: at most `free`, up to `pack_tokens` tokens (at least
        one prompt). Why a budget: the packed forward's GEMMs run faster on more rows, but its attention covers
        every pair of the pack (masked or not)."""
        batch, tokens = [], 0
        while waiting and len(batch) < free and (not batch or tokens + len(prompts[waiting[-1]]) <= self.pack_tokens):
            i = waiting.pop()
            batch.append((i, prompts[i], seeds[i]))
            tokens += len(prompts[i])
        return batch

    def run(self, prompts: list[list[int]], seeds: list[int]) -> DecodeResult:
        if not prompts:
            return DecodeResult([], 0)
        longest = max(len(p) for p in prompts)
        cache = SlotCache(self.num_layers, min(self.slots, len(prompts)), longest, self.max_new, self.margin)
        out: list[list[int] | None] = [None] * len(prompts)
        waiting = list(reversed(range(len(prompts))))
        rows: list[Row] = []
        steps = 0
        with torch.inference_mode():
            while waiting or rows:
                while waiting and len(rows) < cache.window.slots:
                    batch = self._next_pack(waiting, prompts, seeds, cache.window.slots - len(rows))
                    for row in self._admit(cache, rows, batch):
                        if self._done(row):
                            out[row.index] = row.ids
                cache.reserve(1)
                if rows:
                    for row in self._step(cache, rows):
                        out[row.index] = row.ids
                    steps += 1
        return DecodeResult(out, steps)  # type: ignore[arg-type]
