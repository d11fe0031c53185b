"""JSON lines the parser cannot take (issue 31, item 14): nesting deeper than Python's recursion limit
(a RecursionError inside json.loads) and an integer of more than 4,300 digits (a ValueError), in a task
file, a conversations file and a preference file. Each is one line naming the file and line, like
every other malformed row (tasks/jsonl.py: parse_json, the one reader of every JSON-lines file)."""
from __future__ import annotations

from tests.bad_inputs.case import Case
from tests.bad_inputs.setups import JSONL, chats, jsonl, pairs

C = Case
DEEP = "[" * 5000 + "]" * 5000  # ~5,000 levels: json.loads raises RecursionError
HUGE = "1" * 4400               # an integer of 4,400 digits: int() refuses over 4,300
DEEP_ERR = "not readable JSON (nested deeper than the parser's limit of about 1,000 levels)"
HUGE_ERR = "not readable JSON (an integer of more than 4,300 digits, Python's limit: write it as a string)"
CONV = ("algorithm=sft", "data=conversations", "data.path=DIR/c.jsonl")
PREF = ("algorithm=dpo", "data=static_preferences", "data.path=DIR/p.jsonl", "data.num_heldout=5")

CASES: list[Case] = [
    C("json-deep", "a task line nested 5,000 deep", JSONL + ("task.train_path=DIR/t.jsonl",),
      f"error: DIR/t.jsonl:3: {DEEP_ERR}",
      setup=jsonl("t.jsonl", ['{"prompt": "1+1=", "answer": "2", "meta": ' + DEEP + "}"])),
    C("json-huge-int", "a task line with a 4,400-digit integer", JSONL + ("task.train_path=DIR/t.jsonl",),
      f"error: DIR/t.jsonl:3: {HUGE_ERR}",
      setup=jsonl("t.jsonl", ['{"prompt": "1+1=", "answer": "2", "n": ' + HUGE + "}"])),
    C("conv-json-deep", "a chat line nested 5,000 deep", CONV,
      f"error: stage sft: data.path=DIR/c.jsonl: DIR/c.jsonl:3: {DEEP_ERR}",
      setup=chats("c.jsonl", ['{"messages": ' + DEEP + "}"])),
    C("conv-json-huge-int", "a chat line with a 4,400-digit integer", CONV,
      f"error: stage sft: data.path=DIR/c.jsonl: DIR/c.jsonl:3: {HUGE_ERR}",
      setup=chats("c.jsonl", ['{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", '
                              '"content": "2"}], "n": ' + HUGE + "}"])),
    C("pref-json-deep", "a preference line nested 5,000 deep", PREF,
      f"error: stage dpo: data.path=DIR/p.jsonl: DIR/p.jsonl:3: {DEEP_ERR}",
      setup=pairs("p.jsonl", ['{"prompt": "2+2=", "chosen": "4", "rejected": ' + DEEP + "}"])),
    C("pref-json-huge-int", "a preference line with a 4,400-digit integer", PREF,
      f"error: stage dpo: data.path=DIR/p.jsonl: DIR/p.jsonl:3: {HUGE_ERR}",
      setup=pairs("p.jsonl", ['{"prompt": "2+2=", "chosen": "4", "rejected": "5", "n": ' + HUGE + "}"])),
]
