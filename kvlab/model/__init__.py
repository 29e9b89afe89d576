"""The model (labs 00-01): load SmolLM2 offline, and kvlab's own forward pass over any cache.

loading     load_model: SmolLM2 from its wheel, local folders, tiny test models; chat_prompt
runner      ModelRunner: a Llama-family forward pass that reads and writes K/V through a
            kvlab.cache.KVCache and calls a kvlab.attention backend
custom_ops  CustomOpsRunner: the same forward pass, its norms, residual adds, SiLU-and-
            multiply and rotary embedding as three C calls (LLM(custom_ops=True); CPU
            only; the benchmarks' default where they build)
compiled    CompiledRunner: the same forward pass, its work between attention calls
            compiled by torch.compile (LLM(compile=True); CPU only, not faster on 2 cores)
greedy      greedy_generate: the simplest loop over a cache, a fixed batch (lab 01)
"""
