"""How many tokens to draft per cycle on this device: the verify cost of every k, measured, and the expected
speedup of every k from the acceptance per position.

A cycle with k drafts costs one drafter proposal of a (k + 1)-slot block plus one target forward over k + 1
tokens, and yields 1 + sum_{i<=k} P(first i drafts accepted) tokens (the bonus plus the accepted prefix). The
target alone yields one token per one-token step. So the expected speedup of k is

    expected_tokens(k) * step_ms / (draft_ms(k) + verify_ms(k))

On a GPU the verify forward is bandwidth-bound and nearly flat in k, so long drafts win; on a CPU it grows with k
and a short draft can beat the full block (issue 46). Only measured costs go in: the device decides.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flashdraft.target.capture import capture_layers

from .spec import Proposer, new_target_cache, reads_layers
from .target_cache import VerifyCache


@dataclass(frozen=True)
class CycleCosts:
    """Median wall times on this device, after a prefill of one prompt: `step_ms` the target's plain one-token
    cached step (the decode speculative decoding is judged against); `verify_ms[k - 1]` its forward over k + 1
    tokens with the drafter's layers captured; `draft_ms[k - 1]` the drafter proposing k tokens."""

    step_ms: float
    verify_ms: list[float]
    draft_ms: list[float]
    spread: float = 0.0  # relative noise of an expected speedup: the step's and the worst cycle's MAD / median

    @property
    def max_drafts(self) -> int:
        return len(self.verify_ms)


@dataclass(frozen=True)
class DraftLengthPoint:
    """One k of the curve: its measured costs and, where the acceptance reaches it, the expected speedup."""

    num_drafts: int
    verify_ms: float
    draft_ms: float
    expected_tokens: float | None
    expected_speedup: float | None


def expected_tokens(acceptance: Sequence[float], num_drafts: int) -> float:
    """Tokens per cycle with k drafts: the bonus plus P(first i accepted) for i = 1..k (`acceptance[i - 1]` is
    the fraction of cycles that accepted at least i drafts: evaluate.summarize's acceptance_per_position)."""
    return 1.0 + float(sum(acceptance[:num_drafts]))


def draft_length_curve(costs: CycleCosts, acceptance: Sequence[float]) -> list[DraftLengthPoint]:
    """Every k = 1 .. B-1 with its costs; the expected figures only where `acceptance` covers k (a run at a fixed
    k measured nothing beyond it)."""
    points = []
    for k in range(1, costs.max_drafts + 1):
        verify, draft = costs.verify_ms[k - 1], costs.draft_ms[k - 1]
        tokens = expected_tokens(acceptance, k) if k <= len(acceptance) else None
        speedup = None if tokens is None else tokens * costs.step_ms / (draft + verify)
        points.append(DraftLengthPoint(k, round(verify, 3), round(draft, 3),
                                       None if tokens is None else round(tokens, 4),
                                       None if speedup is None else round(speedup, 4)))
    return points


def best_num_drafts(points: Sequence[DraftLengthPoint], spread: float = 0.0) -> int:
    """The shortest k whose expected speedup is within the measurement's `spread` (relative) of the highest: a
    longer k is chosen only when it wins by more than the timing noise, so two runs on one machine pick the same
    k (issue 59: k=4 in one run, k=7 in the next, from noise). Raises ValueError when no point has an expected
    speedup."""
    known = [p for p in points if p.expected_speedup is not None]
    if not known:
        raise ValueError("no draft length has an expected speedup: the acceptance per position is empty")
    best = max(p.expected_speedup for p in known)
    return min(p.num_drafts for p in known if p.expected_speedup * (1 + spread) >= best)


def relative_spread(samples: Sequence[float]) -> float:
    """Median absolute deviation over the median: how far one timing strays, robust to one outlier rep."""
    mid = statistics.median(samples)
    return statistics.median(abs(x - mid) for x in samples) / mid if mid > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    _sync(device)
    start = clock()
    fn()
    _sync(device)
    return (clock() - start) * 1000


def _prefill(model, ids: torch.Tensor) -> VerifyCache:
    cache = new_target_cache(model)
    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return VerifyCache(model, cache)


