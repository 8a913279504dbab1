"""flashdraft: train DFlash speculative-decoding drafters with hidden states in object storage."""

__version__ = "0.1.0"
