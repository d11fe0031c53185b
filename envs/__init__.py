"""The `env` group: multi-turn environments and their tools (what answers a policy turn); docs/episodes.md."""
