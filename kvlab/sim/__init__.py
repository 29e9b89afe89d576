"""Simulation at data-center scale (labs 03 and 07): request traces replayed with no model.

simulator   model-free replay of a trace against the real KV bookkeeping, and the
            PagedAttention paper's memory figures beside kvlab's (python -m kvlab.sim)
"""
