"""Config sections of the drafter (shape and loss) and of its training (optimisation and launch)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from flashdraft.config.base import Section
from flashdraft.config.derived import default_gamma


class DrafterConfig(Section):
    """The DFlash drafter's shape and loss (train builds it; evaluate and export read its checkpoint)."""

    kind: Literal["dflash", "dflash2"] = Field(
        default="dflash", description="dflash: the DFlash drafter; dflash2: DFlash plus per-layer dynamic block "
                                      "convolutions around attention and MLP and a candidate selector that rescores "
                                      "the LM head's top-k pairwise (docs/dflash2.md). Exported as "
                                      "DFlashDraftModel / DFlash2DraftModel")
    num_layers: int = Field(default=5, ge=1, description="draft decoder layers (z-lab's Qwen3 drafters use 5; "
                            "more layers draft better and cost more per cycle)")
    block_size: int = Field(default=16, ge=2, description="tokens per draft block B: the anchor plus B-1 "
                            "predicted slots, so at most B-1 tokens are accepted per verify")
    gamma: float | None = Field(default=None, gt=0, description="loss decay of slot k: exp(-(k-1)/gamma); "
                                "default from block_size by the DFlash paper (7 for B=16, 5 for B=10, 4 for B=8)")
    max_anchors: int = Field(default=512, ge=1, description="blocks trained per sample: anchors drawn (seeded) "
                             "from the response positions; bounds a long sample's cost per step")
    mask_token_id: int | None = Field(
        default=None, description="token id fed in the predicted slots; default: the tokenizer's mask token, else "
        "the first free embedding row, else a trainable mask embedding (see export's warning about that case)")
    loss_weights: Literal["decay", "dpace"] = Field(
        default="decay", description="per-slot weights w of the CE: decay = exp(-(k-1)/gamma) (the DFlash paper); "
        "dpace = D-PACE (arXiv 2605.18810): per block, from the drafter's own confidence q = exp(-CE) of each slot "
        "(no gradient), w_j = sum over valid m >= j of the product over valid i <= m of (1-dpace_alpha) q_i + "
        "dpace_alpha (flashdraft/drafter/loss.py; measured in docs/training.md)")
    dpace_alpha: float = Field(default=0.5, gt=0, le=1, description="D-PACE's smoothing of the confidences "
                               "(loss_weights=dpace): q~ = (1-alpha) q + alpha; 1 = uniform continuation weights; "
                               "the paper's 0.5")
    loss_normalization: Literal["weights", "mask"] = Field(
        default="weights", description="weights: sum(w*ce)/sum(w), a weighted mean whose scale depends neither "
        "on gamma nor on D-PACE's confidence (SpecForge decay, Model-Optimizer D-PACE); mask: sum(w*ce)/valid "
        "slots (speculators)")
    head_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="dtype of the frozen LM head in the loss GEMMs (softmax/CE stay fp32); "
                                    "auto = bfloat16 on CUDA, float32 on CPU")
    init: Literal["random", "target", "pretrained"] = Field(
        default="random", description="random: seeded normal init; target: draft layers and final norm start as "
                                      "copies of target decoder layers (init_layers) and the target's final norm; "
                                      "pretrained: a published or earlier drafter (init_from), its geometry from "
                                      "its checkpoint (docs/training.md, Starting from a published drafter)")
    init_from: str | None = Field(
        default=None, description="drafter.init=pretrained: a local folder, hf:<repo>[@revision] (through the "
        "Hugging Face cache), or a store URI (a run's export/<format>/ or checkpoints/ or one checkpoint); "
        "z-lab (DFlashDraftModel / DFlash2DraftModel), speculators (speculators_model_type dflash) or "
        "flashdraft's own drafter folder")
    mask_init: Literal["mean", "zero"] = Field(
        default="mean", description="start of the trainable mask embedding (targets with no free vocabulary row, "
                                    "e.g. SmolLM2): the mean target embedding, or zero. The mean is a large vector "
                                    "shared by most tokens (SmolLM2: norm 2.2 of a 3.2 row norm), so every mask "
                                    "slot starts predicting the same frequent tokens; zero starts each slot from "
                                    "what attention brings in (first loss ~15 nats instead of ~65)")
    init_layers: list[int] | None = Field(
        default=None, description="target decoder layers (0-based) copied into draft layers 0..n-1 when "
                                  "init=target; default: the last num_layers layers of the target")
    draft_vocab_size: int | None = Field(
        default=None, ge=1, description="reduced draft vocabulary: score only the K most frequent response tokens "
                                        "of the training data (exported as d2t for vLLM); None = the full vocab")
    hidden_size: int | None = Field(
        default=None, ge=1, description="drafter width; must equal the target's hidden size (the drafter reads "
                                        "the target's frozen embedding and LM head), so it only states it")
    num_heads: int | None = Field(default=None, ge=1, description="attention heads; default: the target's")
    num_kv_heads: int | None = Field(
        default=None, ge=1, description="key/value heads (GQA), must divide num_heads; default: the target's")
    head_dim: int | None = Field(default=None, ge=2, description="per-head width (even: RoPE); default: target's")
    intermediate_size: int | None = Field(default=None, ge=1, description="MLP width; default: the target's")
    layer_types: list[Literal["full_attention", "sliding_attention"]] | None = Field(
        default=None, description="per draft layer; default: all sliding_attention when sliding_window is set, "
                                  "else all full_attention. vLLM runs mixed sliding/full drafters only on its V2 "
                                  "model runner")
    sliding_window: int | None = Field(
        default=None, ge=1, description="window W of sliding_attention layers: a block query at position p sees "
                                        "context keys at positions > p - W (vLLM's per-layer window)")

    conv_kernel_size: int = Field(
        default=2, ge=1, description="dflash2: taps of the causal in-block convolutions (vLLM "
                                     "dflash_config.conv_kernel_size; z-lab's fixture uses 2)")
    conv_group_size: int = Field(
        default=64, ge=1, description="dflash2: channels sharing one per-token kernel delta (must divide the "
                                      "width; vLLM dflash_config.conv_group_size)")
    selector_rank: int = Field(
        default=256, ge=1, description="dflash2: rank of the predecessor/successor codebooks (vocab x rank each: "
                                       "2 x 248320 x 256 = 127M parameters on Qwen3.6)")
    selector_top_k: int = Field(
        default=16, ge=2, description="dflash2: LM-head candidates per draft slot that the selector rescores")
    selector_objective: Literal["gold_topk", "strict_topk"] = Field(
        default="gold_topk", description="dflash2 selector loss (docs/dflash2.md; neither is published with "
                                         "DFlash2): gold_topk (speculators' reconstruction) puts the gold token in "
                                         "place of the k-th candidate when the top-k misses it and trains every "
                                         "slot; strict_topk (SpecForge's) trains only slots whose gold token is in "
                                         "the top-k, with the weight held at 0 for selector_warmup then ramped")
    selector_weight: float = Field(default=1.0, ge=0, description="dflash2: weight of the selector loss "
                                                                     "(added to the DFlash loss)")
    selector_warmup: float = Field(
        default=0.0, ge=0, lt=1, description="dflash2: fraction of the optimizer steps with selector weight 0")
    selector_ramp: float = Field(
        default=0.0, ge=0, lt=1, description="dflash2: fraction of the steps (after the warmup) over which the "
                                             "selector weight rises linearly to selector_weight")
    selector_detach: bool = Field(
        default=False, description="dflash2: stop the selector loss's gradient at the drafter's hidden states and "
                                   "unary logits (only the selector's own weights learn from it)")

    @model_validator(mode="after")
    def _pretrained(self) -> DrafterConfig:
        if self.init == "pretrained" and not self.init_from:
            raise ValueError("drafter.init=pretrained needs drafter.init_from (a folder, hf:<repo>[@revision] or a "
                             "store URI)")
        if self.init_from and self.init != "pretrained":
            raise ValueError(f"drafter.init_from is set but drafter.init={self.init!r}: set drafter.init=pretrained "
                             "or unset drafter.init_from")
        return self

    @model_validator(mode="after")
    def _dflash2(self) -> DrafterConfig:
        if self.kind == "dflash2" and self.draft_vocab_size is not None:
            raise ValueError("drafter.kind=dflash2 needs the full vocabulary (its codebooks and vLLM's candidate "
                             "ids are target ids): unset drafter.draft_vocab_size")
        if self.kind == "dflash2" and self.selector_top_k > 1024:
            raise ValueError(f"drafter.selector_top_k={self.selector_top_k}: at most 1024")
        return self

    @model_validator(mode="after")
    def _attention_layout(self) -> DrafterConfig:
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"drafter.layer_types has {len(self.layer_types)} entries, num_layers is "
                                 f"{self.num_layers}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("drafter.layer_types has sliding_attention layers: set drafter.sliding_window")
        if self.num_heads is not None and self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"drafter.num_kv_heads={self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(f"drafter.head_dim={self.head_dim} must be even (rotary embedding)")
        return self

    def resolved_layer_types(self) -> list[str]:
        if self.layer_types is not None:
            return list(self.layer_types)
        return ["sliding_attention" if self.sliding_window is not None else "full_attention"] * self.num_layers

    def geometry_overrides(self) -> dict[str, Any]:
        """The drafter-shape fields set here (the rest follow the target), as `geometry_from_hf` keywords."""
        shape = {k: getattr(self, k) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                               "intermediate_size") if getattr(self, k) is not None}
        return {**shape, "layer_types": self.resolved_layer_types(), "sliding_window": self.sliding_window}

    def resolved_init_layers(self, target_layers: int) -> list[int]:
        ids = self.init_layers if self.init_layers is not None else list(
            range(target_layers - self.num_layers, target_layers))
        if len(ids) != self.num_layers or not all(0 <= i < target_layers for i in ids):
            raise ValueError(f"drafter.init_layers={ids}: need {self.num_layers} ids in 0..{target_layers - 1}")
        return list(ids)

    @property
    def resolved_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)


