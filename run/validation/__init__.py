"""Checks on every stage's config before anything heavy is built, one module per kind: config.py (the
entry point, `validate`, and the checks across keys), values.py (single values), hardware.py (the
hardware group and ranks), data.py (the task's data against the model and reward), moved.py (old paths)."""
