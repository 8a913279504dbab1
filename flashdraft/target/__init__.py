"""The target model: loading and geometry, its weights, hidden-state capture, chat, tokenizers."""
