"""The `task` group: prompts with reference answers (arithmetic, jsonl, code), read by data_modules/
(what is served) and rewards/ (what is scored against)."""
