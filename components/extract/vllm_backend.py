"""The `vllm` extraction backend: prefill through vLLM, hidden states from forward hooks in its worker.

The engine lives in a subprocess (`vllm_worker.py`, interpreter `$FLASHDRAFT_VLLM_PYTHON` or this one), since
vLLM must start under a `__main__` guard and on CPU machines sits in its own venv. Features come back as
safetensors files in a private temp folder, are checked against the sample length and deleted.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import torch

from flashdraft.components.extract.source import ExtractionError, Row
from flashdraft.config import RunConfig

log = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "FLASHDRAFT_VLLM_PYTHON"


class VLLMFeatureSource:
    """Prefill through vLLM in a worker subprocess, features from hooks there (a `FeatureSource`,
    components/extract/source.py)."""

    def __init__(self, cfg: RunConfig, layer_ids: list[int]):
        from flashdraft.target.model import vllm_target_args

        self.layer_ids = layer_ids
        on_gpu = torch.cuda.is_available()
        self.max_len = cfg.generation.max_model_len or (cfg.data.max_prompt_tokens + cfg.data.max_response_tokens + 8)
        init = {"target": vllm_target_args(cfg.target), "layer_ids": layer_ids,
                "dtype": "bfloat16" if on_gpu else cfg.target.dtype, "max_model_len": self.max_len}
        python = os.environ.get(VLLM_PYTHON_ENV) or sys.executable
        self.tmp = tempfile.TemporaryDirectory(prefix="flashdraft-vllm-")
        t0 = time.time()
        self.proc = subprocess.Popen([python, "-m", "flashdraft.components.extract.vllm_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._send(init)
        self._read()
        log.info("vllm extraction worker ready in %.1f s (%s)", time.time() - t0, python)

    def _send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise ExtractionError(f"vllm extraction worker exited with code {code} (its log is above, on stderr);"
                                  f" on CPU set {VLLM_PYTHON_ENV} to a venv with vllm (make vllm-venv)")
        return json.loads(line)

    def features(self, batch: list[Row]) -> list[torch.Tensor]:
        from safetensors.torch import load_file

        too_long = [r.sample_id for r in batch if len(r.input_ids) > self.max_len]
        if too_long:
            raise ExtractionError(f"samples {too_long} exceed the vLLM max_model_len {self.max_len}: "
                                  "raise generation.max_model_len")
        self._send({"prompts": [r.input_ids for r in batch], "out_dir": self.tmp.name})
        reply = self._read()
        out = []
        for row, path, n in zip(batch, reply["files"], reply["tokens"], strict=True):
            feats = load_file(path)["features"]
            os.unlink(path)
            if n != len(row.input_ids) or feats.shape[0] != len(row.input_ids):
                raise ExtractionError(f"sample {row.sample_id}: vLLM captured {feats.shape[0]} token rows for "
                                      f"{len(row.input_ids)} input tokens (truncation or drift)")
            if feats.shape[1] != len(self.layer_ids):
                raise ExtractionError(f"sample {row.sample_id}: captured {feats.shape[1]} layers, expected "
                                      f"{len(self.layer_ids)}")
            out.append(feats.to(torch.bfloat16))
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.tmp.cleanup()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
