"""What a finished run measured: device memory sampled while it ran, one row per stage (wall time, tokens/s, peak
memory beside the plan's predicted peak, train MFU), and the calibration file of the production-width run.

Peak memory is sampled from outside the stages (NVML's device memory in use on a GPU, the run's process tree RSS on
a CPU) every `SAMPLE_S`, so every task process (kfp.local subprocesses, torchrun ranks) counts without a change to
the stages; a stage's peak is the largest sample between its records' start and end. On a GPU that figure holds
the CUDA context and the allocator's cache, so it sits above what the planner models (tensors); the trainer's own
`torch.cuda.max_memory_allocated` (rank 0, `peak_memory_bytes` in metrics/train.json) is shown beside it.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flashdraft.components.plan.summary import PlanSummary

SAMPLE_S = 0.25
GIB = 2**30


class MemorySampler:
    """Device memory in use (cuda) or the process tree's resident memory (cpu), sampled on a thread."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-e2e-memory", daemon=True)
        self._read = self._cuda_reader() if device == "cuda" else self._rss_reader()

    def _cuda_reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001 - no NVML binding: the driver's command line tool
            def smi() -> int:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5).stdout
                return int(float(out.split()[0]) * 2**20)
            return smi

    @staticmethod
    def _rss_reader():
        import psutil

        me = psutil.Process()

        def rss() -> int:
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:  # exited between the listing and the read
                    pass
            return total
        return rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), self._read()))
            except Exception:  # noqa: BLE001 - a missed sample is not a failed run
                pass
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def peak(self, start: float, end: float) -> int | None:
        inside = [b for t, b in self.samples if start <= t <= end]
        return max(inside) if inside else None


@dataclass
class StageRow:
    """One stage of one run, as the table shows it."""

    run: str
    stage: str
    device: str
    wall_s: float | None
    tokens: float | None = None
    tokens_per_s: float | None = None
    peak_bytes: int | None = None            # sampled (device memory in use, or process-tree RSS)
    predicted_bytes: int | None = None       # the plan's peak per GPU (train: at the rows the run trained)
    allocated_bytes: int | None = None       # train: rank 0's own peak (cuda allocated / RSS)
    mfu: float | None = None                 # train: model FLOPs / s over the bf16 peak
    note: str = ""


@dataclass
class RunResult:
    """A finished (or failed) run-local: its config, exit status, wall time, rows and what the calibration needs."""

    name: str
    preset: str
    sets: tuple[str, ...]
    rc: int
    wall_s: float
    rows: list[StageRow] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.error


