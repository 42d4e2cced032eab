"""Transformers (GPT, Llama, MoE): blocks, attention, experts, pipeline schedules, memory."""
