"""Build a small Bradley-Terry reward model from a task's reference answers, for experiment=rm_vs_gold and
for tests: a self-contained stand-in until a run of algorithm=reward_model provides one.

Pairs: chosen = prompt + reference answer; rejected = prompt + a corrupted answer (a nearby wrong number
for numeric answers, an edited string otherwise, or random junk). The RM is a LlamaForSequenceClassification
(num_labels=1) with the project's character tokenizer, trained with loss = -log σ(r_chosen - r_rejected).
It is deliberately a weak proxy: it learns what right answers look like more than what they are, which
is what makes reward hacking visible next to the exact verifier (the gold).
"""
from __future__ import annotations

import json
import random
import string
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForSequenceClassification

from models.tokenizer import build_char_tokenizer
from tasks.base import Task


def corrupt(answer: str, rng: random.Random) -> str:
    """A wrong answer of the same kind as `answer` (never equal to it)."""
    for _ in range(100):
        kind = rng.random()
        if kind < 0.25:
            junk = string.ascii_letters + string.digits + "+-= "
            wrong = "".join(rng.choice(junk) for _ in range(rng.randint(0, 6)))
        elif answer.lstrip("-").isdigit():
            wrong = str(int(answer) + rng.choice([-1, 1]) * rng.randint(1, 20))
        else:
            i = rng.randrange(max(len(answer), 1))
            wrong = answer[:i] + rng.choice(string.ascii_lowercase) + answer[i + 1 :]
        if wrong != answer:
            return wrong
    return answer + "?"


def preference_pairs(task_examples, n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        ex = rng.choice(task_examples)
        pairs.append((ex.prompt + ex.answer, ex.prompt + corrupt(ex.answer, rng)))
    return pairs


def build_pairwise_rm(path: str, task: Task, steps: int, batch_size: int, lr: float, hidden_size: int,
                      num_layers: int, num_heads: int, intermediate_size: int, seed: int) -> dict:
    """Train the RM for `steps` steps, save model + tokenizer + rm_metrics.json (pair accuracy on the
    task's held-out examples) to `path`; return the metrics."""
    tok = build_char_tokenizer()
    tok.padding_side = "right"
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=512, num_labels=1,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        train = preference_pairs(task.train, steps * batch_size, seed)
        for step in range(steps):
            loss, _ = pair_loss(model, tok, train[step * batch_size : (step + 1) * batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        _, acc = pair_loss(model, tok, preference_pairs(task.heldout, 256, seed + 1))
    metrics = {"pair_accuracy_heldout": acc, "final_loss": loss.item(), "steps": steps}
    out = Path(path)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "rm_metrics.json").write_text(json.dumps(metrics, indent=2))
    print(f"[reward_model] trained {steps} steps: loss {loss.item():.3f}, "
          f"held-out pair accuracy {acc:.3f} → {out}")
    return metrics


def pair_loss(model, tok, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, float]:
    """(mean -log σ(r_c - r_r), fraction of pairs with r_c > r_r)."""
    enc = tok([c for c, _ in pairs] + [r for _, r in pairs], return_tensors="pt", padding=True)
    scores = model(**enc).logits[:, 0]
    margin = scores[: len(pairs)] - scores[len(pairs) :]
    return -F.logsigmoid(margin).mean(), float((margin > 0).float().mean())
