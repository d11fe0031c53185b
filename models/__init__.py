"""Policy/tokenizer factories, the bounded-memory forward, the lean Llama-family passes, LoRA, value heads."""
