"""Megatron loss reductions: a pass-through one for prediction and a masked-token one for language models."""
