"""The DFlash drafter: model, attention mask, loss, anchor sampling and checkpoint I/O."""
