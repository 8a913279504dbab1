"""The images as built from docker/*/Dockerfile: they run the CLI as their non-root user, hold no credential, and
run the tiny preset's whole DAG under kfp.local's DockerRunner with the results of an in-process run.

Only build args differ from a registry build (the stand-in base, the wheel index, its CA; tests/containers/
container_engine.py says why). What only a real registry and GPU can check is listed in docs/cluster.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from container_engine import build, image_requirements, vllm_standin
from safetensors.torch import load as safetensors_load

from flashdraft.config import load_config
from flashdraft.pipelines.containers import versions_match
from flashdraft.run.status import read_records
from flashdraft.storage import layout
from flashdraft.storage.store import open_store

FLASHDRAFT = str(Path(sys.executable).parent / "flashdraft")
APP_UID = "10001"
# 2 GiB until `datasets` joined the base (prep and evaluate read hf: sources and suites with it; it brings pandas,
# dill, multiprocess, xxhash): the base measured 1.95 GB before and 2.23 GB after (2026-12-07).
MAX_BASE_BYTES = int(2.25 * 1024**3)
# What must never be in an image's history, env or labels: credentials in a URL, keys, the tests' S3 secret.
CREDENTIAL = re.compile(r"://[^/@\s:]+:[^/@\s]+@|PRIVATE KEY|AWS_SECRET_ACCESS_KEY=\S|flashdraft-test-secret", re.I)


def _run(engine, image: str, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
    return engine.docker("run", "--rm", "--network", "none", *(["--user", user] if user else []), image, *args,
                         check=False, timeout=300)


def _host_version() -> str:
    return subprocess.run([FLASHDRAFT, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def _check_cli(engine, image: str) -> None:
    """--version (this checkout's), --help, no arguments, and a program on PATH, all as the image's own user."""
    version = _run(engine, image, "--version")
    assert version.returncode == 0, version.stderr
    assert versions_match(_host_version(), version.stdout.strip()), (version.stdout, _host_version())
    helped = _run(engine, image, "--help")
    assert helped.returncode == 0 and "run-local" in helped.stdout, helped.stderr
    bare = _run(engine, image)
    assert bare.returncode == 0 and "run-local" in bare.stdout, bare.stderr
    uid = _run(engine, image, "id", "-u")
    assert uid.stdout.strip() == APP_UID, uid.stdout + uid.stderr


def _check_hygiene(engine, image: str) -> int:
    """No credential in any layer's command, the env or the labels; a non-root user. Returns the size."""
    history = engine.docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    config = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    seen = "\n".join([history, *(config.get("Env") or []), json.dumps(config.get("Labels") or {})])
    leaks = sorted({m.group(0)[:40] for m in CREDENTIAL.finditer(seen)})
    assert not leaks, f"{image}: credentials in history/env/labels: {leaks}"
    assert config["User"] == APP_UID, f"{image} runs as {config['User']!r}"
    size = engine.image_size(image)
    print(f"\n{image}: {size / 1e9:.2f} GB", flush=True)
    return size


def test_base_image_runs_the_cli_as_its_non_root_user(engine, base_image):
    _check_cli(engine, base_image)


def test_base_image_holds_no_credential_and_fits_its_size(engine, base_image):
    assert _check_hygiene(engine, base_image) <= MAX_BASE_BYTES


def test_trainer_image_builds_on_a_standin_base(engine, standin, proxy_args):
    """Every step after FROM of docker/trainer/Dockerfile, on a Debian stand-in with CPU torch (a CUDA base and
    CUDA torch cannot be had here), including its import checks."""
    tag = "flashdraft-trainer:containers-test"
    seconds = build(engine, "docker/trainer/Dockerfile", tag,
                    {"CUDA_IMAGE": standin, "PYTHON": "python3.11", **proxy_args})
    print(f"\nbuilt {tag} in {seconds:.0f} s", flush=True)
    _check_cli(engine, tag)
    _check_hygiene(engine, tag)
    torchrun = _run(engine, tag, "python", "-m", "torch.distributed.run", "--help")
    assert torchrun.returncode == 0, torchrun.stderr


def test_inference_image_builds_on_a_vllm_standin(engine, standin, wheel_index, proxy_args):
    """Every step after FROM of docker/inference/Dockerfile (the torch pin check, CA, user, dependency layer with
    everything the base image has pinned, import checks of kfp, torch and vllm) on a stand-in for the vLLM image
    (container_engine.vllm_standin says what it is and is not)."""
    torch_req = next(r for r in image_requirements()[0] if r.startswith("torch=="))
    base = vllm_standin(engine, standin, torch_req, *wheel_index)
    tag = "flashdraft-inference:containers-test"
    args = {k: v for k, v in proxy_args.items() if k != "TORCH_INDEX_URL"}  # the vLLM image brings its torch
    seconds = build(engine, "docker/inference/Dockerfile", tag, {"VLLM_IMAGE": base, **args})
    print(f"\nbuilt {tag} in {seconds:.0f} s", flush=True)
    _check_cli(engine, tag)
    _check_hygiene(engine, tag)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Compared as summaries (untimed JSON), not bytes: shard completion markers carry the shard's elapsed time.
MARKERS = ("/DONE",)
# Not compared: the model card (provenance: Python build, commit), the pickle-format copy of the mask embedding
# (its safetensors twin is compared) and the process's global RNG state saved with a checkpoint, which depends on
# whether that process built the tiny random target (a fresh container does) or read it from the model cache;
# training draws from its own seeded generators.
UNCOMPARED = ("README.md", "/rng-rank-", "mask_embedding.pt")
# Prep, generate and extract are bit-deterministic across processes: their objects must be byte-identical. Training's
# float reductions are not bit-reproducible from one process environment to another (oneDNN/MKL pick kernels by
# ISA, thread count and buffer alignment; CI saw a first-step grad norm 1156.09375 vs 1156.09766), so what training
# produces (its summaries, checkpoint and export weights) is compared to float tolerance: a wrong input, seed or
# step shows up orders of magnitude above it.
TRAINED = (layout.CHECKPOINTS, layout.EXPORT, f"{layout.METRICS}/train", f"{layout.METRICS}/evaluate",
           f"{layout.METRICS}/export")
REL_TOL = 1e-3
# Adam moves an element by up to ~lr a step whatever its gradient's size, so a near-zero gradient's rounding can
# move a weight by that much: 4 steps at lr 2.5e-4 bound it by 1e-3.
WEIGHT_ATOL = 2e-3


def _committed(root: Path, run_id: str) -> tuple[dict, dict, dict]:
    """(task -> fingerprint, committed JSON -> its content without timings, committed object -> sha256, or for a
    trained safetensors object its tensors) of a finished run; the store's own URL is replaced by `<store>` (the two
    runs' stores are two folders)."""
    cfg = load_config(preset="tiny", overrides={"storage.root": f"file://{root}", "run_id": run_id})
    store = open_store(cfg.storage, cfg.run_id)
    records = read_records(store)
    assert records and all(r.state == "done" for r in records), [(r.task, r.state, r.error) for r in records]
    fingerprints = {r.task: r.fingerprint for r in records}
    summaries, objects = {}, {}
    for prefix in (layout.METRICS, layout.RESPONSES, layout.FEATURES, layout.CHECKPOINTS, layout.EXPORT):
        for key in store.list_committed(f"{prefix}/"):
            if any(u in key for u in UNCOMPARED):
                continue
            data = store.get_verified(key)
            if key.endswith(".json") or key.endswith(MARKERS):
                text = data.decode().replace(f"file://{root}", "<store>").replace(str(root), "<store>")
                summaries[key] = _untimed(json.loads(text))
            elif key.endswith(".safetensors") and key.startswith(TRAINED):
                objects[key] = safetensors_load(data)
            else:
                objects[key] = _sha(data)
    return fingerprints, summaries, objects


TIMING = re.compile(r"(^|_)(s|seconds|time|wall|elapsed|started|ended|at|per_s|per_second|throughput|rss|peak_memory"
                    r"|date|provenance|commit|python|libraries|log|device_name|mfu|share|speedup|load|ms)($|_)")


# Decisions made from timings: the verdict (the fastest lossless decoder, its margin and every candidate's tokens/s)
# and the timing spread the choice of k is made within.
TIMED_CHOICES = {"verdicts", "spread"}


def _untimed(value):
    """A summary without what differs between two runs of the same inputs: timings, rates, provenance."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items()
                if not TIMING.search(k) and "tokens_per_s" not in k and k not in TIMED_CHOICES}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _differences(a, b, path: str = "", *, trained: bool = False) -> list[str]:
    """Where two JSON values (or tensor dicts) differ, as dotted paths with both values. Under a trained key, floats
    may differ by REL_TOL, tensors by WEIGHT_ATOL, and a weight file's sha256 in an export manifest is not compared
    (its tensors are); everything else, integers and strings included, must be equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys()) if not (trained and k == "sha256" and ".safetensors" in path)
                for d in _differences(a.get(k), b.get(k), f"{path}.{k}",
                                      trained=trained or (not path and k.startswith(TRAINED)))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{path}[{i}]", trained=trained)]
    if trained and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a.float(), b.float(), rtol=REL_TOL,
                                                                        atol=WEIGHT_ATOL):
            return []
        gap = (a.float() - b.float()).abs().max().item() if a.shape == b.shape else "-"
        return [f"{path}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}, max |diff| {gap}"]
    if trained and isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b and type(a) is type(b) else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