def _time_forward(cache: VerifyCache, tokens: torch.Tensor, clock: Callable[[], float], **kwargs) -> float:
    """One cached target forward over `tokens` [1, T], timed; the cache is then back where it was."""
    cache.checkpoint()
    ms = _timed(lambda: cache.model(input_ids=tokens, cache=cache.cache, use_cache=True, **kwargs), tokens.device,
                clock)
    cache.discard(tokens.shape[1])
    return ms


@torch.inference_mode()
def measure_cycle_costs(model, drafter: Proposer, prompt_ids: Sequence[int], layer_ids: Sequence[int],
                        block_size: int, reps: int = 5, statistic: Callable = statistics.median,
                        clock: Callable[[], float] = time.perf_counter) -> CycleCosts:
    """Time the target's plain step (no capture hooks, one logit row: as target_generate), its verify forward over
    k + 1 tokens (hooks on, every row's logits: as speculative_generate) and the drafter's proposal of k, for
    k = 1 .. block_size-1; `statistic` (median) of `reps` after one untimed warm-up rep. Interleaved rep by rep,
    so load on a shared host hits every k alike; every forward starts from the same prompt-long cache. `clock`:
    wall time (what decoding costs), or `time.process_time` (CPU seconds of every thread: on a host shared with
    other work, closer to what the forward would cost alone, for benchmarks)."""
    device = next(model.parameters()).device
    layer_ids = reads_layers(drafter, layer_ids)
    ids = torch.tensor([list(prompt_ids)], device=device)
    last = torch.tensor([[int(prompt_ids[-1])]], device=device)
    plain = _prefill(model, ids)
    with capture_layers(model, layer_ids) as cap:
        verifying = _prefill(model, ids)
        session = drafter.new_session()
        session.extend(cap.features()[0], ids[0])
    step: list[float] = []
    verify: list[list[float]] = [[] for _ in range(block_size - 1)]
    draft: list[list[float]] = [[] for _ in range(block_size - 1)]
    for rep in range(reps + 1):
        ms_step = _time_forward(plain, last, clock, logits_to_keep=1)
        with capture_layers(model, layer_ids) as cap:
            for k in range(1, block_size):
                ms_verify = _time_forward(verifying, last.expand(1, k + 1), clock)
                cap.clear()
                ms_draft = _timed(lambda: session.propose(int(last), k), device, clock)  # noqa: B023
                if rep:
                    verify[k - 1].append(ms_verify)
                    draft[k - 1].append(ms_draft)
        if rep:
            step.append(ms_step)
    cycles = [[a + b for a, b in zip(v, d, strict=True)] for v, d in zip(verify, draft, strict=True)]
    spread = relative_spread(step) + max(relative_spread(c) for c in cycles)
    return CycleCosts(statistic(step), [statistic(v) for v in verify], [statistic(d) for d in draft],
                      round(spread, 4))


def device_name(device: torch.device | str) -> str:
    """What the costs were measured on, for the report and the model card: the GPU's name, or the CPU's model
    and whether it has AVX-512 (the CPU verify cost differs most between AVX2 and AVX-512 machines)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        info = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return f"CPU ({torch.get_num_threads()} threads)"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "CPU")
    simd = "AVX-512" if "avx512f" in info else "AVX2" if "avx2" in info else "no AVX2"
    return f"{model} ({simd}, {torch.get_num_threads()} threads)"


def roofline_costs(step_bytes: float, step_flops: float, draft_bytes: float, draft_flops: float,
                   bandwidth_gbs: float, peak_tflops: float, max_drafts: int) -> CycleCosts:
    """Modelled (not measured) cycle costs of one sequence on a GPU: a forward over w tokens takes the longer of
    reading its weights (`*_bytes`) at the memory bandwidth and w x its FLOPs a token at the peak rate, for the
    target (w = k + 1) and the drafter (w = k + 1 slots). At a batch of one both are bandwidth-bound far past any
    block, so the model says every drafted position is nearly free there; kernel launches and attention, which it
    leaves out, are why serving recipes find shorter drafts faster on some GPUs (issue 46)."""
    def ms(nbytes: float, flops: float, width: int) -> float:
        return 1000 * max(nbytes / (bandwidth_gbs * 1e9), width * flops / (peak_tflops * 1e12))

    ks = range(1, max_drafts + 1)
    return CycleCosts(ms(step_bytes, step_flops, 1), [ms(step_bytes, step_flops, k + 1) for k in ks],
                      [ms(draft_bytes, draft_flops, k + 1) for k in ks])
