"""Policy/tokenizer factories and generation engines."""