class TrainingConfig(Section):
    """The train stage's optimisation and launch settings (plan reads epochs and the launch shape for its time
    estimate). num_threads is the one field here that governs other stages too: see its description."""

    epochs: int = Field(default=6, ge=1, description="passes over the training features (offline mode); the "
                        "DFlash paper trains 6")
    max_steps: int | None = Field(default=None, ge=0, description="stop after this many optimizer steps (the "
                                  "schedule is sized to it); None = epochs over the data; 0 (with "
                                  "drafter.init=pretrained) = evaluate only: no generate, extract or train task")
    lr: float = Field(default=6e-4, gt=0, description="peak learning rate (the DFlash paper's AdamW 6e-4); Muon's "
                      "is lr x muon_lr_scale")
    optimizer: Literal["adamw", "muon"] = Field(
        default="adamw", description="adamw: AdamW on every trainable parameter; muon: torch.optim.Muon (momentum "
        "0.95, Nesterov, 5 Newton-Schulz steps, adjust_lr_fn match_rms_adamw) on the drafter's trainable 2-D "
        "hidden matrices (the weights of its Linear layers: fc, attention, MLP, DFlash2's kernel and selector "
        "projections) and AdamW on the rest (norms, the mask embedding, DFlash2's codebooks and base kernels) "
        "(components/train/optim.py)")
    muon_lr_scale: float = Field(
        default=1.0, gt=0, description="optimizer=muon: Muon's peak lr = lr x this. match_rms_adamw scales each "
        "matrix's orthogonalised update to AdamW's update RMS (0.2 sqrt(max(rows, cols))), so 1 reuses the AdamW "
        "lr (Moonshot's rule); speculators runs 10 at lr 1e-4")
    schedule: Literal["cosine", "constant"] = Field(default="cosine", description="learning-rate shape after "
                                                    "warmup: cosine decay to 0, or constant")
    warmup_ratio: float = Field(default=0.04, ge=0, lt=1, description="share of the steps spent in linear warmup")
    weight_decay: float = Field(default=0.0, ge=0, description="decoupled weight decay (AdamW and Muon alike)")
    grad_clip: float = Field(default=1.0, gt=0, description="clip the global gradient norm to this")
    tokens_per_step: int = Field(default=65536, ge=16, description="token budget per micro-batch and rank")
    grad_accum: int = Field(default=1, ge=1, description="micro-batches accumulated per optimizer step")
    nproc_per_node: int = Field(default=1, ge=1, description="training processes (GPUs) per node; > 1 launches "
                                "torchrun")
    num_nodes: int = Field(default=1, ge=1, description="training nodes; > 1 compiles a Kubeflow TrainJob "
                           "instead of a single pod (a different DAG: recompile after changing it)")
    strategy: Literal["ddp", "fsdp2"] = Field(default="ddp", description="data-parallel strategy across ranks: "
                                              "ddp replicates the drafter; fsdp2 shards its parameters and state")
    activation_checkpointing: Literal["none", "mlp", "layer"] = Field(
        default="none",
        description="recompute activations in the backward instead of keeping them (training memory vs time): "
                    "'mlp' keeps only each MLP's input and recomputes its gate/up projections (its four "
                    "[drafted positions x intermediate_size] tensors are the largest a layer holds); 'layer' keeps "
                    "only each draft layer's input (one extra forward of the layers; the LM head and loss are not "
                    "recomputed). Measured by `make gpu-check` at the production shape")
    feature_decode: Literal["auto", "reader", "device"] = Field(
        default="auto", description="where stored features are decoded: 'reader' = on the host by the reader's "
        "threads; 'device' = codecs that decode on a device (q4) reach the trainer still encoded and are decoded "
        "on its device, so only the 4-bit bytes cross the host and PCIe; 'auto' = 'device' when training on a "
        "GPU, else 'reader'. Either way the same bits (the result does not depend on it)")
    checkpoint_every: int = Field(default=500, ge=1, description="optimizer steps between checkpoints")
    preempt_after: int | None = Field(
        default=None, ge=1, description="rehearsal of a preemption: the train task's first launch of its ranks "
        "ends after this many optimizer steps without a final checkpoint, as a preempted pod would, and a second "
        "launch resumes from the last checkpoint (components/train/launch.py `launch_training`). A multiple of "
        "checkpoint_every; single-node only; None (production) = one launch")
    heldout_samples: int = Field(
        default=0, ge=0, description="extracted samples held out of training for the held-out curve "
                                     "(components/train/heldout.py; offline mode); 0 = no curve")
    heldout_every: int = Field(default=100, ge=1, description="optimizer steps between held-out evaluations "
                                                              "(also before the first step and after the last)")
    seed: int = Field(default=0, description="seed of the drafter's init, anchor draws and the feature reader's "
                      "shuffle (evaluate's untrained baseline uses it too)")
    num_threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads of each trainer rank, and the budget of every CPU stage, "
        "not only train: generate, extract and evaluate (one process) pin their pool to num_threads x nproc_per_node, "
        "the whole node's (streaming run-local splits it between the producers and the trainer). One machine-wide "
        "budget on purpose: the CPU stages of a local run share one machine, and an oversubscribed OpenMP pool "
        "runs several times slower. None = torch's default (all cores). GPU tasks ignore it")

    @model_validator(mode="after")
    def _preempt_after_a_checkpoint(self) -> TrainingConfig:
        if self.preempt_after is not None:
            if self.preempt_after % self.checkpoint_every:
                raise ValueError(f"training.preempt_after={self.preempt_after} must be a multiple of "
                                 f"training.checkpoint_every={self.checkpoint_every} (the resume starts from a "
                                 "checkpoint)")
            if self.num_nodes > 1:
                raise ValueError("training.preempt_after is single-node only (num_nodes > 1 launches a TrainJob, "
                                 "whose pods Kubernetes restarts)")
        return self

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.num_nodes
