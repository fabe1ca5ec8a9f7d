"""Policies behind one interface: transformers (CPU/GPU, KV cache, LoRA), vLLM, and non-LLM experts."""
