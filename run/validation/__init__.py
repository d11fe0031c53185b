"""Checks on every stage's config before anything heavy is built, one module per kind: config.py (the
entry point, `validate`, and the checks across keys), schemas/ (the typed schema of every config group:
types, ranges, choices, unknown keys), values.py (what a schema cannot say alone), hardware.py (the
hardware group and ranks), model.py (LoRA on the model's skeleton, precision, shapes), dry_build.py (the
buffer, the store), data.py and folders.py (the task's data and the model folder against the model and
reward), moved.py (old paths)."""
