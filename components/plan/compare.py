"""`flashdraft plan --compare`: the decision this project exists for, in money and days. Every topology for this
target and dataset (the inference pool on each known GPU type or colocated on the trainer's GPUs, x BF16 or FP8
target weights, x offline or streaming, x the selected, the smallest lossless and the q4 codec), each with its
GPU-hours and cost per pool, storage and its cost, the bandwidth it needs, wall-clock days, whether each pool's
memory fits and whether each rate was measured; sorted by total cost, the configured row and the cheapest row that
meets `plan.deadline_days` marked. The plan gate stops on `plan.max_cost_usd` and `plan.deadline_days` from here.

Accounting (docs/planning.md, "Cost and days"): every row trains the same tokens (samples x tokens x
training.epochs; a streaming row trains each part that many times before deleting it). The inference pool has
`plan.inference_gpus` GPUs, the trainer `training.world_size`. Offline: generate, extract, train in sequence, each
pool billed for its busy GPU-hours. Streaming: generate, then extract and train concurrently, both pools billed
for the concurrent phase (the faster side waits for the slower). Colocated (offline only: the trainer holds every
GPU while it trains): every stage in sequence on the trainer's GPUs. Storage is billed at its at-rest (offline) or
window (streaming) size for the whole run; transfer charges the features once when the pools are apart.

Variants (`plan.train_variants` N, a sweep's trainings of the same features): an offline row generates and
extracts once and trains N times, holding its features for the whole sweep; a streaming row keeps nothing, so it
extracts (the target's prefill) and transfers N times beside its N trainings (generation, whose responses are
kept, once). The variants share the configured trainer GPUs one after another. `balance` prices the cheapest
offline and streaming rows at several N, and the N from which offline is the cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from flashdraft.components.plan.gpus import GPUS, GpuSpec, gpu_spec
from flashdraft.components.plan.memory import WEIGHT_BYTES, fmt_gib, inference_memory
from flashdraft.components.plan.rates import FP8_NOTE, STAGES, Rates, TargetCost, stage_rates
from flashdraft.components.plan.resources import VLLM_GPU_MEMORY_UTILIZATION, inference_shape
from flashdraft.components.plan.sections import CodecPlan, StageEstimate
from flashdraft.config import ConfigError, RunConfig
from flashdraft.perf.calibration import Calibration
from flashdraft.run import registry

COLOCATED = "colocated"
PRECISIONS = ("bf16", "fp8")
MODES = ("offline", "streaming")
RESPONSES = ("target", "dataset")
RESPONSES_TRADE = ("data.responses=dataset trains on the dataset's own replies: no generation GPU-hours, but the "
                   "drafter learns a distribution the target does not produce, so its tau on the target's outputs "
                   "may be lower (docs/training.md, \"Training on the dataset's replies\")")
UNPRICED = ("an inference pool without pools.inference.gpu_type, or colocated streaming, which cannot run: the "
            "trainer holds every GPU while it trains")
HOURS_PER_MONTH = 730  # the clouds' billing month (365 x 24 / 12)
FP8_CAVEAT = ("features must come from the precision that will be served: a drafter trained on FP8 features "
              "matches an FP8 target, not the BF16 one (and the reverse)")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolCost(_Frozen):
    """One pool of one topology: its GPUs, billed GPU-hours and cost, and whether its peak memory fits."""

    pool: str                 # inference, trainer
    stages: str
    gpu: str                  # planner GPU type (pools.*.gpu_type)
    gpus: int
    gpu_hours: float          # billed: busy hours, plus the waiting of a streaming pool
    usd_per_gpu_hour: float
    cost_usd: float
    peak_bytes_per_gpu: int
    usable_bytes_per_gpu: int
    fits: bool
    rate_sources: dict[str, str]


class Row(_Frozen):
    """One topology, priced."""

    key: str                  # inference/precision/mode/codec
    inference: str            # a GPU type, or "colocated" (the trainer's GPUs)
    precision: str
    mode: str
    codec: str
    lossless: bool
    pools: list[PoolCost]
    storage_bytes: int        # offline: at rest; streaming: the window's peak
    storage_cost_usd: float
    transfer_bytes: int
    transfer_cost_usd: float
    bandwidth_bytes_per_s: int  # what extraction writes to the store while it runs
    days: float
    total_cost_usd: float
    fits: bool
    rates: str                # generate/extract/train: M measured, C carried from a calibration, A assumed
    configured: bool = False
    cheapest_in_deadline: bool = False


class PrecisionOption(_Frozen):
    """The target's weights in one precision on the configured inference GPU: memory, KV room, assumed rates."""

    precision: str
    gpu: str
    weights_bytes_per_gpu: int
    kv_room_bytes_per_gpu: int   # vLLM's share of the GPU left for KV cache and recurrent state
    sequences: int               # full-length sequences (generation.max_model_len) that room holds
    generate_tokens_per_s: float
    extract_tokens_per_s: float
    rate_sources: dict[str, str]