def test_tiny_dag_in_the_image_equals_an_in_process_run(docker_env, base_image, tmp_path):
    """`run-local --runner docker --image BASE` runs every task in the image and commits what the same command
    without --runner commits: the same fingerprints, summaries and bytes (responses, feature parts), and what
    training made (checkpoint, export weights, training and evaluation figures) equal to float tolerance."""
    results = {}
    for runner in ("subprocess", "docker"):
        store = tmp_path / runner / "runs"
        # a fixed draft length: `auto` picks k from timings measured in each process, which two runs need not share
        args = [FLASHDRAFT, "run-local", "--preset", "tiny", "--workdir", str(tmp_path / runner / "kfp"),
                "--set", f"storage.root=file://{store}", "--set", "run_id=containers",
                "--set", "eval.num_draft_tokens=7"]
        if runner == "docker":
            args += ["--runner", "docker", "--image", base_image]
        t0 = time.monotonic()
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=1500)
        assert proc.returncode == 0, f"{runner}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        print(f"\ntiny run-local --runner {runner}: {time.monotonic() - t0:.0f} s", flush=True)
        if runner == "docker":
            assert f"cpu {base_image}" in proc.stdout, proc.stdout[:2000]
        results[runner] = _committed(store, "containers")
    (fp_a, sum_a, obj_a), (fp_b, sum_b, obj_b) = results["subprocess"], results["docker"]
    assert fp_a == fp_b
    assert not _differences(sum_a, sum_b), _differences(sum_a, sum_b)
    assert any(k.startswith(f"{layout.FEATURES}/") for k in obj_a) and any("safetensors" in k for k in obj_a)
    assert not _differences(obj_a, obj_b), _differences(obj_a, obj_b)


