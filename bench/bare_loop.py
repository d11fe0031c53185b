"""The floor: the same math as a workload in bare PyTorch + transformers' model class, no framework.

    python bench/bare_loop.py --workload big_grpo_b0.04 --model-dir DIR --data-dir DIR --out r.json

What a competent hand-written loop does, on the same model folder and examples as the other sides
(bench/workloads/prepare.py), one optimizer step at a time:

  grpo  take the next 16 prompts, repeat each 8 times, left-pad; sample 64 new tokens with a KV cache
        (DynamicCache, logits of the last position only, softmax at temperature 1, multinomial, keep the
        sampled token's log-prob; stop when every row has produced eos); exact-match reward; group
        advantages (r - mean) / (std + 1e-6); with β > 0 one no-grad forward of the frozen reference;
        one forward of the policy (HF `logits_to_keep`: only the completion positions' logits), per-token
        PPO-clipped surrogate (ε = 0.2, old log-probs = the sampling ones) + β·k3, token mean over the
        batch's completion tokens, backward, clip the global grad norm to 1, AdamW step, scheduler step.
  dpo   the next 32 pairs, chosen and rejected concatenated into one right-padded batch of 64; summed
        completion log-probs of the policy and of the reference (a frozen copy, or a table computed once
        before the first step for `precomputed`); sigmoid DPO loss at β = 0.1; backward, clip, step.
  sft   the next 64 demonstrations; token-mean NLL of the completion tokens; backward, clip, step.

Learning rates, weight decay and schedules as bench/workloads/spec.py OPTIM (policyshift's defaults).
Writes the same JSON as the other sides: perf_counter at the end of every optimizer step.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.workloads.spec import (CLIP_EPS, DPO_BETA, MAX_GRAD_NORM, OPTIM, SEED, WORKLOADS,  # noqa: E402
                                  Workload, quick)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def schedule(kind: str, warmup: int, total: int):
    def constant(step):
        return min(1.0, step / warmup) if warmup else 1.0

    def cosine(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return {"constant_with_warmup": constant, "cosine": cosine}[kind]


def left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids, mask


@torch.no_grad()
def sample(model, ids, mask, new_tokens: int, eos: int, pad: int):
    """KV-cached multinomial sampling at temperature 1: tokens [B, N] (pad after eos), their log-probs
    [B, N] (0 after eos), completion mask [B, N] (1 up to and including the first eos)."""
    B = ids.shape[0]
    tokens = torch.full((B, new_tokens), pad, dtype=torch.long)
    logps = torch.zeros((B, new_tokens))
    done = torch.zeros(B, dtype=torch.bool)
    cache, positions, step_ids = DynamicCache(), (mask.cumsum(-1) - 1).clamp_min(0), ids
    for t in range(new_tokens):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()
        logp = logits.log_softmax(-1)
        token = torch.multinomial(logp.exp(), 1).squeeze(-1)
        logps[:, t] = logp.gather(-1, token[:, None]).squeeze(-1).masked_fill(done, 0.0)
        tokens[:, t] = token.masked_fill(done, pad)
        done |= token == eos
        if bool(done.all()):
            tokens, logps = tokens[:, : t + 1], logps[:, : t + 1]
            break
        step_ids = tokens[:, t: t + 1]
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
        positions = positions[:, -1:] + 1
    keep = torch.ones_like(tokens, dtype=torch.float32)
    ended = tokens == eos
    after = (ended.cumsum(-1) - ended.long()) > 0  # positions after the first eos
    keep[after] = 0.0
    return tokens, logps, keep


def completion_logprobs(model, ids, mask, n: int) -> torch.Tensor:
    """log p(ids[:, -n:]) per token [B, n] under `model` (logits of the last n+1 positions only)."""
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=n + 1).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -n:, None]).squeeze(-1)


def grpo_steps(w: Workload, model, tokenizer, data_dir: Path, opt, sched, ends: list, extra: dict):
    rows = read_jsonl(data_dir / "prompts.jsonl")
    random.Random(SEED).shuffle(rows)
    reference = None
    if w.beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(extra["model_dir"], dtype=torch.float32).eval()
        reference.requires_grad_(False)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    extra.update(generation=[], generated_tokens=[])
    for step in range(w.steps):
        batch = rows[step * w.batch: (step + 1) * w.batch]
        prompts = [tokenizer(r["prompt"])["input_ids"] for r in batch for _ in range(w.group)]
        answers = [r["answer"] for r in batch for _ in range(w.group)]
        ids, mask = left_pad(prompts, pad)
        start = time.perf_counter()
        model.eval()
        tokens, old_logps, keep = sample(model, ids, mask, w.max_new_tokens, eos, pad)
        model.train()
        extra["generation"].append(time.perf_counter() - start)
        extra["generated_tokens"].append(int(keep.sum()))
        texts = tokenizer.batch_decode(tokens.tolist(), skip_special_tokens=True)
        rewards = torch.tensor([1.0 if t.strip().split("\n", 1)[0].strip() == a else 0.0
                                for t, a in zip(texts, answers)]).view(-1, w.group)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=False, keepdim=True) + 1e-6)
               ).view(-1, 1)
        full_ids = torch.cat([ids, tokens], 1)
        full_mask = torch.cat([mask, keep.long()], 1)
        n = tokens.shape[1]
        if reference is not None:
            with torch.no_grad():
                ref_logps = completion_logprobs(reference, full_ids, full_mask, n)
        logps = completion_logprobs(model, full_ids, full_mask, n)
        ratio = torch.exp(logps - old_logps)
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv)
        if reference is not None:
            d = logps - ref_logps
            per_token = per_token + w.beta * (torch.exp(-d) - 1 + d)
        loss = (per_token * keep).sum() / keep.sum().clamp_min(1.0)
        optimizer_step(model, loss, opt, sched)
        ends.append(time.perf_counter())


def pair_batch(tokenizer, rows: list[dict]):
    """Chosen then rejected, right-padded: ids, attention mask, completion mask [2B, T]."""
    seqs, comp = [], []
    for key in ("chosen", "rejected"):
        for r in rows:
            p = tokenizer(r["prompt"])["input_ids"]
            c = tokenizer(r[key], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            seqs.append(p + c)
            comp.append([0] * len(p) + [1] * len(c))
    return right_pad(seqs, comp, tokenizer.pad_token_id)


def right_pad(seqs, comp, pad):
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    cmask = torch.zeros(ids.shape, dtype=torch.float32)
    for i, (s, c) in enumerate(zip(seqs, comp)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        cmask[i, : len(c)] = torch.tensor(c, dtype=torch.float32)
    return ids, mask, cmask


def shifted_logprobs(model, ids, mask) -> torch.Tensor:
    """log p(ids[:, t+1] | ids[:, :t+1]) [B, T-1]."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def dpo_steps(w: Workload, model, tokenizer, data_dir: Path, opt, sched, ends: list, extra: dict):
    rows = read_jsonl(data_dir / f"pairs_{w.steps * w.batch}.jsonl")
    random.Random(SEED).shuffle(rows)
    batches = [pair_batch(tokenizer, rows[k * w.batch: (k + 1) * w.batch]) for k in range(w.steps)]
    reference, table = None, None
    if w.precompute:  # once, before training: the reference is the initial policy
        start = time.perf_counter()
        model.eval()
        with torch.no_grad():
            table = [(shifted_logprobs(model, ids, m) * c[:, 1:]).sum(-1) for ids, m, c in batches]
        model.train()
        extra["precompute_s"] = time.perf_counter() - start
    else:
        reference = AutoModelForCausalLM.from_pretrained(extra["model_dir"], dtype=torch.float32).eval()
        reference.requires_grad_(False)
    for step, (ids, m, c) in enumerate(batches):
        logp = (shifted_logprobs(model, ids, m) * c[:, 1:]).sum(-1)
        if table is not None:
            ref = table[step]
        else:
            with torch.no_grad():
                ref = (shifted_logprobs(reference, ids, m) * c[:, 1:]).sum(-1)
        b = w.batch
        margin = (logp[:b] - ref[:b]) - (logp[b:] - ref[b:])
        loss = -F.logsigmoid(DPO_BETA * margin).mean()
        optimizer_step(model, loss, opt, sched)
        ends.append(time.perf_counter())