def target_weights(folder: Path) -> tuple[int, dict[int, int], int]:
    """From the target's safetensors headers (no tensor is read): (bytes one decode step reads: every
    language-model weight but the embedding, parameters of each decoder layer, the embedding's bytes)."""
    import json

    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    size = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "I8": 1, "BOOL": 1}
    decode, embed, layers = 0, 0, {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                sl = st.get_slice(key)
                n = 1
                for d in sl.get_shape():
                    n *= d
                b = n * size.get(sl.get_dtype(), 2)
                if "visual" in key:  # the vision tower: not on the text path
                    continue
                if "embed_tokens" in key:
                    embed += b
                    continue
                decode += b
                if m := re.search(r"\.layers\.(\d+)\.", key):
                    layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + n
    return decode, layers, embed


def gpu_type_of(name: str) -> str | None:
    """The planner's GPU key for a driver-reported name (components/plan/gpus.py), or None."""
    for needle, key in (("H200", "h200"), ("H100", "h100"), ("B200", "b200"), ("A100", "a100"), ("L40S", "l40s"),
                        ("RTX PRO 6000", "rtx-pro-6000")):
        if needle in name:
            return key
    return None


def plan_for(cfg, gpu_type: str | None) -> PlanSummary:
    """The plan of this run's config with both pools on the measuring GPU (one GPU each), for its predicted peaks."""
    from flashdraft.components.plan.planner import make_plan

    if gpu_type:
        cfg = cfg.with_overrides({"pools.inference.gpu_type": gpu_type, "pools.trainer.gpu_type": gpu_type,
                                  "pools.inference.accelerator_count": 1, "pools.trainer.accelerator_count": 1})
    return make_plan(cfg)


def _predicted(plan: PlanSummary, pool: str) -> int | None:
    mem = (plan.memory or {}).get(pool) or {}
    return mem.get("peak_bytes_per_gpu")


def train_step_flops(cfg, history: list[dict[str, Any]], vocab: int) -> tuple[float, Any]:
    """(model FLOPs of one data token, the TrainShape) at the steps the run actually took: their mean tokens and
    anchors a step, the planner's FLOPs model (flashdraft/perf/flops.py trainer_flops)."""
    from flashdraft.components.plan.resources import train_shape, window_keys
    from flashdraft.perf.flops import trainer_flops

    tokens = max(1, round(sum(h["tokens"] for h in history) / len(history)))
    anchors = sum(h.get("anchors", 0) for h in history) / len(history)
    cfg = cfg.with_overrides({"plan.target_vocab": vocab})
    shape, _ = train_shape(cfg, tokens_per_step=tokens)
    shape = shape.model_copy(update={"anchors_per_row": anchors})
    return sum(trainer_flops(shape, window_keys(cfg)).values()) / tokens, shape


def stage_rows(run: str, cfg, sampler: MemorySampler, gpu_name: str, peak_tflops: float | None
               ) -> tuple[list[StageRow], dict[str, Any]]:
    """The table rows of a finished run from its committed records and metrics, and the figures the calibration
    file needs (generate / extract / train)."""
    from flashdraft.components.evaluate.summary import EvaluateSummary
    from flashdraft.components.generate.summary import GenerateSummary
    from flashdraft.components.train.summary import TrainSummary
    from flashdraft.run.status import combine, read_records
    from flashdraft.storage import layout
    from flashdraft.storage.store import open_store
    from flashdraft.target.model import load_hf_config, text_config

    store = open_store(cfg.storage, cfg.run_id)
    records = [r for r in read_records(store) if r.state == "done"]
    stages: dict[str, list] = {}
    for r in sorted(records, key=lambda r: r.started):
        stages.setdefault(r.stage, []).append(r)
    vocab = text_config(load_hf_config(cfg.target)).vocab_size
    plan = plan_for(cfg.with_overrides({"plan.target_vocab": vocab}), gpu_type_of(gpu_name))
    figures: dict[str, Any] = {}

    def metrics(stage: str) -> dict[str, Any] | None:
        key = layout.metrics_key(stage)
        return store.get_json_verified(key) if store.is_committed(key) else None

    rows = []
    for stage, tasks in stages.items():
        start, end = min(t.started for t in tasks), max(t.ended or t.started for t in tasks)
        devices = sorted({t.device for t in tasks if t.device})
        row = StageRow(run, stage, ",".join(devices) or "-", round(end - start, 1), peak_bytes=sampler.peak(start, end))
        figs = combine(t.figures for t in tasks)
        if stage == "generate" and figs.get("generation_seconds"):
            row.tokens = figs.get("generated_tokens", 0)
            row.tokens_per_s = row.tokens / figs["generation_seconds"]
            row.predicted_bytes = _predicted(plan, "inference")
            row.note = "plan: vLLM's reservation" if cfg.generation.backend == "hf" else ""
            dones = [GenerateSummary.model_validate(m) for t in tasks
                     if (m := metrics(f"generate-{layout.shard_name(t.shard)}")) is not None]
            chunks = sum(d.num_chunks or 0 for d in dones) or 1
            figures["generate"] = {"tokens_per_s": row.tokens_per_s, "batch": max(1, round(
                sum(d.samples or 0 for d in dones) / chunks))}
        elif stage == "extract" and figs.get("extract_seconds"):
            row.tokens = figs.get("new_tokens", 0)
            row.tokens_per_s = row.tokens / figs["extract_seconds"]
            row.predicted_bytes = _predicted(plan, "inference")
            figures["extract"] = {"tokens_per_s": row.tokens_per_s}
        elif stage == "train" and (m := metrics("train")) is not None:
            train = TrainSummary.model_validate(m)
            row.tokens, row.tokens_per_s = train.tokens, train.tokens_per_s
            row.allocated_bytes = train.peak_memory_bytes
            row.predicted_bytes = _predicted(plan, "trainer")
            row.note = f"resumed from step {train.resumed_from}" if train.resumed_from else "not resumed"
            if train.history and train.tokens_per_s:
                from flashdraft.components.plan.memory import trainer_memory

                fpt, shape = train_step_flops(cfg, train.history, vocab)
                # the plan's memory model at the rows this run trained (its config's row is a planning figure)
                device = "cuda" if any(d.startswith("cuda") for d in devices) else "cpu"
                row.predicted_bytes = trainer_memory(shape, device).peak_bytes
                row.mfu = train.tokens_per_s * fpt / (peak_tflops * 1e12) if peak_tflops else None
                figures["train"] = {"tokens_per_s": train.tokens_per_s, "flops_per_token": fpt, "shape": shape,
                                    "resumed_from": train.resumed_from, "steps": train.steps}
        elif stage == "evaluate" and (m := metrics("evaluate")) is not None:
            ev = EvaluateSummary.model_validate(m)
            row.tokens_per_s = ev.drafter.tokens_per_s if ev.drafter else None
            row.note = (f"tau {ev.drafter.tau:.2f}, " if ev.drafter and ev.drafter.tau else "") + \
                f"lossless {ev.lossless.passed if ev.lossless else '-'}"
            figures["lossless"] = bool(ev.lossless and ev.lossless.passed)
        rows.append(row)
    figures["stages"] = list(stages)
    return rows, figures


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[StageRow]) -> str:
    """The per-stage table, plain text."""
    head = ("run", "stage", "device", "wall s", "tokens/s", "peak GiB (sampled)", "plan peak GiB/GPU",
            "allocated GiB", "MFU", "note")
    lines = [head]
    for r in rows:
        lines.append((r.run, r.stage, r.device, _num(r.wall_s, ".1f"), _num(r.tokens_per_s, ",.1f"),
                      _num(r.peak_bytes and r.peak_bytes / GIB, ".2f"),
                      _num(r.predicted_bytes and r.predicted_bytes / GIB, ".2f"),
                      _num(r.allocated_bytes and r.allocated_bytes / GIB, ".2f"), _num(r.mfu, ".2%"), r.note))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def calibration(result: RunResult, cfg, gpu: dict[str, Any], device: str, commit: str | None, note: str):
    """The calibration file (flashdraft/perf/calibration.py) of a production-width run: its generate, extract and
    train rates, each with what lets the planner carry it to other shapes and GPUs (bytes a generated token,
    FLOPs a token)."""
    import datetime

    from flashdraft.perf.calibration import (
        Calibration,
        CalibrationSource,
        ExtractRate,
        ExtractShape,
        GenerateRate,
        GenerateShape,
        GpuInfo,
        StageRates,
        TrainRate,
    )
    from flashdraft.target.model import resolve_model_dir

    figs = result.figures
    folder = Path(resolve_model_dir(cfg.target))
    decode_bytes, layer_params, _ = target_weights(folder)
    ids = cfg.layer_ids()
    run_layers = max(ids) + 1
    model = f"{cfg.target.model} ({cfg.target.source}), {cfg.target.num_layers} layers"
    rates = StageRates()
    if "generate" in figs:
        g = figs["generate"]
        rates.generate = GenerateRate(
            tokens_per_s_per_gpu=g["tokens_per_s"], bytes_per_token=decode_bytes / g["batch"],
            note=f"{cfg.generation.backend} backend, {g['batch']} sequences a step; bytes_per_token = the weights "
                 f"a decode step reads ({decode_bytes / 1e9:.2f} GB, embedding excluded) / {g['batch']}",
            shape=GenerateShape(model=model, batch=g["batch"], max_model_len=cfg.generation.max_model_len))
    if "extract" in figs:
        flops = 2.0 * sum(layer_params.get(i, 0) for i in range(run_layers))
        rates.extract = ExtractRate(
            tokens_per_s_per_gpu=figs["extract"]["tokens_per_s"], flops_per_token=flops or None,
            note="the extract stage's HF prefill; flops_per_token: 2 x the parameters of the layers run",
            shape=ExtractShape(model=model, layers_run=run_layers, hidden_size=cfg.target.hidden_size or 1,
                               forward_tokens=cfg.features.forward_tokens_on(device)))
    if "train" in figs:
        t = figs["train"]
        rates.train = TrainRate(
            tokens_per_s_per_gpu=t["tokens_per_s"], flops_per_token=t["flops_per_token"], shape=t["shape"],
            note=f"the train stage through torchrun ({cfg.training.strategy}, {cfg.training.world_size} rank), "
                 f"{t['steps']} steps at this run's rows (mean tokens and anchors a step in shape); "
                 f"resumed from step {t['resumed_from']}")
    return Calibration(
        source=CalibrationSource(device=gpu["device"], date=datetime.date.today().isoformat(), commit=commit,
                                 command=f"make gpu-e2e{'-dry' if device == 'cpu' else ''} ({result.preset})",
                                 note=note),
        gpu=GpuInfo(name=gpu["name"], gpu_type=gpu.get("gpu_type"), memory_bytes=gpu.get("memory_bytes"),
                    bf16_tflops_peak=gpu.get("peak_tflops"), memory_bandwidth_gbs=gpu.get("bandwidth_gbs")),
        rates=rates)