def test_run_local_docker_refuses_a_missing_image_and_another_version_in_one_line(docker_env, base_image, tmp_path):
    def run_local(image: str) -> subprocess.CompletedProcess:
        return subprocess.run([FLASHDRAFT, "run-local", "--preset", "tiny", "--runner", "docker", "--image", image,
                               "--workdir", str(tmp_path / "kfp"), "--set", f"storage.root=file://{tmp_path}/runs"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)

    missing = run_local("flashdraft-base:never-built")
    assert missing.returncode == 1
    assert missing.stderr.strip() == ("image flashdraft-base:never-built not found on this Docker engine: build it "
                                      "(`make images`) or pull it"), missing.stderr
    # The same image with another flashdraft version: its package's __version__ edited, committed as a new image.
    engine = docker_env
    engine.docker("run", "--name", "other-version", "--user", "0", "--network", "none", base_image, "sh", "-c",
                  "sed -i 's/^__version__ = .*/__version__ = \"0.0.1\"/' "
                  "$(python3 -c 'import flashdraft; print(flashdraft.__file__)')")
    engine.docker("commit", "other-version", "flashdraft-base:other-version")
    other = run_local("flashdraft-base:other-version")
    assert other.returncode == 1
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "has flashdraft 0.0.1" in lines[0] and "rebuild the image" in lines[0], other.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("status")), "nothing may run"
