"""vLLM extraction engine in its own process: `python -m flashdraft.components.extract.vllm_worker`.

Runs in the vLLM interpreter (`$FLASHDRAFT_VLLM_PYTHON`, a separate venv on CPU machines), so it imports only the
standard library, torch, safetensors, vLLM and flashdraft.target.capture's layer paths. `HiddenStateExtension` is a vLLM
worker extension: forward hooks on decoder layer i of the worker's model (`model.layers[i]`, or
`language_model.model.layers[i]` in a multimodal target) collect each configured layer's output. vLLM decoder layers
return `(hidden, residual)` with the residual add deferred to the next layer's fused norm; their sum is the HF
hidden state (DFlash id i == HF hidden_states[i + 1]). Captured tensors are written to safetensors files (tensors
returned through collective_rpc come back mangled) and only file names and counts cross the RPC.

Each prompt is prefilled alone with max_tokens=1 (prefix caching and chunked prefill off, eager mode), so the
captured rows are exactly that prompt's tokens; the parent checks the count.

Protocol (JSON lines): first line the engine config -> `{"ready": true, "startup_s": ...}`; then
`{"prompts": [[ids], ...], "out_dir": "..."}` -> `{"files": [...], "tokens": [...], "seconds": ...}`.
"""

from __future__ import annotations

import os

from flashdraft.target.vllm_protocol import serve


class HiddenStateExtension:
    """Mixed into vLLM's worker class via `worker_extension_cls`; methods are called with collective_rpc."""

    def fd_install_hooks(self, layer_ids: list[int]) -> int:
        from flashdraft.target.capture import (  # torch + stdlib only: importable in the vLLM venv
            DECODER_PATHS,
            module_at,
        )

        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") else self.model_runner.model
        # vLLM keeps a multimodal target's text stack at language_model.model.layers (Qwen3.5/3.6).
        layers = next((x for x in (module_at(model, p) for p, _ in DECODER_PATHS) if x is not None and len(x)), None)
        if layers is None:
            raise RuntimeError(f"{type(model).__name__}: no decoder layers at any of {[p for p, _ in DECODER_PATHS]}")
        self._fd_ids = sorted(layer_ids)
        self._fd_buf = {i: [] for i in self._fd_ids}
        self._fd_handles = []
        for i in self._fd_ids:
            def hook(_module, _args, output, i=i):
                hidden, residual = output if isinstance(output, tuple) else (output, None)
                full = hidden if residual is None else hidden + residual
                self._fd_buf[i].append(full.detach().to("cpu", copy=True))
            self._fd_handles.append(layers[i].register_forward_hook(hook))
        return len(layers)

    def fd_reset(self) -> None:
        for v in self._fd_buf.values():
            v.clear()

    def fd_dump(self, path: str) -> int:
        """Write `features` [T, n, H] (layers in increasing id order) and return T."""
        import torch
        from safetensors.torch import save_file

        per_layer = [torch.cat(self._fd_buf[i], dim=0) for i in self._fd_ids]
        feats = torch.stack(per_layer, dim=1).contiguous()
        save_file({"features": feats}, path)
        self.fd_reset()
        return int(feats.shape[0])


def _engine(init: dict):
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    # init["target"]: model, tokenizer, the pinned revision, load_format=safetensors, trust_remote_code
    # (flashdraft.target.model.vllm_target_args)
    llm = LLM(**init["target"], dtype=init["dtype"], seed=0,
              tensor_parallel_size=1, max_model_len=init["max_model_len"], enable_prefix_caching=False,
              enable_chunked_prefill=False, max_num_batched_tokens=init["max_model_len"], enforce_eager=True,
              worker_extension_cls="flashdraft.components.extract.vllm_worker.HiddenStateExtension")
    llm.collective_rpc("fd_install_hooks", args=(init["layer_ids"],))
    return llm


def _extract(llm, request: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    files, tokens = [], []
    for k, ids in enumerate(request["prompts"]):
        llm.collective_rpc("fd_reset")
        llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)
        path = os.path.join(request["out_dir"], f"sample-{k:05d}.safetensors")
        tokens.append(llm.collective_rpc("fd_dump", args=(path,))[0])
        files.append(path)
    return {"files": files, "tokens": tokens}


def main() -> None:
    serve(_engine, _extract)


if __name__ == "__main__":
    main()
