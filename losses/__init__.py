"""The maths: pure tensor functions. No state, no config objects, no logging.

Conventions: B = batch (sequences), T = target positions (sequence length - 1), mask is 1.0 on the
tokens that count (completion tokens) and 0.0 elsewhere. Losses return an unreduced per-token loss
[B, T] plus a dict of detached scalar metrics; `losses.common.aggregate` does every reduction.
"""