class VariantBalance(_Frozen):
    """Offline against streaming when N variants train on the same features: the configured topology in both
    modes (its inference pool, weights and codec), else, colocated or unpriced, the cheapest fitting row of each."""

    variants: int
    offline: str | None           # the row's key
    offline_usd: float | None
    streaming: str | None
    streaming_usd: float | None


class ResponsesOption(_Frozen):
    """The configured topology with the training replies from one source (data.responses): the target's (generated)
    or the dataset's own (no generation)."""

    responses: str               # target | dataset
    tokens_to_generate: int
    inference_gpu_hours: float   # generate + extract, billed
    total_cost_usd: float
    days: float
    configured: bool


class Comparison(_Frozen):
    rows: list[Row]
    configured: str              # the configured topology's key (not among the rows when it cannot be priced)
    cheapest_in_deadline: str | None
    max_cost_usd: float | None
    deadline_days: float | None
    inference_gpus: int
    trainer_gpus: int
    train_tokens: int
    prices: dict[str, Any]
    precision: list[PrecisionOption] = []
    responses: list[ResponsesOption] = []
    caveat: str = FP8_CAVEAT
    train_variants: int = 1       # plan.train_variants: the rows price this many trainings
    balance: list[VariantBalance] = []
    offline_cheaper_from: int | None = None  # the smallest N (up to MAX_BALANCE_VARIANTS) where offline is cheaper

    def row(self, key: str | None) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class _Inference:
    """An inference option's rates and memory (independent of mode and codec)."""

    name: str
    gpu_type: str
    precision: str
    gpus: int
    price: float
    rates: Rates
    peak: int
    usable: int
    weights: int
    kv_room: int
    sequences: int


def rate_letter(source: str) -> str:
    """M measured on this GPU, C a calibration's measurement carried to it, A assumed (FP8 always)."""
    if FP8_NOTE in source:
        return "A"
    if source.startswith(("plan.measured", "measured on")):
        return "M"
    return "C" if "carried" in source else "A"


def codec_choices(cfg: RunConfig, codecs: dict[str, CodecPlan]) -> list[str]:
    """The selected codec, the smallest lossless one and q4 (each once)."""
    lossless = min((c for c, v in codecs.items() if v.lossless), key=lambda c: codecs[c].total_bytes)
    return list(dict.fromkeys([cfg.features.codec, lossless, "q4"]))


def gpu_price(cfg: RunConfig, pool: str, gpu_type: str) -> float:
    """US$ per GPU-hour of `gpu_type` in `pool`: the pool's own price when it is that pool's configured GPU type,
    else plan.prices.gpu_usd_per_hour."""
    pool_cfg = getattr(cfg.pools, pool)
    if pool_cfg.usd_per_gpu_hour is not None and pool_cfg.gpu_type == gpu_type:
        return pool_cfg.usd_per_gpu_hour
    return cfg.plan.prices.gpu_usd_per_hour[gpu_type]  # every GPU type has a default (a unit test checks)


