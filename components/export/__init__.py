"""Stage: export a trained drafter for vLLM / SGLang (z-lab format) and speculators."""
