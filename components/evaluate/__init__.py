"""Stage 5: speculative evaluation of the trained drafter (tau, acceptance, speed, lossless check)."""
