"""The benchmark workloads, as plain data both sides read (no torch, no project import: the TRL side
imports this file from its own venv).

A workload is one algorithm on one model with one batch shape. Each side (policyshift through
train.py, TRL 1.16, the bare-PyTorch floor) turns it into its own settings:
bench/workloads/policyshift_side.py, bench/workloads/trl_side.py, bench/bare_loop.py.

Steps: a run makes `1 + warmup + measure` optimizer steps. Step 0 has no previous step end to measure
from, the next `warmup` steps are dropped (allocator, caches and the first rounds' shapes settle), and
the median is taken over the last `measure` steps.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

SEED = 1
TRL_LOGGING_STEPS = 1  # = policyshift's trainer.log_every_n_steps default: both log every optimizer step

# The models. "tiny" is the existing bench's (bench/bench_train.py MODEL; models/tiny.py with the
# character tokenizer, max_position_embeddings 64 as conf/model/tiny.yaml). "big" is compute-bound:
# Llama hidden 512, 8 layers, 8 heads, intermediate 1536, vocabulary 32,000 (the character tokenizer
# padded with <extra_i> tokens, models/tokenizer.py), tied embeddings: 43.7 M parameters.
MODELS = {
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 256,
             "max_position_embeddings": 64, "vocab_size": None, "seed": SEED},
    # the tiny model with room for long prompts (grpo_mixed_lengths: 16-256 tokens; grpo_long_prompt: a
    # 256-token system prompt) and the completion: the same weights' shapes, a longer rope table
    "tiny_long": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 256,
                  "max_position_embeddings": 512, "vocab_size": None, "seed": SEED},
    "big": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1536,
            "max_position_embeddings": 512, "vocab_size": 32_000, "seed": SEED},
}

# The learning rates, weight decay and schedules are policyshift's defaults (conf/algorithm/*.yaml,
# conf/scheduler/*.yaml); TRL is set to the same values.
OPTIM = {
    "grpo": {"lr": 3.0e-4, "weight_decay": 0.0, "schedule": "constant_with_warmup", "warmup_steps": 10},
    "dpo": {"lr": 1.0e-4, "weight_decay": 0.0, "schedule": "constant_with_warmup", "warmup_steps": 10},
    "sft": {"lr": 3.0e-3, "weight_decay": 0.1, "schedule": "cosine", "warmup_steps": 20},
}
MAX_GRAD_NORM = 1.0
CLIP_EPS = 0.2  # PPO ratio clip (conf/correction/ppo_clip.yaml clip_low = clip_high = 0.2)
DPO_BETA = 0.1


@dataclass(frozen=True)
class Workload:
    name: str
    algorithm: str          # grpo | dpo | sft
    model: str              # a key of MODELS
    batch: int              # grpo: prompts per step (× group completions); dpo: pairs; sft: demonstrations
    warmup: int
    measure: int
    beta: float = 0.0       # grpo: KL coefficient (0: no reference model)
    group: int = 8          # grpo: completions per prompt
    max_new_tokens: int = 8  # grpo
    precompute: bool = False  # dpo: reference log-probs computed once before training, no reference copy
    prompts: str = "prompts.jsonl"  # grpo: the prompt file (bench/workloads/prepare.py); "prompts_mixed.jsonl":
                                    # each arithmetic prompt behind a filler, MIXED_LENGTHS tokens in all
    prompt_prefix: int = 0  # grpo: characters of a fixed system prompt (SYSTEM_PROMPT) before every task prompt

    @property
    def steps(self) -> int:
        return 1 + self.warmup + self.measure

    @property
    def records_per_step(self) -> int:
        """Sequences per optimizer step: completions (grpo), pairs (dpo), demonstrations (sft)."""
        return self.batch * self.group if self.algorithm == "grpo" else self.batch

    @property
    def unit(self) -> str:
        return {"grpo": "gen tok/s", "dpo": "pairs/s", "sft": "examples/s"}[self.algorithm]

    def as_dict(self) -> dict:
        return asdict(self) | {"steps": self.steps, "records_per_step": self.records_per_step}


def _family(model: str, warmup: int, measure: int, grpo_tokens: int) -> list[Workload]:
    grpo = dict(algorithm="grpo", model=model, batch=16, group=8, max_new_tokens=grpo_tokens,
                warmup=warmup, measure=measure)
    return [
        Workload(f"{model}_grpo_b0.04", beta=0.04, **grpo),
        Workload(f"{model}_grpo_b0", beta=0.0, **grpo),
        Workload(f"{model}_dpo_ref", algorithm="dpo", model=model, batch=32, warmup=warmup, measure=measure),
        Workload(f"{model}_dpo_precomputed", algorithm="dpo", model=model, batch=32, precompute=True,
                 warmup=warmup, measure=measure),
        Workload(f"{model}_sft", algorithm="sft", model=model, batch=64, warmup=warmup, measure=measure),
    ]


# GRPO with prompts of mixed lengths (issue 35): each prompt 16-256 tokens (uniform, seeded), where padded
# micro-batches pay for the longest row and packed ones (model.packing) for the tokens they hold.
MIXED_LENGTHS = (16, 256)
MIXED = [Workload("grpo_mixed_lengths", algorithm="grpo", model="tiny_long", batch=16, group=8, max_new_tokens=8,
                  beta=0.04, warmup=3, measure=20, prompts="prompts_mixed.jsonl")]

# tiny: a step is tens of milliseconds, so step 0 + 3 warm-up steps are dropped and 20 measured; big: a
# GRPO step is tens of seconds (16 × 8 completions of 64 tokens through 43.7 M parameters), so only
# step 0 (which also holds the allocator's and caches' first use) is dropped and 3 are measured.
WORKLOADS = {w.name: w for w in _family("tiny", warmup=3, measure=20, grpo_tokens=8)
             + _family("big", warmup=0, measure=3, grpo_tokens=64) + MIXED}

SYSTEM_PROMPT = ("You are a careful calculator. Read the sum after this note, add the two numbers digit by digit "
                 "from the right, carry when a column reaches ten, and answer with the digits of the total only, "
                 "then stop. Do not explain, do not repeat the question, do not add spaces or signs. ")


def system_prompt(chars: int) -> str:
    """The synthetic system prompt of a long-prompt workload: SYSTEM_PROMPT repeated to exactly `chars`
    characters (one token each under the character tokenizer)."""
    return (SYSTEM_PROMPT * (chars // len(SYSTEM_PROMPT) + 1))[:chars]


# GRPO where the prompt dominates (issue 35): a 256-token system prompt before each 6-token sum, G = 8, 8 new
# tokens, β = 0.04 (a reference forward too); policyshift computes each group's prompt once (algorithm.shared_prefix).
WORKLOADS["grpo_long_prompt"] = Workload("grpo_long_prompt", algorithm="grpo", model="tiny_long", batch=16, group=8,
                                         max_new_tokens=8, beta=0.04, warmup=3, measure=10, prompt_prefix=256)

# The workloads that have a bare-PyTorch floor (bench/bare_loop.py): the compute-bound ones.
BARE = [name for name, w in WORKLOADS.items() if w.model == "big"]


def quick(w: Workload) -> Workload:
    """--quick: the plumbing only. One warm-up and two measured steps; the compute-bound GRPO runs
    2 prompts × 8 completions of 16 tokens (its figures mean nothing, it proves every side runs)."""
    w = replace(w, warmup=1, measure=2)
    if w.model == "big" and w.algorithm == "grpo":
        w = replace(w, batch=2, max_new_tokens=16)
    return w
