"""The `generator` group: engines that sample completions with their behaviour log-probs (base.py: the
seam's contract; hf.py: the KV-cached Hugging Face loop; vllm.py: the colocated vLLM engine)."""