def sft_steps(w: Workload, model, tokenizer, data_dir: Path, opt, sched, ends: list, extra: dict):
    rows = read_jsonl(data_dir / f"demos_{w.steps * w.batch}.jsonl")
    random.Random(SEED).shuffle(rows)
    for step in range(w.steps):
        seqs, comp = [], []
        for r in rows[step * w.batch: (step + 1) * w.batch]:
            p = tokenizer(r["prompt"])["input_ids"]
            c = tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            seqs.append(p + c)
            comp.append([0] * len(p) + [1] * len(c))
        ids, m, cm = right_pad(seqs, comp, tokenizer.pad_token_id)
        logp = shifted_logprobs(model, ids, m)
        loss = -(logp * cm[:, 1:]).sum() / cm[:, 1:].sum()
        optimizer_step(model, loss, opt, sched)
        ends.append(time.perf_counter())


def optimizer_step(model, loss, opt, sched) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


STEPS = {"grpo": grpo_steps, "dpo": dpo_steps, "sft": sft_steps}


def run(w: Workload, model_dir: Path, data_dir: Path) -> dict:
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    o = OPTIM[w.algorithm]
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], weight_decay=o["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(o["schedule"], o["warmup_steps"], w.steps))
    ends: list[float] = []
    extra: dict = {"model_dir": str(model_dir)}
    STEPS[w.algorithm](w, model, tokenizer, data_dir, opt, sched, ends, extra)
    extra.pop("model_dir")
    return {"side": "bare", "ends": ends, "optimizer_steps": len(ends),
            "parameters": sum(p.numel() for p in model.parameters()),
            "torch_threads": torch.get_num_threads(), **extra}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=list(WORKLOADS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    w = quick(WORKLOADS[a.workload]) if a.quick else WORKLOADS[a.workload]
    a.out.write_text(json.dumps(run(w, a.model_dir, a.data_dir)))


if __name__ == "__main__":
    main()
