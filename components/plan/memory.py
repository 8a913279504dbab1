"""The planner's memory model: peak bytes per GPU of the trainer and the inference pool, from the config's shape.

Trainer (`trainer_memory`): the bytes live at each moment of one rank's step (forward's dense-mask build on CPU,
the loss, DFlash2's selector loss, the last layer's backward, the optimizer step), term by term: fp32 state, the
frozen head, per-layer saved activations by device (`Device`: CUDA bf16 autocast + FlexAttention, CPU fp32 + SDPA
with a dense mask), transients, communication buffers; the peak is the largest moment. Inference
(`inference_memory`): target weights, vLLM's KV cache and recurrent state, or extraction's prefill. What each term
counts, how it was measured and how it compares with the GPU: docs/planning.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flashdraft.perf.calibration import TrainShape
from flashdraft.perf.flops import drafted, muon_matrix_shapes

Device = Literal["cuda", "cpu"]
GiB = 2**30
WEIGHT_BYTES = {"bf16": 2, "fp8": 1}  # bytes a target parameter takes on the inference GPU (plan.target_precision)
LOSS_CHUNK_ELEMENTS = 2**26  # flashdraft/drafter/loss.py's CHUNK_ELEMENTS (a unit test keeps them equal)


@dataclass(frozen=True)
class MemoryEstimate:
    """A predicted peak: its parts in bytes (what a reader needs to pick a lever) and the phase that sets it."""

    parts: dict[str, int]
    peak_bytes: int
    phase: str
    loss_chunk_bytes: int = 0  # the fused loss's vocabulary chunk (a lever the gate names)

    def top(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.parts.items(), key=lambda kv: -kv[1])[:n]


@dataclass(frozen=True)
class Counts:
    """Parameter and position counts of a TrainShape."""

    params_layer: int   # one draft layer (DFlash2: with its attention_conv and mlp_conv)
    params_root: int    # fc and the norms: FSDP2's root module
    params: int         # all trainable parameters
    positions: int      # drafted positions a row: anchors x block
    keys: int           # context tokens + positions
    loss_rows: int      # slots 1..B-1 of every block
    params_selector: int = 0  # DFlash2's candidate_selector (codebooks + hidden projection): its own FSDP2 unit


def dflash2_params(s: TrainShape) -> dict[str, int]:
    """DFlash2's extra trainable parameters by part (flashdraft/drafter/dflash2.py `dflash2_extra_params`); {} for
    DFlash. Imported here, not at the top: the planner stays torch-free for DFlash configs."""
    if s.kind != "dflash2":
        return {}
    from flashdraft.drafter.dflash2 import dflash2_extra_params

    return dflash2_extra_params(hidden_size=s.hidden_size, num_layers=s.num_layers, vocab_size=s.vocab_size,
                                conv_kernel_size=s.conv_kernel_size, conv_group_size=s.conv_group_size,
                                selector_rank=s.selector_rank)


def counts(s: TrainShape) -> Counts:
    H, q, kv, inter = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    extra = dflash2_params(s)
    layer = H * q + 2 * H * kv + q * H + 3 * H * inter + 2 * H + 2 * s.head_dim + extra.get("conv", 0) // s.num_layers
    selector = extra.get("codebooks", 0) + extra.get("hidden_projection", 0)
    root = s.num_features * H * H + 2 * H
    positions, loss_rows = drafted(s)
    return Counts(layer, root, layer * s.num_layers + root + selector, positions, s.tokens_per_step + positions,
                  loss_rows, selector)


def muon_params(s: TrainShape) -> int:
    """Parameters Muon updates under training.optimizer=muon (flashdraft/perf/flops.py `muon_matrix_shapes`);
    0 under AdamW. The rest (norms, DFlash2's base kernels and codebooks) stay on AdamW."""
    return sum(a * b for a, b in muon_matrix_shapes(s))


def optimizer_state_parts(s: TrainShape) -> dict[str, int]:
    """The optimizer state one rank holds (sharded under FSDP2): AdamW's two fp32 moments a parameter, Muon's one
    fp32 momentum buffer."""
    P, muon, shard = counts(s).params, muon_params(s), _shard(s)
    parts = {"Muon momentum (fp32)": 4 * muon // shard} if muon else {}
    if P > muon:
        parts["AdamW moments (fp32)"] = 8 * (P - muon) // shard
    return parts


def optimizer_step_temporaries(s: TrainShape, device: Device) -> dict[str, int]:
    """Temporaries of the optimizer step. AdamW: CUDA's foreach keeps a state-sized list, a CPU step one tensor's
    worth at a time. Muon (one matrix at a time, no foreach): the largest matrix's fp32 Nesterov update, its
    Newton-Schulz iterate and the next, and two Gram matrices of its short side (bf16 on CUDA, fp32 on CPU); under
    FSDP2 also the whole fp32 weights, gradient and momentum of that matrix (components/train/optim.py
    `WholeMatrixMuon`)."""
    H, q, inter = s.hidden_size, s.num_heads * s.head_dim, s.intermediate_size
    P, muon, shard = counts(s).params, muon_params(s), _shard(s)
    matrices = [(H, inter), (H, q), (H, s.num_features * H)]
    out = {}
    if muon:
        a, b = max(muon_matrix_shapes(s), key=lambda m: m[0] * m[1])
        gathered = 3 * 4 * a * b if shard > 1 else 0
        ns = 2 if device == "cuda" else 4  # the Newton-Schulz element: torch's bf16, or fp32 on CPU
        out["Muon step temporaries"] = 4 * a * b + 2 * ns * a * b + 2 * ns * min(a, b) ** 2 + gathered
    biggest = H if muon else max(a * b for a, b in matrices)
    if s.kind == "dflash2":
        biggest = max(biggest, s.vocab_size * s.selector_rank)
    out["AdamW step temporaries"] = 4 * (P - muon) // shard if device == "cuda" else 2 * 4 * biggest
    return out


def _shard(s: TrainShape) -> int:
    return s.world_size if s.strategy == "fsdp2" else 1


def layer_saved_bytes(s: TrainShape, device: Device = "cuda") -> tuple[int, int, int]:
    """One draft layer's saved activations (docs/planning.md): (all of them, what the layer keeps under
    `activation_checkpointing`, what a checkpointed MLP drops). Bytes as autograd's saved-tensor hooks count them
    on the real layer."""
    g = counts(s)
    cuda = device == "cuda"
    a = 2 if cuda and s.autocast == "bfloat16" else 4          # bytes of an autocast-saved MLP activation
    H, M, K = s.hidden_size, g.positions, g.keys
    q, kvd, inter, nh = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size, s.num_heads
    # The per-layer saved tensors (docs/planning.md). Position part: x, the q_proj input, x after attention, a norm
    # product and the MLP input (fp32 on CPU; on CUDA the projection inputs are bf16 casts, one per consumer),
    # q before/after its norm, q with RoPE, the attention output (4 tensors of heads x head_dim), 4 MLP tensors.
    if cuda:  # bf16 autocast + FlexAttention
        # hidden: the layer input and x after attention (fp32), the two RMSNorm products (fp32), three bf16 casts
        # (q_proj, gate_proj, up_proj inputs); q: q_norm's fp32 upcast and product, the bf16 q flex reads, its
        # output and o_proj's copy of it (flex returns [heads, positions, dim]); MLP: four bf16 tensors.
        per_pos = 22 * H + 14 * q + 8 * inter + 8 * nh + 8
        # keys: the k_proj and v_proj bf16 casts of [context | block], k_norm's fp32 upcast and product, bf16 k, v
        per_key = 4 * H + 12 * kvd + 4 * s.num_kv_heads
        mask = 0
    else:  # fp32 + SDPA with the dense mask
        per_pos = 24 * H + 16 * q + 16 * inter + 8 * nh + 8
        per_key = 4 * H + 16 * kvd + 4 * s.num_kv_heads
        mask = 4 * M * K  # SDPA's float copy of the dense boolean mask, saved per layer
    if s.kind == "dflash2":
        # attention_conv and mlp_conv (dflash2.py BlockConv), drafted positions only, t taps reaching inside the
        # block: per conv, `prepare` keeps (base + delta) of every tap and the shifted input of every tap but the
        # first (fp32, beside the norm output the delta projection saves); `finish` the same over the sublayer's
        # output, in its dtype (bf16 under autocast); on CPU the conv output is one more fp32 tensor (the
        # sublayer's input; on CUDA its bf16 casts replace DFlash's casts of the norm output), on CUDA the delta
        # projection's bf16 cast of the norm output is one more. Both convs sit outside the checkpointed MLP.
        t = min(s.conv_kernel_size, s.block_size)
        per_pos += (2 * (2 * H + 8 * t * H + 4 * t * H)) if cuda else 2 * 4 * (4 * t * H)
    mlp_saved = (4 * H if cuda else 0) + 4 * a * inter  # gate/up input casts (CUDA) and the four MLP tensors
    full_layer = M * per_pos + K * per_key + mask
    if s.activation_checkpointing == "mlp":  # checkpoint(mlp, h): the MLP's fp32 input h is kept instead of its insides
        layer = full_layer - M * mlp_saved + (4 * M * H if cuda else 0)
    elif s.activation_checkpointing == "layer":  # checkpoint(layer): only the layer's fp32 input is kept
        layer = 4 * M * H
    else:
        layer = full_layer
    return full_layer, layer, mlp_saved


def selector_saved_bytes(s: TrainShape) -> tuple[int, int]:
    """DFlash2's selector loss (dflash2.py `selector_loss`, called by the trainer's `drafter_loss` outside autocast:
    fp32 slot states, the head in its own dtype) over every loss row: (bytes it saves for the backward, bytes of
    its temporaries beyond those at its peak). Saved-tensor hook counts, as for `layer_saved_bytes`."""
    g = counts(s)
    R, k, r, H = g.loss_rows, s.selector_top_k, s.selector_rank, s.hidden_size
    hb = 2 if s.head_dtype == "bfloat16" else 4
    # before the unary term: the row indices of the two slot-state gathers, the selected rows h (hidden_projection's
    # input, fp32) and the candidates (the successor gather's indices)
    pre = 8 * R + 8 * R + 4 * R * H + 8 * R * k
    gather = R * k * H * hb  # lm_head[cand] [rows, k, H]: the unary einsum's saved operand (unless detached)
    # after it: the predecessor gather's indices, the pairwise term's three [rows, rank] tensors and the successor
    # rows [rows, k, rank], the log-softmax [rows, k], the target ids, the row weights, two scalars
    post = 8 * R + 12 * R * r + 4 * R * k * r + 4 * R * k + 8 * R + 4 * R + 8
    saved = pre + (0 if s.selector_detach else gather) + post
    # temporaries: gold_topk's copy of the candidates and its hit mask; during the einsum the bf16 cast of h (a
    # bf16 head) and, detached, the gathered rows themselves, which die before the pairwise term's tensors exist
    during = (2 * R * H if hb == 2 else 0) + (gather if s.selector_detach else 0)
    return saved, 9 * R * k + max(during, post) - post


def resident_parts(s: TrainShape, device: Device = "cuda") -> tuple[dict[str, int], int, int]:
    """What one rank holds through every moment of its step: fp32 weights and optimizer state (sharded under FSDP2),
    the frozen embedding and head, CUDA's bf16 weight copies, (CPU) the samples the row was packed from, the
    activations outside the draft layers, and the communication buffers. Returns (the parts, the activations
    outside the layers, the communication bytes): the later moments free or add to those two."""
    g = counts(s)
    cuda = device == "cuda"
    hb = 2 if s.head_dtype == "bfloat16" else 4                  # frozen head/embedding dtype
    H, M, K, C, P, shard = s.hidden_size, g.positions, g.keys, s.tokens_per_step, g.params, _shard(s)
    V_rows = s.target_vocab_size or s.vocab_size
    parts: dict[str, int] = {}
    parts["weights (fp32)"] = 4 * P // shard
    parts.update(optimizer_state_parts(s))
    parts["frozen embedding + LM head"] = V_rows * H * hb * 2 + (s.vocab_size * H * hb if s.vocab_size < V_rows else 0)
    if cuda and s.autocast == "bfloat16":  # not the selector's: it runs after the autocast region
        parts["autocast bf16 weight copies"] = 2 * (P - g.params_selector)
    feat = s.num_features * H
    once = (2 * C * feat                 # the packed row's bf16 features
            + (2 if cuda else 4) * C * feat  # fc's saved input (bf16 autocast cast / fp32 copy)
            + 3 * C * H * (2 if cuda else 4)  # fc output, hidden_norm product, fused context
            + 2 * 4 * (M + K) * s.head_dim  # RoPE cos/sin for queries and keys
            + 2 * 4 * M * H)               # final norm's input and product
    if not cuda:  # on CPU the samples the row was packed from share the memory (on CUDA they stay on the host)
        parts["input samples (CPU host memory)"] = C * (2 * feat + 9)
    parts["activations: context, RoPE, final norm"] = once
    comm = 0
    if s.strategy == "fsdp2" and s.world_size > 1:
        comm = 2 * 4 * g.params_layer + 4 * g.params_root  # gathered layer + prefetched one, unsharded root
    elif s.strategy == "ddp" and s.world_size > 1:
        comm = 4 * P  # gradient buckets
    if comm:
        parts["communication buffers"] = comm
    return parts, once, comm


def dense_mask_build_bytes(s: TrainShape, device: Device = "cuda") -> int:
    """The last layer's dense mask built on CPU (dense_mask; CUDA's FlexAttention builds none): with a window, the
    [positions, positions] slot distance and its abs() in int64 beside the boolean context [positions, context]
    and block [positions, positions] masks, or the [positions, context] int64 distance; then the cat and SDPA's
    float copy."""
    if device == "cuda":
        return 0
    g = counts(s)
    M, K, C = g.positions, g.keys, s.tokens_per_step
    if s.sliding_window:
        return max(10 * M * C + M * M, M * C + 17 * M * M, 5 * M * K)
    return max(2 * M * C + 2 * M * M, 5 * M * K)


def trainer_memory(s: TrainShape, device: Device = "cuda") -> MemoryEstimate:
    """Peak bytes on one rank of the trainer for `s` (anchors_per_row must be set) on `device`: the largest of
    the step's moments, each the resident parts plus what that moment holds."""
    if s.anchors_per_row is None:
        raise ValueError("trainer_memory needs shape.anchors_per_row")
    g = counts(s)
    cuda = device == "cuda"
    a = 2 if cuda and s.autocast == "bfloat16" else 4          # bytes of an autocast-saved MLP activation
    H, L, M = s.hidden_size, s.num_layers, g.positions
    inter = s.intermediate_size
    P, shard = g.params, _shard(s)
    dflash2 = s.kind == "dflash2"
    common, once, comm = resident_parts(s, device)
    full_layer, layer, mlp_saved = layer_saved_bytes(s, device)
    recompute = s.activation_checkpointing

    # 1. The last layer's forward, its dense mask being built (CPU).
    at_mask = {**common, "activations: earlier draft layers": (L - 1) * layer,
               "dense mask build (CPU)": dense_mask_build_bytes(s, device)}
    # 2. The loss: every layer's activations held, the slot hidden states and their gradient, one vocabulary chunk
    #    (CPU: fp32 logits, in place; CUDA: the compiled chunk function's bf16 logits and bf16 gradient).
    chunk_rows = min(max(16, LOSS_CHUNK_ELEMENTS // s.vocab_size), g.loss_rows)
    loss_chunk = chunk_rows * s.vocab_size * 4
    held = {**common, "activations: draft layers": L * layer}
    if dflash2:  # the fused loss's top-k ids [rows, k] (int64), kept by the loss output through the backward
        held["loss: top-k candidate ids"] = 8 * g.loss_rows * s.selector_top_k
    at_loss = {**held, "loss: slot hidden + its gradient": 2 * 4 * g.loss_rows * H,
               "loss chunk (drafter/loss.py)": loss_chunk}
    # 3. The last layer's backward: the loss and the final norm are done with; a checkpointed part is recomputed
    #    (one MLP's insides, or the whole layer) and the first gradients arrive (an [positions, MLP] one net of
    #    what they free, two fp32 [positions, width] ones, the layer's weight gradients).
    first_grads = M * inter * a + 2 * 4 * M * H + 4 * g.params_layer
    recomputed = {"none": 0, "mlp": M * mlp_saved, "layer": full_layer}[recompute]
    at_backward = {**held, "activations: context, RoPE, final norm": once - 2 * 4 * M * H,
                   "backward: first gradients": first_grads}
    if recomputed:
        at_backward[f"backward: recomputed {recompute}"] = recomputed
    moments = [(at_mask, "forward: last layer's dense mask"), (at_loss, "loss"), (at_backward, "backward")]
    if dflash2:
        # 2b. The selector loss (after the fused loss, before the backward): its saved tensors and temporaries
        #     beside the slot states (the copy it was handed) and the fused loss's saved gradient; under FSDP2 the
        #     selector unit gathered whole.
        saved, temporaries = selector_saved_bytes(s)
        at_selector = {**held, "loss: slot hidden + its gradient": 2 * 4 * g.loss_rows * H,
                       "selector loss: saved for the backward": saved, "selector loss: temporaries": temporaries}
        if s.strategy == "fsdp2" and s.world_size > 1:
            at_selector["communication buffers"] = comm + 4 * g.params_selector
        moments.insert(2, (at_selector, "selector loss"))
        # the selector's backward ran first: its weight gradients are held (sharded once reduce-scattered), and the
        # last layer's backward starts in mlp_conv.finish (one more [positions, width] gradient, the MLP's dtype)
        at_backward["selector gradients (fp32)"] = 4 * g.params_selector // shard
        at_backward["backward: first gradients"] += a * M * H
    # 3. The optimizer step: gradients (sharded) + the optimizers' temporaries, activations gone.
    at_step = {k: v for k, v in common.items() if k != "activations: context, RoPE, final norm"}
    at_step.update({"gradients (fp32)": 4 * P // shard, **optimizer_step_temporaries(s, device)})
    moments.append((at_step, "optimizer step"))
    parts, phase = max(moments, key=lambda m: sum(m[0].values()))
    return MemoryEstimate(parts, int(sum(parts.values())), phase, loss_chunk)


@dataclass(frozen=True)
class InferenceShape:
    """What an inference GPU holds (from the config; `components/plan/planner.py` builds it)."""

    target_params: float
    hidden_size: int
    intermediate_size: int
    tensor_parallel: int
    kv_bytes_per_token: float      # all full-attention layers, bf16 K and V
    state_bytes_per_sequence: float  # all recurrent (Gated DeltaNet) layers: state + conv cache
    batch: int
    max_model_len: int
    prefill_tokens: int
    num_features: int
    vocab_size: int
    gpu_memory_utilization: float
    weight_bytes_per_param: float = 2  # bf16; an FP8 checkpoint 1 (its scales are negligible)


def inference_memory(s: InferenceShape) -> MemoryEstimate:
    """Peak of the inference pool: the larger of generation (vLLM) and extraction (HF prefill)."""
    weights = int(s.weight_bytes_per_param * s.target_params / s.tensor_parallel)
    kv = int(s.batch * s.max_model_len * s.kv_bytes_per_token / s.tensor_parallel)
    state = int(s.batch * s.state_bytes_per_sequence / s.tensor_parallel)
    # vLLM's forward workspace: one step of max(batch, 2048) tokens through the widest layer, and the logits.
    step_tokens = max(s.batch, 2048)
    workspace = int(step_tokens * (4 * s.hidden_size + 3 * s.intermediate_size) * 2 + s.batch * s.vocab_size * 4)
    generate = weights + kv + state + workspace
    T = s.prefill_tokens
    prefill = int(T * (4 * s.hidden_size + 3 * s.intermediate_size) * 2      # one layer's live activations
                  + T * s.num_features * s.hidden_size * 2 * 2               # captured features + their host copy
                  + T * s.kv_bytes_per_token)                                 # the forward's own KV
    extract = weights + prefill
    precision = "bf16" if s.weight_bytes_per_param == 2 else "fp8"
    parts = {f"target weights ({precision})": weights, "vLLM KV cache (batch x max_model_len)": kv,
             "vLLM recurrent state (batch)": state, "vLLM forward workspace": workspace,
             "extraction prefill (batch_tokens)": prefill}
    if generate >= extract:
        return MemoryEstimate(parts, generate, "generation (vLLM)")
    return MemoryEstimate(parts, extract, "extraction prefill")


def fmt_gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"
