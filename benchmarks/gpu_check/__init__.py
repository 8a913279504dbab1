"""`make gpu-check`: the CUDA code paths on one real GPU, each compared with the CPU reference it must equal.

Runs from a copy of the repository on a machine with one CUDA GPU and PyTorch + transformers preinstalled (no
network, no pip); what that image lacks travels as wheels (`bootstrap`). The targets are seeded random models saved
as HF folders with a word-level tokenizer (`targets`). Sections, one table (`checks`), exit status 1 on any failure:

1. extract: the extract stage's prefill on CUDA in bf16 against CPU fp32, per captured layer;
2. train: the trainer's step on CUDA (FlexAttention, bf16) against CPU (dense SDPA, fp32), loss per step, and q4
   features decoded on the device against the host;
3. throughput: extraction and training tokens/s, the step's TFLOP/s (flashdraft/perf/flops.py) against the bf16 peak;
4. evaluate: speculative decoding with the trained drafter is lossless against greedy, and its tau;
5. production (on by default on CUDA; a toy-width dry run on CPU): the `qwen3.6-27b` preset's own drafter at its
   per-GPU row for each activation-checkpointing choice (step parts, TFLOP/s, peak memory; out of memory is a row),
   DFlash2's peaks, and extraction prefill through the full Qwen3.6-27B architecture; `--json` writes them as a
   calibration file (`calibration`) for `flashdraft plan --calibrate`;
6. codecs (with section 5): every feature codec decoded on the GPU, bit-identical to the CPU decode.

Modules: `bootstrap`, `checks`, `targets`, `sections` (1-4 and 6), `production` (5), `calibration`, `cli`. Run it
as `python3 benchmarks/gpu_check [--quick] [--json FILE]`. The CPU half (references, comparisons, table, exit
status, the production dry run) runs in CI: tests/unit/test_gpu_check.py.
"""
