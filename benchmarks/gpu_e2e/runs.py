"""The two runs and their settings: `flashdraft run-local` as a user types it, in a subprocess, with its stage lines
streamed here and its whole output kept in a log file.

GPU mode: `qwen3.6-27b-rehearsal` (the full-width random 5-layer Qwen3.6-27B target built on the GPU, HF generate
and extract, the production drafter (DFlash2 at layer recompute) trained with FSDP2 through torchrun on one rank
with NCCL, preempted after step 1 and resumed, evaluate, export, report), then the `tiny` preset with q4 shards
decoded on the trainer's device (a gpu_check row that never ran on a GPU). Dry mode (CPU, CI): the same two runs at tiny
shapes; the rehearsal's stand-in is `tiny-qwen35` (the same hybrid architecture at width 128) with the rehearsal's
recipe (`REHEARSAL_RECIPE`: FSDP2 through torchrun on one rank, gloo on CPU, a checkpoint every step, preempted
and resumed, fp8-zstd shards), so the code path is the GPU run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# The gpu_check rows never run on a GPU (README): the trainer decoding q4 shards on its device (folded into the tiny
# run, which keeps the embedded default, DFlash) and DFlash2 at layer recompute (the rehearsal's drafter below).
TINY_EXTRAS = ("features.codec=q4", "training.feature_decode=device")
# What makes the rehearsal the production DAG on one machine, in both modes: the production drafter (qwen3.6-27b
# trains DFlash2 at layer recompute; the rehearsal preset itself still trains DFlash), FSDP2 through torchrun on one
# rank, a checkpoint every step, preempted after step 1 and resumed, fp8-zstd shards.
REHEARSAL_RECIPE = ("drafter.kind=dflash2", "training.activation_checkpointing=layer", "training.strategy=fsdp2",
                    "training.nproc_per_node=1", "training.checkpoint_every=1", "training.preempt_after=1",
                    "features.codec=fp8-zstd", "features.fp8_scale=token")
# Dry mode: few prompts and tokens, one shard (each task is a process start on a 2-core CI machine).
DRY_SMALL = ("data.num_shards=1", "eval.num_prompts=1", "eval.max_new_tokens=8", "eval.baseline_prompts=0")


@dataclass(frozen=True)
class RunSpec:
    name: str
    preset: str
    sets: tuple[str, ...]
    timeout_s: int
    production_width: bool   # its rates go into the calibration file

    def args(self) -> list[str]:
        return ["--preset", self.preset, *[a for s in self.sets for a in ("--set", s)]]


def run_specs(dry: bool, work: Path, only: tuple[str, ...] = ()) -> list[RunSpec]:
    """The runs of this mode, in order."""
    def store(name: str) -> tuple[str, ...]:
        return (f"storage.root=file://{work}/runs", f"run_id=gpu-e2e-{name}")

    # The rehearsal first: its rates are the calibration file, so a run cut short by the budget loses tiny instead.
    if dry:
        specs = [
            # DFlash2 needs the full vocabulary (tiny-qwen35 drafts over 4,096); rank 16 keeps its codebooks small
            RunSpec("rehearsal", "tiny-qwen35", (*store("rehearsal"), *REHEARSAL_RECIPE, *DRY_SMALL,
                                                 "drafter.draft_vocab_size=null", "drafter.selector_rank=16",
                                                 "data.max_samples=4", "data.eval_count=1",
                                                 "data.max_response_tokens=16", "training.epochs=2"), 300, True),
            RunSpec("tiny", "tiny", (*store("tiny"), *TINY_EXTRAS, *DRY_SMALL, "data.max_samples=6",
                                     "data.eval_count=1", "data.max_response_tokens=12", "training.epochs=1"),
                    300, False)]
    else:  # one rehearsal shard (each is a load of the 8.4 GB target); tiny keeps its 2 (the fan-out)
        specs = [
            RunSpec("rehearsal", "qwen3.6-27b-rehearsal", (*store("rehearsal"), *REHEARSAL_RECIPE,
                                                           "data.num_shards=1", "training.num_threads=8"), 420, True),
            RunSpec("tiny", "tiny", (*store("tiny"), *TINY_EXTRAS), 240, False)]
    return [s for s in specs if not only or s.name in only]


def run_local(spec: RunSpec, work: Path, environ: dict[str, str], log_dir: Path) -> tuple[int, float, str]:
    """`python -m flashdraft.cli.main run-local` for `spec` from `work` (not the repository root, whose `flashdraft/`
    folder would shadow the installed package in the tasks); its stage lines are printed as they come. Returns
    (exit status, wall seconds, error line). Past `spec.timeout_s` the whole process group is killed."""
    log = log_dir / f"run-local-{spec.name}.log"
    cmd = [sys.executable, "-m", "flashdraft.cli.main", "run-local", *spec.args(), "--workdir", str(work / "kfp")]
    print(f"== {spec.name}: flashdraft run-local {' '.join(spec.args())}", flush=True)
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                out.write(line)
                print(f"   {line.rstrip()}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=spec.timeout_s)
            error = "" if rc == 0 else f"run-local exited with status {rc} (log: {log})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            error = f"run-local ran past {spec.timeout_s} s and was killed (log: {log})"
        reader.join(timeout=5)
    collect_task_logs(work / "kfp" / "logs", spec, log_dir / f"tasks-{spec.name}.log")
    return rc, round(time.monotonic() - t0, 1), error


def collect_task_logs(logs: Path, spec: RunSpec, dest: Path, tail: int = 300) -> None:
    """The last `tail` lines of every task log of this run's newest log folder, in one file (a device run brings
    back a few files, not folders of them): where a failed task says why."""
    run_id = next((s.split("=", 1)[1] for s in spec.sets if s.startswith("run_id=")), spec.name)
    folders = sorted(logs.glob(f"{run_id}-*"), key=lambda f: f.stat().st_mtime)
    if not folders:
        return
    with open(dest, "w", encoding="utf-8") as out:
        for log in sorted(folders[-1].glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            out.write(f"===== {log.name} ({len(lines)} lines, last {min(tail, len(lines))})\n")
            out.write("\n".join(lines[-tail:]) + "\n")