def _inference(cfg: RunConfig, name: str, gpu_type: str, gpus: int, pool: str, precision: str,
               target: TargetCost, train_gpu: GpuSpec, train_flops: float, cal: Calibration | None) -> _Inference:
    gpu = gpu_spec(gpu_type, cfg.plan.gpu_overrides)
    inf_pool = registry.current().pool_name(cfg.pools, "generate")
    configured = (gpu_type == getattr(cfg.pools, inf_pool).gpu_type and precision == cfg.plan.target_precision
                  and (name == COLOCATED) == (inf_pool == registry.current().pool_name(cfg.pools, "train")))
    measured = {s: v for s, v in cfg.plan.measured_tokens_per_s.items() if configured or s == "train"}
    rates = stage_rates(cfg, target, gpu, train_gpu, train_flops, cal, precision, measured)
    shape = inference_shape(cfg, target.params, WEIGHT_BYTES[precision])
    est = inference_memory(shape)
    share = VLLM_GPU_MEMORY_UTILIZATION if est.phase.startswith("generation") else 1.0
    usable = int(gpu.usable_bytes * share)
    weights = est.parts[f"target weights ({precision})"]
    room = max(0, int(gpu.usable_bytes * VLLM_GPU_MEMORY_UTILIZATION) - weights - est.parts["vLLM forward workspace"])
    per_sequence = (shape.max_model_len * shape.kv_bytes_per_token + shape.state_bytes_per_sequence) \
        / shape.tensor_parallel
    return _Inference(name, gpu_type, precision, gpus, gpu_price(cfg, pool, gpu_type), rates, est.peak_bytes,
                      usable, weights, room, int(room // per_sequence) if per_sequence else 0)


@dataclass(frozen=True)
class StageHours:
    """GPU-hours of work a stage needs (tokens / rate a GPU)."""

    generate: float
    extract: float
    train: float


@dataclass(frozen=True)
class Schedule:
    """A topology's wall-clock and billed GPU-hours per pool."""

    hours: float              # wall clock
    inference_billed: float   # GPU-hours the inference side pays for
    train_billed: float
    extract_seconds: float    # how long extraction writes to the store


def schedule(h: StageHours, mode: str, inference_gpus: int | None, trainers: int, variants: int = 1) -> Schedule:
    """Offline: stages in sequence, busy hours billed. Streaming: generate, then extract beside train, both pools
    billed while the slower side runs. `inference_gpus` None: colocated, everything in sequence on the trainers.
    `variants` trainings of the same features (module docstring): offline trains them after one extraction,
    streaming extracts again for each."""
    n = variants
    if inference_gpus is None:
        return Schedule((h.generate + h.extract + n * h.train) / trainers, h.generate + h.extract, n * h.train,
                        h.extract / trainers * 3600)
    if mode == "offline":
        return Schedule((h.generate + h.extract) / inference_gpus + n * h.train / trainers, h.generate + h.extract,
                        n * h.train, h.extract / inference_gpus * 3600)
    concurrent = max(h.extract / inference_gpus, h.train / trainers)
    return Schedule(h.generate / inference_gpus + n * concurrent, h.generate + n * concurrent * inference_gpus,
                    n * concurrent * trainers, concurrent * 3600)


@dataclass(frozen=True)
class _Trainer:
    pool: str
    gpu_type: str
    gpus: int
    price: float
    memory: dict[str, Any]    # the plan's memory entry of the trainer pool


def _row(cfg: RunConfig, inf: _Inference, trainer: _Trainer, mode: str, codec: str, c: CodecPlan,
         sched: Schedule, variants: int = 1) -> Row:
    """One topology priced: pools, storage for the run's (the sweep's) duration, transfer, bandwidth, days."""
    prices = cfg.plan.prices
    at_rest = c.total_bytes
    stored = at_rest if mode == "offline" else min(cfg.mode.window_bytes, at_rest)
    storage_cost = stored / 1e12 * prices.storage_usd_per_tb_month * sched.hours / HOURS_PER_MONTH
    transfer = 0 if inf.name == COLOCATED else at_rest * (variants if mode == "streaming" else 1)
    transfer_cost = transfer / 1e9 * prices.transfer_usd_per_gb
    m = trainer.memory
    train = PoolCost(pool=trainer.pool, stages="train", gpu=trainer.gpu_type, gpus=trainer.gpus,
                     gpu_hours=round(sched.train_billed, 1), usd_per_gpu_hour=trainer.price,
                     cost_usd=round(sched.train_billed * trainer.price, 2), peak_bytes_per_gpu=m["peak_bytes_per_gpu"],
                     usable_bytes_per_gpu=m["usable_bytes_per_gpu"], fits=bool(m["fits"]),
                     rate_sources={"train": inf.rates.sources["train"]})
    inference = PoolCost(pool="inference" if inf.name != COLOCATED else trainer.pool, stages="generate, extract",
                         gpu=inf.gpu_type, gpus=inf.gpus, gpu_hours=round(sched.inference_billed, 1),
                         usd_per_gpu_hour=inf.price, cost_usd=round(sched.inference_billed * inf.price, 2),
                         peak_bytes_per_gpu=inf.peak, usable_bytes_per_gpu=inf.usable, fits=inf.peak <= inf.usable,
                         rate_sources={s: inf.rates.sources[s] for s in ("generate", "extract")})
    total = sched.inference_billed * inf.price + sched.train_billed * trainer.price + storage_cost + transfer_cost
    return Row(key=f"{inf.name}/{inf.precision}/{mode}/{codec}", inference=inf.name, precision=inf.precision,
               mode=mode, codec=codec, lossless=c.lossless, pools=[inference, train],
               storage_bytes=int(stored), storage_cost_usd=round(storage_cost, 2), transfer_bytes=int(transfer),
               transfer_cost_usd=round(transfer_cost, 2), bandwidth_bytes_per_s=int(at_rest / sched.extract_seconds),
               days=round(sched.hours / 24, 2), total_cost_usd=round(total, 2), fits=inference.fits and train.fits,
               rates="/".join(rate_letter(inf.rates.sources[s]) for s in STAGES))


def compare_topologies(cfg: RunConfig, memory: dict[str, dict[str, Any]], codecs: dict[str, CodecPlan],
                       work: dict[str, StageEstimate], target: TargetCost, train_flops: float,
                       cal: Calibration | None) -> Comparison | None:
    """Every topology priced (module docstring) from the plan's memory per pool, codec table and tokens per stage
    (`work`); None when the trainer pool has no GPU type (a CPU run)."""
    train_pool = registry.current().pool_name(cfg.pools, "train")
    train_type = getattr(cfg.pools, train_pool).gpu_type
    if not train_type:
        return None
    unknown = sorted(set(cfg.plan.prices.gpu_usd_per_hour) - set(GPUS))
    if unknown:
        raise ConfigError(f"plan.prices.gpu_usd_per_hour: unknown GPU types {unknown}; known: "
                          f"{', '.join(sorted(GPUS))}")
    train_gpu = gpu_spec(train_type, cfg.plan.gpu_overrides)
    trainers = cfg.training.world_size
    train_entry = memory[train_pool]
    gen_tokens, tokens, train_tokens = (work[s].tokens for s in STAGES)
    options = [(COLOCATED, train_type, trainers, train_pool)] + [(g, g, cfg.plan.inference_gpus, "inference")
                                                                  for g in sorted(GPUS)]
    infs = [_inference(cfg, name, gpu_type, n, pool, precision, target, train_gpu, train_flops, cal)
            for name, gpu_type, n, pool in options for precision in PRECISIONS]
    train_price = gpu_price(cfg, train_pool, train_type)
    trainer = _Trainer(train_pool, train_type, trainers, train_price, train_entry)
    inf_pool = registry.current().pool_name(cfg.pools, "generate")
    name = COLOCATED if inf_pool == train_pool else getattr(cfg.pools, inf_pool).gpu_type
    configured = f"{name}/{cfg.plan.target_precision}/{cfg.mode.kind}/{cfg.features.codec}"
    priced = _Pricing(cfg, codecs, infs, trainer, gen_tokens, tokens, train_tokens, configured)
    rows = priced.rows(cfg.plan.train_variants)
    responses = []
    for kind in RESPONSES:
        kind_tokens = tokens_to_generate(cfg, tokens, kind) if kind != cfg.data.responses else gen_tokens
        kind_rows = rows if kind == cfg.data.responses else _rows(
            cfg, codecs, infs, trainer, (kind_tokens, tokens, train_tokens), cfg.plan.train_variants)
        responses.append(_responses_option(cfg, kind, configured, kind_rows, int(kind_tokens)))
    deadline = cfg.plan.deadline_days
    best = next((r for r in rows if r.fits and (deadline is None or r.days <= deadline)), None)
    rows = [_mark(r, configured, best.key if best else None) for r in rows]
    return Comparison(
        rows=rows, configured=configured,
        cheapest_in_deadline=best.key if best else None, max_cost_usd=cfg.plan.max_cost_usd,
        deadline_days=deadline, inference_gpus=cfg.plan.inference_gpus, trainer_gpus=trainers,
        train_tokens=int(train_tokens),
        prices={"inference_usd_per_gpu_hour": {i.gpu_type: i.price for i in infs if i.name != COLOCATED},
                "trainer_usd_per_gpu_hour": train_price,
                "storage_usd_per_tb_month": cfg.plan.prices.storage_usd_per_tb_month,
                "transfer_usd_per_gb": cfg.plan.prices.transfer_usd_per_gb},
        precision=[_precision_option(i) for i in infs if i.name == name],
        responses=[r for r in responses if r is not None], train_variants=cfg.plan.train_variants,
        balance=[priced.balance(n) for n in sorted({*BALANCE_VARIANTS, cfg.plan.train_variants})],
        offline_cheaper_from=priced.offline_cheaper_from())


BALANCE_VARIANTS = (1, 3, 10)  # the variant counts `plan --compare` always shows
MAX_BALANCE_VARIANTS = 100


@dataclass(frozen=True)
class _Pricing:
    """Every topology's rows for a number of variants (the rates and memory are computed once)."""

    cfg: RunConfig
    codecs: dict[str, CodecPlan]
    infs: list[_Inference]
    trainer: _Trainer
    gen_tokens: float
    tokens: float
    train_tokens: float
    configured: str  # the configured row's key

    def rows(self, variants: int) -> list[Row]:
        """Every row, sorted by total cost."""
        return _rows(self.cfg, self.codecs, self.infs, self.trainer, (self.gen_tokens, self.tokens, self.train_tokens),
                     variants)

    def balance(self, variants: int) -> VariantBalance:
        rows = self.rows(variants)
        inference, precision, _, codec = self.configured.split("/")
        same = {r.mode: r for r in rows if (r.inference, r.precision, r.codec) == (inference, precision, codec)}
        if len(same) == len(MODES):
            off, st = same["offline"], same["streaming"]
        else:
            off = next((r for r in rows if r.fits and r.mode == "offline"), None)
            st = next((r for r in rows if r.fits and r.mode == "streaming"), None)
        return VariantBalance(variants=variants, offline=off.key if off else None,
                              offline_usd=off.total_cost_usd if off else None, streaming=st.key if st else None,
                              streaming_usd=st.total_cost_usd if st else None)

    def offline_cheaper_from(self) -> int | None:
        """The smallest N at which the cheapest fitting offline row costs no more than the cheapest streaming one
        (None: not within MAX_BALANCE_VARIANTS, or one of the modes has no fitting row). Each variant adds a
        fixed cost to either side (a training; an extraction beside one), so the difference is monotone in N and
        a bisection finds the step."""
        def offline_cheaper(n: int) -> bool | None:
            b = self.balance(n)
            if b.offline_usd is None or b.streaming_usd is None:
                return None
            return b.offline_usd <= b.streaming_usd

        if offline_cheaper(1) is not False:
            return 1 if offline_cheaper(1) else None
        lo, hi = 1, MAX_BALANCE_VARIANTS  # offline dearer at lo; cheaper at hi, or never within the limit
        if not offline_cheaper(hi):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if offline_cheaper(mid) else (mid, hi)
        return hi


def tokens_to_generate(cfg: RunConfig, tokens: float, responses: str | None = None) -> int:
    """The tokens generate writes: the replies' share of every sample (plan.response_fraction), none when the
    dataset's own replies are the responses (data.responses=dataset, or `responses`)."""
    return 0 if (responses or cfg.data.responses) == "dataset" else int(tokens * cfg.plan.response_fraction)


def _rows(cfg: RunConfig, codecs: dict[str, CodecPlan], infs: list[_Inference], trainer: _Trainer,
          work: tuple[float, float, float], variants: int = 1) -> list[Row]:
    """Every topology priced with `work` (tokens to generate, extract and train on) and `variants` trainings,
    cheapest first."""
    gen_tokens, tokens, train_tokens = work
    rows = []
    for inf in infs:
        r = inf.rates.tokens_per_s
        hours = StageHours(gen_tokens / r["generate"] / 3600, tokens / r["extract"] / 3600,
                           train_tokens / r["train"] / 3600)
        # Colocated is offline only: the trainer holds every GPU while it trains, so nothing could extract beside
        # it into a bounded window.
        for mode in MODES if inf.name != COLOCATED else ("offline",):
            sched = schedule(hours, mode, inf.gpus if inf.name != COLOCATED else None, trainer.gpus, variants)
            rows += [_row(cfg, inf, trainer, mode, codec, codecs[codec], sched, variants)
                     for codec in codec_choices(cfg, codecs)]
    return sorted(rows, key=lambda r: (r.total_cost_usd, r.key))


def _responses_option(cfg: RunConfig, responses: str, configured: str, rows: list[Row],
                      gen_tokens: int) -> ResponsesOption | None:
    """The configured topology's row among `rows` (priced for one data.responses), None when it is not priced."""
    row = next((r for r in rows if r.key == configured), None)
    if row is None:
        return None
    return ResponsesOption(responses=responses, tokens_to_generate=gen_tokens,
                           inference_gpu_hours=row.pools[0].gpu_hours, total_cost_usd=row.total_cost_usd,
                           days=row.days, configured=responses == cfg.data.responses)


def _mark(row: Row, configured: str, best: str | None) -> Row:
    if row.key not in (configured, best):
        return row
    return row.model_copy(update={"configured": row.key == configured, "cheapest_in_deadline": row.key == best})


def _precision_option(inf: _Inference) -> PrecisionOption:
    r = inf.rates
    return PrecisionOption(precision=inf.precision, gpu=inf.gpu_type, weights_bytes_per_gpu=inf.weights,
                           kv_room_bytes_per_gpu=inf.kv_room, sequences=inf.sequences,
                           generate_tokens_per_s=round(r.tokens_per_s["generate"], 1),
                           extract_tokens_per_s=round(r.tokens_per_s["extract"], 1),
                           rate_sources={s: r.sources[s] for s in ("generate", "extract")})


# -- the gate ------------------------------------------------------------------------------------------------------
def _describe(row: Row) -> str:
    return f"{row.key} (${row.total_cost_usd:,.0f}, {row.days:,.1f} days)"


def _name(rows: list[Row], configured: Row) -> str:
    """The three cheapest of `rows`, and the cheapest that keeps the configured target precision when those three
    change it (FP8 features train a drafter for the FP8 target only)."""
    named = rows[:3]
    same = next((r for r in rows if r.precision == configured.precision), None)
    if same is not None and same not in named:
        named.append(same)
    return "; ".join(_describe(r) for r in named)


def cost_gate(cmp: Comparison | None, cfg: RunConfig) -> str | None:
    """Why the run may not start on plan.max_cost_usd / plan.deadline_days, naming the cheaper or faster rows that
    fit; None when it may (or neither is set)."""
    limit, deadline = cfg.plan.max_cost_usd, cfg.plan.deadline_days
    if limit is None and deadline is None:
        return None
    if cmp is None:
        raise ConfigError("plan.max_cost_usd / plan.deadline_days need GPU pools to price (pools.trainer.gpu_type)")
    row = cmp.row(cmp.configured)
    if row is None:
        raise ConfigError(f"plan.max_cost_usd / plan.deadline_days: the configured topology {cmp.configured} is not "
                          f"priced ({UNPRICED})")
    fitting = [r for r in cmp.rows if r.fits and r.key != row.key]
    msgs = []
    if limit is not None and row.total_cost_usd > limit:
        cheaper = [r for r in fitting if r.total_cost_usd <= limit and (deadline is None or r.days <= deadline)]
        named = _name(cheaper, row) if cheaper else (
            "none of the compared rows fits the limit; the cheapest: " + _describe(fitting[0]) if fitting else
            "none of the compared rows fits memory")
        msgs.append(f"the configured topology {_describe(row)} costs over plan.max_cost_usd = ${limit:,.0f}. "
                    f"Cheaper rows (flashdraft plan --compare): {named}")
    if deadline is not None and row.days > deadline:
        faster = [r for r in fitting if r.days <= deadline and (limit is None or r.total_cost_usd <= limit)]
        fastest = min(fitting, key=lambda r: (r.days, r.total_cost_usd), default=None)
        named = _name(faster, row) if faster else (
            "none of the compared rows meets it; the fastest: " + _describe(fastest) if fastest else
            "none of the compared rows fits memory")
        msgs.append(f"the configured topology {_describe(row)} takes longer than plan.deadline_days = "
                    f"{deadline:g}. Faster rows (flashdraft plan --compare): {named}")
    return " | ".join(msgs) or None


# -- output --------------------------------------------------------------------------------------------------------
def summary_line(cmp: Comparison | None) -> str | None:
    """The default plan output's one line: the configured topology's cost and days, and the cheapest
    alternative's (meeting plan.deadline_days when set)."""
    if cmp is None:
        return None
    row = cmp.row(cmp.configured)
    best = cmp.row(cmp.cheapest_in_deadline)
    if best is not None and row is not None and best.key == row.key:
        best = next((r for r in cmp.rows if r.fits and r.key != row.key
                     and (cmp.deadline_days is None or r.days <= cmp.deadline_days)), None)
    head = (f"cost: ${row.total_cost_usd:,.0f} in {row.days:,.1f} days ({row.key}, rates {row.rates})" if row
            else f"cost: the configured topology {cmp.configured} is not priced ({UNPRICED})")
    tail = f"; cheapest alternative: ${best.total_cost_usd:,.0f} in {best.days:,.1f} days ({best.key})" if best \
        else "; no alternative fits"
    fastest = min((r for r in cmp.rows if r.fits), key=lambda r: (r.days, r.total_cost_usd), default=None)
    fast = f"; fastest: ${fastest.total_cost_usd:,.0f} in {fastest.days:,.1f} days ({fastest.key})" if fastest \
        and fastest.key not in (getattr(row, "key", None), getattr(best, "key", None)) else ""
    return head + tail + fast + " (flashdraft plan --compare)"


def variants_markdown(cmp: Comparison) -> list[str]:
    """Offline against streaming as trainings of the same features (plan.train_variants) grow: the cheapest
    fitting row of each at N variants, and the N from which offline is the cheaper."""
    if not cmp.balance:
        return []

    def cell(key: str | None, usd: float | None) -> str:
        return f"${usd:,.0f} ({key})" if key is not None and usd is not None else "no row fits"

    pair = cmp.balance[0]
    what = (f"{pair.offline} against {pair.streaming}" if pair.offline and pair.streaming and
            pair.offline.replace("/offline/", "/streaming/") == pair.streaming else "the cheapest fitting rows")
    tip = (f"{what}: offline is the cheaper from {cmp.offline_cheaper_from} variant"
           f"{'' if cmp.offline_cheaper_from == 1 else 's'}" if cmp.offline_cheaper_from else
           f"{what}: offline is not the cheaper within {MAX_BALANCE_VARIANTS} variants")
    lines = ["", f"### Variants: trainings of the same features (plan.train_variants; {tip})", "",
             "| variants | offline | streaming |", "|---:|---|---|"]
    lines += [f"| {b.variants} | {cell(b.offline, b.offline_usd)} | {cell(b.streaming, b.streaming_usd)} |"
              for b in cmp.balance]
    return lines


def responses_markdown(cmp: Comparison) -> list[str]:
    """The configured topology with the replies from the target and from the dataset (data.responses), and what
    the second trades away."""
    if not cmp.responses:
        return []
    lines = ["", "Training replies (data.responses), configured topology:", "",
             "| | responses | tokens to generate | inference GPU-hours | days | total |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {'cfg' if o.configured else ''} | {o.responses} | {o.tokens_to_generate:,} | "
              f"{o.inference_gpu_hours:,.0f} h | {o.days:,.1f} | ${o.total_cost_usd:,.0f} |" for o in cmp.responses]
    return lines + ["", f"- {RESPONSES_TRADE}"]


def _fits_cell(row: Row) -> str:
    bad = [p.pool for p in row.pools if not p.fits]
    return "yes" if not bad else "**no**: " + ", ".join(dict.fromkeys(bad))


def compare_markdown(cmp: Comparison | None) -> str:
    """The comparison as Markdown: the table, its legend, the target-precision lines and the caveat."""
    if cmp is None:
        return "No comparison: the trainer pool has no GPU type (pools.trainer.gpu_type).\n"
    p = cmp.prices
    variants = f" x {cmp.train_variants} variants (plan.train_variants)" if cmp.train_variants > 1 else ""
    lines = [f"### Topologies by total cost ({len(cmp.rows)} rows; {cmp.inference_gpus} inference GPUs, "
             f"{cmp.trainer_gpus} trainer GPUs, {cmp.train_tokens:,} training tokens{variants} in every row)", "",
             "| | inference pool | weights | mode | codec | inference GPU-hours, cost | trainer GPU-hours, cost | "
             "storage, cost | writes | days | total | fits | rates |",
             "|---|---|---|---|---|---|---|---|---:|---:|---:|---|---|"]
    for r in cmp.rows:
        mark = " ".join(m for m, on in (("cfg", r.configured), ("best", r.cheapest_in_deadline)) if on)
        inf, train = r.pools
        inference = inf.gpu if r.inference != COLOCATED else f"colocated ({inf.gpu})"
        lines.append(
            f"| {mark} | {inference} | {r.precision} | {r.mode} | {r.codec}{'' if r.lossless else ' (lossy)'} | "
            f"{inf.gpu_hours:,.0f} h ${inf.cost_usd:,.0f} | {train.gpu_hours:,.0f} h ${train.cost_usd:,.0f} | "
            f"{r.storage_bytes / 1e12:,.1f} TB ${r.storage_cost_usd:,.0f} | {r.bandwidth_bytes_per_s / 1e9:,.2f} GB/s "
            f"| {r.days:,.1f} | ${r.total_cost_usd:,.0f} | {_fits_cell(r)} | {r.rates} |")
    deadline = f"plan.deadline_days = {cmp.deadline_days:g}" if cmp.deadline_days else "no plan.deadline_days"
    lines += ["", f"- cfg: the configured topology ({cmp.configured}); best: the cheapest row that fits and meets "
              f"the deadline ({deadline}): {cmp.cheapest_in_deadline or 'none'}",
              "- rates generate/extract/train: M measured, C carried from a calibration's measurement to this GPU "
              "(its share of the bandwidth or peak), A assumed (the throughput model scaled by each GPU's "
              "bandwidth and FLOPs; FP8 rows always assumed)",
              "- prices (plan.prices, pools.*.usd_per_gpu_hour; docs/planning.md): " + ", ".join(
                  f"{g} ${v:,.2f}" for g, v in p["inference_usd_per_gpu_hour"].items())
              + f"; trainer ${p['trainer_usd_per_gpu_hour']:,.2f} a GPU-hour; storage "
              f"${p['storage_usd_per_tb_month']:,.2f} a TB-month; transfer ${p['transfer_usd_per_gb']:,.3f} a GB",
              "- offline: stages in sequence, busy GPU-hours billed; streaming: extract and train together, both "
              "pools billed while the slower runs; colocated: everything in sequence on the trainer's GPUs; "
              "storage billed at rest (offline) or at the window (streaming) for the whole run; writes: what "
              "extraction sends to the store while it runs"]
    lines += variants_markdown(cmp)
    lines += responses_markdown(cmp)
    if cmp.precision:
        lines += ["", "Target precision on the inference pool (" + cmp.precision[0].gpu + "):"]
        for o in cmp.precision:
            lines.append(f"- {o.precision}: weights {fmt_gib(o.weights_bytes_per_gpu)} a GPU, KV room "
                         f"{fmt_gib(o.kv_room_bytes_per_gpu)} ({o.sequences:,} full-length sequences), generate "
                         f"{o.generate_tokens_per_s:,.0f} and extract {o.extract_tokens_per_s:,.0f} tokens/s a GPU "
                         f"({o.rate_sources['generate']})")
        lines.append(f"- caveat: {cmp.caveat}")
    return "\n".join(lines) + "\n"
