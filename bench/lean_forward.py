"""models.lean_llama against Hugging Face's forward, on CPU.

For the tiny bench model (hidden 64, 2 layers, batch 128 × 14 tokens) and a 43.7M Llama (hidden 512,
8 layers, 8 heads, intermediate 1536, vocab 32000, tied head; batch 16 × 14 tokens) it prints:

- ms per training forward + backward of models.forward.sequence_token_logprobs (right-padded batch),
  through Hugging Face's decoder forward and through `lean_llama.train_hidden`;
- generation tokens/s of HFGenerator.sample (16 prompts × 8 samples, ignore_eos; tiny 8 new tokens,
  big 64): the former loop (as of commit 77fd762: torch.cat of the mask per token, log_softmax + exp +
  multinomial), today's HF loop (the fallback) and the lean decode with shared prompt prefill.

    OMP_NUM_THREADS=1 python bench/lean_forward.py [--only tiny|big]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from generators import hf as generation  # noqa: E402
from models import lean_llama  # noqa: E402
from models.forward import last_position_logits, sequence_token_logprobs  # noqa: E402
from models.tiny import build_tiny  # noqa: E402


@torch.no_grad()
def former_sample_tokens(model, input_ids, attention_mask, max_new_tokens, eos_id, pad_id, temperature=1.0,
                         top_p=1.0, greedy=False, ignore_eos=False):
    """The sampling loop before models.lean_llama (commit 77fd762), for the 'before' figure."""
    B = input_ids.shape[0]
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long)
    logps = torch.zeros((B, max_new_tokens))
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    cache, mask = DynamicCache(), attention_mask
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    step_ids = input_ids
    for t in range(max_new_tokens):
        logits = last_position_logits(model, step_ids, mask, positions, cache)
        logp = (logits / temperature).log_softmax(-1)
        token = torch.multinomial(logp.exp(), 1).squeeze(-1)
        logps[:, t] = logp.gather(-1, token.unsqueeze(-1)).squeeze(-1).masked_fill(done, 0.0)
        tokens[:, t] = token.masked_fill(done, pad_id)
        step_ids = tokens[:, t : t + 1]
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
        positions = positions[:, -1:] + 1
    return tokens, logps, lengths


def timed(fn, repeats: int, warmup: int = 2) -> float:
    """Median ms of `fn()`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def big_model():
    config = LlamaConfig(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=8, intermediate_size=1536, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def bench(name, model, vocab, batch, length, new_tokens, repeats):
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\n## {name} ({n_params:.1f}M parameters)")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, -4:] = 0  # some right padding
    model.train()
    real_supports = lean_llama.supports

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        sequence_token_logprobs(model, ids, mask, 1.0).sum().backward()

    lean_llama.supports = lambda d: False
    hf_ms = timed(fwd_bwd, repeats)
    lean_llama.supports = real_supports
    lean_ms = timed(fwd_bwd, repeats)
    print(f"train forward+backward, batch {batch} x {length}: HF {hf_ms:.1f} ms, lean {lean_ms:.1f} ms "
          f"({hf_ms / lean_ms:.2f}x)")

    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(6, 15, (16,), generator=g)]
    prompts = [p for p in prompts for _ in range(8)]
    gen = generation.HFGenerator(new_tokens, temperature=1.0, top_p=1.0, batch_size=512, ignore_eos=True)

    class Tok:
        pad_token_id, eos_token_id = 0, 2

    def tokens_per_s(gen_repeats: int) -> float:
        ms = timed(lambda: gen.sample(model, Tok, prompts), gen_repeats, warmup=1)
        return len(prompts) * new_tokens / (ms / 1000)

    current = generation.sample_tokens
    generation.sample_tokens = former_sample_tokens
    former = tokens_per_s(max(1, repeats // 4))
    generation.sample_tokens = current
    lean_llama.supports = lambda d: False
    hf = tokens_per_s(max(1, repeats // 4))
    lean_llama.supports = real_supports
    lean = tokens_per_s(max(1, repeats // 4))
    print(f"generation, 16 prompts x 8 samples, {new_tokens} new tokens: former loop {former:.0f} tok/s, "
          f"HF loop {hf:.0f} tok/s, lean decode {lean:.0f} tok/s ({lean / former:.2f}x former, "
          f"{lean / hf:.2f}x HF loop)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["tiny", "big"])
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    if args.only in (None, "tiny"):
        model, tok = build_tiny(64, 2, 4, 256, 64, 1)
        bench("tiny Llama (hidden 64, 2 layers)", model, len(tok), 128, 14, 8, repeats=20)
    if args.only in (None, "big"):
        bench("Llama 43.7M (hidden 512, 8 layers)", big_model(), 32000, 16, 14, 64, repeats=4)


if __name__ == "__main__":
    main()
