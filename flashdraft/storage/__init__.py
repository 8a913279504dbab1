"""The object store, the key layout of a run inside it, and training checkpoints."""
