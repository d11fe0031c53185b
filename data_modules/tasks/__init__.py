"""Prompt sources with reference answers (`task=...`)."""
