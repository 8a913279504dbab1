"""The DFlash drafter: geometry, target weights, layers, model, drafting session, persistence, attention masks,
loss, anchor sampling, batches and the draft vocabulary."""
