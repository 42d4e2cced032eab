"""LLM inference: the forward of a batch mixing prefill and decode tokens over a KV cache."""
