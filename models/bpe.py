"""A byte-level BPE chat tokenizer trained in code (no hub download), shaped like Qwen2.5's: ChatML special
tokens, a ChatML chat template, and a turn-end token (`<|im_end|>`) that is NOT the tokenizer's eos.

Real chat models end a turn with a token other than `tokenizer.eos_token` (Qwen2.5's `<|im_end|>`, Llama-3's
`<|eot_id|>`, Gemma's `<end_of_turn>`) and list it in `generation_config.eos_token_id`; the character
tokenizer (models/tokenizer.py) has one end token only, so it cannot exercise that. This one can:

    <|endoftext|>  eos (as Qwen2.5 base)        <|im_start|>, <|im_end|>  ChatML turn markers
    <|pad|>        padding, never eos: padding must not look like the end of a sequence

The vocabulary (`BPE_VOCAB_SIZE` entries: the four special tokens, the 256 byte symbols, then merges)
is learnt by `tokenizers.trainers.BpeTrainer` from `corpus()` (arithmetic lines, a few English sentences,
ChatML role names). Deterministic: the same corpus always gives the same ids, so a saved model and a
rebuilt tokenizer agree.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, PAD]  # ids 0-3, in this order
BPE_VOCAB_SIZE = 500
# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer): words, single digits, punctuation runs,
# newlines. Normalisation and pre-tokenisation are exactly Qwen2Tokenizer's, because AutoTokenizer loads
# a saved qwen2-type folder as that class and rebuilds them from its own code: the same ids either way.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Qwen2.5's ChatML template without its default system message: <|im_start|>{role}\n{content}<|im_end|>\n
# per message, then <|im_start|>assistant\n when a reply is to be generated. Tool use as Qwen2.5-Instruct's
# template writes it: an assistant message's `tool_calls` follow its content, one
# `\n<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` each (a call may be wrapped in `function`,
# as OpenAI's format has it); a run of consecutive `tool` messages is ONE user turn of
# `\n<tool_response>\n{content}\n</tool_response>` blocks (so a rendering that ends inside the run closes a
# turn that a longer one keeps open: data_modules/conversations.py cuts turns at assistant messages only).
# With `tools=` (a list of JSON schemas), Qwen2.5-Instruct's system turn lists them and says how to call one
# (its default system sentence shortened; a first `system` message replaces it, as Qwen's does).
TOOLS_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}"
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, '"
    " + '\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
)
CHAT_TEMPLATE = TOOLS_SYSTEM + (
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call.get('function') is not none %}{%- set call = call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ENGLISH = [
    "You are a helpful assistant.",
    "What is the sum of these two numbers?",
    "Please add the numbers and reply with the result only.",
    "The answer is",
    "The quick brown fox jumps over the lazy dog.",
    "Think step by step, then give the final answer.",
    "Sure, here is the result.",
    "That is correct. Well done!",
    "I am not sure; let me check my work again.",
    "Adding the tens first and then the ones gives the total.",
    "Could you explain how you found this value?",
    "Write a short function that returns the largest item of a list.",
    "Every question has exactly one right answer, written as a number.",
    "Thank you for your question. I will try to help.",
    "Good morning! How can I help you today?",
    "The result should be an integer without any spaces.",
]


def corpus() -> list[str]:
    """The training text: `a+b=c` lines with a, b < 100 on a coarse grid (digits stay single tokens, as
    Qwen2's split makes them; `+=`-style punctuation runs merge), the English sentences and ChatML role
    lines, repeated so that their words merge."""
    arithmetic = [f"{a}+{b}={a + b}" for a in range(0, 100, 3) for b in range(0, 100, 7)]
    chat = [f"{role}\n{text}\n" for role in ("system", "user", "assistant") for text in ENGLISH]
    return arithmetic + ENGLISH * 20 + chat * 10


def build_bpe_tokenizer(vocab_size: int = BPE_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ChatML special tokens and chat template (module docstring).

    Any text encodes (unseen characters fall back to their UTF-8 bytes); no bos is added (as Qwen2.5);
    completions are encoded with add_special_tokens=False and the caller appends eos. Left padding for
    batched generation."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    core.train_from_iterator(corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=ENDOFTEXT, pad_token=PAD,
                                  extra_special_tokens=[IM_START, IM_END], chat_template=CHAT_TEMPLATE)
    tok.padding_side = "left"
    tok.model_max_length = 4096
    return tok


def chat_stop_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The ids a ChatML chat model stops at, turn end first (Qwen2.5-Instruct's generation_config
    `eos_token_id`): [<|im_end|>, <|endoftext|>]."""
    return [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
