"""Bad inputs that ran silently or failed late (issue 31 item 15, issue 31 item 12): every node a run reads
has a schema (run/validation/schemas/; tests/run/test_schema_coverage.py keeps it so), and the checks across
keys that the schemas cannot make."""
from __future__ import annotations

from tests.bad_inputs.case import Case
from tests.bad_inputs.setups import ADAPTIVE, NO_GPU

C = Case
CALC, PY = ("env=calculator", "algorithm=grpo", "experiment=single"), ("env=chat_python", "algorithm=grpo", "experiment=single")

CASES: list[Case] = [
    C("calculator-max-digits-negative", "a calculator that refuses every result (max_digits < 0)",
      CALC + ("env.tools.calculator.max_digits=-5",),
      "error: stage grpo: env.tools.calculator.max_digits=-5 must be a positive integer"),
    C("calculator-max-exponent-word", "a calculator's exponent limit given a word", CALC + ("env.tools.calculator.max_exponent=abc",),
      "error: stage grpo: env.tools.calculator.max_exponent='abc' must be a positive integer"),
    C("python-tool-wall-zero", "the python tool's sandbox with a wall-clock limit of 0 (every call times out)",
      PY + ("env.tools.python.sandbox.wall_seconds=0",),
      "error: stage grpo: env.tools.python.sandbox.wall_seconds=0 must be a positive number"),
    C("python-tool-max-chars-negative", "the python tool keeping -1 printed characters", PY + ("env.tools.python.max_chars=-1",),
      "error: stage grpo: env.tools.python.max_chars=-1 must be a positive integer"),
    C("tool-tags-identical", "a tag format whose close tag is its open tag", CALC + ('env.format.close="<tool>"',),
      "error: stage grpo: env.format.close='<tool>' equals env.format.open: the policy's turn stops at the close tag, "
      "so a call's arguments could never be read; use distinct tags (<tool>, </tool>)"),
    C("tools-empty-mapping", "env.tools={} (merged into the tools: nothing changed)", CALC + ("env.tools={}",),
      "error: env.tools={}: {} is merged into `env.tools`, which keeps calculator: nothing changes; remove an entry "
      "with ~env.tools.calculator", when="command line"),
    C("tools-none-left", "every tool removed from a tool environment", CALC + ("~env.tools.calculator",),
      "error: stage grpo: env.tools={} must be a mapping of at least one tool name to its node ({_target_: ..., "
      "_partial_: true})"),
    C("adaptive-max-staleness-zero", "data=adaptive with max_staleness=0 (replay silently off)",
      ADAPTIVE + ("data.max_staleness=0",),
      "error: stage grpo: data.max_staleness=0 must be a positive integer, or null for no cap (0 would replay nothing)"),
    C("pass-threshold-above-one", "data=adaptive's pass threshold above every reward (nothing can pass)",
      ADAPTIVE + ("data.policy.pass_threshold=2",),
      "error: stage grpo: data.policy.pass_threshold=2 must be a number in (0, 1] (a reward at or above it passes; "
      "rewards are in [0, 1]), or null for non-binary rewards (mean/variance)"),
    C("scale-by-std-maybe", "a boolean given a word (was read as true)", ("algorithm=grpo", "algorithm.advantage.scale_by_std=maybe"),
      "error: stage grpo: algorithm.advantage.scale_by_std='maybe' must be true or false"),
    C("spin-beta-zero", "SPIN with β = 0 (a flat loss: nothing trains)", ("algorithm=spin", "algorithm.beta=0"),
      "error: stage spin: algorithm.beta=0 must be a positive number (β = 0 makes the loss flat: nothing trains)"),
    C("top-k-above-vocabulary", "a top_k above the model's vocabulary", ("algorithm=grpo", "generator.top_k=5000"),
      "error: stage grpo: generator.top_k=5000 is above the vocabulary of …"),
    C("chat-env-without-template", "a chat tool environment on a model without a chat template (failed after the "
      "stage started)", ("env=chat_calculator", "algorithm=grpo", "experiment=single"),
      "error: stage grpo: env._target_=envs.chat_tools.ChatToolEnv (env=chat_calculator, chat_python) needs a tokenizer "
      "with a chat template and model=tiny's character tokenizer has none: use model=hf with a chat model, or "
      "env=calculator (tool calls in tags)"),
    C("fp16-mixed-on-cpu", "fp16 mixed precision on a CPU (refused by Lightning after the model was built)",
      ("trainer.precision=16-mixed",),
      "error: stage sft: trainer.precision=16-mixed on a CPU: fp16 autocast with loss scaling runs on CUDA GPUs only "
      "(Lightning refuses it once the model is built); use trainer.precision=bf16-mixed (bf16 CPU autocast) or 32-true",
      patches=NO_GPU),
]
