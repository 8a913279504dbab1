"""Stage: train the DFlash drafter (torchrun-aware, DDP or FSDP2, resumable checkpoints in the object store)."""
