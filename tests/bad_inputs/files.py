"""Bad data files and model folders."""
from __future__ import annotations

import json

from tests.bad_inputs.case import Case

HUB_CACHE = (("models.hub.cache_dir", lambda: __import__("pathlib").Path("$HF_HUB_CACHE")),)  # as a user reads it
from tests.bad_inputs.setups import (GOOD, HF, JSONL, adapter_of_a_hub_model, adapter_on_a_local_base, bigger_tokenizer, chats,
                                   drop, edit_config, jsonl, model_folder, pairs, sharded_with_a_missing_shard, text,
                                   truncated_weights, write_over)

C = Case
CONV = ("algorithm=sft", "data=conversations", "data.path=DIR/c.jsonl")
CONV_ERR = "error: stage sft: data.path=DIR/c.jsonl: "

CASES: list[Case] = [
    # ---- data files
    C("file-missing", "a task file that does not exist", JSONL + ("task.train_path=DIR/missing.jsonl",),
      "error: DIR/missing.jsonl: file not found"),
    C("bad-json", "a line that is not JSON", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: not valid JSON (Expecting value)", setup=jsonl("t.jsonl", ['{"prompt": "1+1=", "answer": '])),
    C("not-object", "a line that is not an object", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: expected a JSON object, got list", setup=jsonl("t.jsonl", ['["1+1=", "2"]'])),
    C("missing-field", "a line without a prompt", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: a row of no dataset format (columns ['answer']); task=jsonl takes prompt-only {prompt} "
      "or prompt-completion {prompt, completion} rows (see docs/datasets.md)", setup=jsonl("t.jsonl", ['{"answer": "2"}'])),
    C("chat-prompt-no-template", "a conversational prompt for a model without a chat template",
      JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: stage sft: DIR/t.jsonl:3 is a conversational row but model=tiny's character tokenizer has no chat template",
      setup=jsonl("t.jsonl", ['{"prompt": [{"role": "user", "content": "1+1="}], "completion": "2"}'])),
    C("empty-file", "a file of blank lines", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: no examples", setup=jsonl("t.jsonl", raw=b"\n  \n")),
    C("too-few-lines", "fewer lines than task.num_heldout", ("task=jsonl", "task.train_path=DIR/t.jsonl"),
      "error: DIR/t.jsonl: task.num_heldout=50 but only 30 lines", setup=jsonl("t.jsonl")),
    C("latin-1", "a Latin-1 file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl:3: not UTF-8 (byte 0xe9 at column 16): save the file as UTF-8",
      setup=text("t.jsonl", "\n".join(GOOD[:2] + ['{"prompt": "café=", "answer": "1"}'] + GOOD[2:]) + "\n", "latin-1")),
    C("utf-16", "a UTF-16 file", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: DIR/t.jsonl: UTF-16 (or UTF-32) text, not UTF-8: save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)",
      setup=text("t.jsonl", "\n".join(GOOD) + "\n", "utf-16")),
    C("huge-line", "a 2 MB prompt", JSONL + ("task.train_path=DIR/t.jsonl",),
      "error: stage sft: DIR/t.jsonl:3: the prompt + answer is 2,000,001 characters (over 1,040 tokens), more than "
      "the model's context of 64 tokens (model.max_position_embeddings)",
      setup=jsonl("t.jsonl", [json.dumps({"prompt": "1" * 2_000_000, "answer": "1"})])),
    C("prompt-too-long", "a prompt longer than the model's context", ("algorithm=grpo",) + JSONL
      + ("task.train_path=DIR/t.jsonl",),
      "error: stage grpo: DIR/t.jsonl:3: the prompt is 63 tokens + generator.max_new_tokens=8, more than the model's "
      "context of 64 tokens (model.max_position_embeddings)",
      setup=jsonl("t.jsonl", [json.dumps({"prompt": "1+" * 30 + "1=", "answer": "31"})])),
    C("answer-too-long", "a demonstration longer than the model's context", ("algorithm=sft",) + JSONL
      + ("task.train_path=DIR/t.jsonl",),
      "error: stage sft: DIR/t.jsonl:3: the prompt + answer is 74 tokens, more than the model's context of 64 tokens "
      "(model.max_position_embeddings)", setup=jsonl("t.jsonl", [json.dumps({"prompt": "1=", "answer": "9" * 70})])),
    C("no-room", "a token budget as large as the context", ("generator.max_new_tokens=64",),
      "error: stage sft: generator.max_new_tokens=64 leaves no room for a prompt in the model's context of 64 tokens "
      "(model.max_position_embeddings)"),
    C("chat-no-template", "task.chat=true with a tokenizer without a chat template",
      JSONL + ("task.train_path=DIR/t.jsonl", "task.chat=true"),
      "error: stage sft: task.chat=true but model=tiny's character tokenizer has no chat template",
      setup=jsonl("t.jsonl")),
    C("code-tests-malformed", "a code task line whose tests are malformed", ("task=code", "task.path=DIR/c.jsonl"),
      "error: DIR/c.jsonl:1: 'tests' must be a non-empty list of {args, expected}",
      setup=jsonl("c.jsonl", raw=(json.dumps({"prompt": "def f(x):", "answer": "  return x", "entry_point": "f",
                                               "tests": []}) + "\n").encode())),
    # ---- conversation files (data=conversations): read and rendered at plan time, before any model
    C("conv-bad-json", "a chat line that is not JSON", CONV, CONV_ERR + "DIR/c.jsonl:3: not valid JSON (Expecting value)",
      setup=chats("c.jsonl", ['{"messages": '])),
    C("conv-no-messages", "a chat row without messages", CONV,
      CONV_ERR + "DIR/c.jsonl:3: a prompt-only row; data=conversations takes language modeling {text} or {messages} or "
      "prompt-completion {prompt, completion} rows (see docs/datasets.md)",
      setup=chats("c.jsonl", ['{"prompt": "1+1="}'])),
    C("conv-no-content", "a chat message without content", CONV,
      CONV_ERR + "DIR/c.jsonl:3: message 1 (assistant) has no 'content' string",
      setup=chats("c.jsonl", ['{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant"}]}'])),
    C("conv-no-role", "a chat message without a role", CONV, CONV_ERR + "DIR/c.jsonl:3: message 0 has no 'role' string",
      setup=chats("c.jsonl", ['{"messages": [{"content": "1+1?"}, {"role": "assistant", "content": "2"}]}'])),
    C("conv-unknown-role", "a chat message with an unknown role", CONV,
      CONV_ERR + "DIR/c.jsonl:3: message 0 has unknown role 'human' (one of system, user, assistant, tool)",
      setup=chats("c.jsonl", ['{"messages": [{"role": "human", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}'])),
    C("conv-no-assistant", "a conversation without an assistant turn", CONV,
      CONV_ERR + "DIR/c.jsonl:3: no assistant message: nothing to train on",
      setup=chats("c.jsonl", ['{"messages": [{"role": "user", "content": "1+1?"}]}'])),
    C("conv-too-long", "a conversation longer than the model's context once rendered", CONV,
      CONV_ERR + "DIR/c.jsonl:3: the conversation is 84 tokens after rendering, more than the model's context of "
      "64 tokens (model.max_position_embeddings)",
      setup=chats("c.jsonl", [json.dumps({"messages": [{"role": "user", "content": "1+" * 30 + "1?"},
                                                       {"role": "assistant", "content": "31"}]})])),
    C("conv-no-format", "a row of no SFT format (a preference row) for data=conversations", CONV,
      CONV_ERR + "DIR/c.jsonl:3: a preference row; data=conversations takes language modeling {text} or {messages} or "
      "prompt-completion {prompt, completion} rows (see docs/datasets.md)",
      setup=chats("c.jsonl", ['{"prompt": "1+1=", "chosen": "2", "rejected": "3"}'])),
    C("conv-no-path", "data=conversations without data.path", ("algorithm=sft", "data=conversations"),
      "error: stage sft: data.path=None: data=conversations needs data.path: a .jsonl/.parquet file or a save_to_disk "
      "folder of {\"messages\": [...]}, {\"text\": ...} or {\"prompt\", \"completion\"} rows"),
    # ---- preference files: every stage's, read at plan time, before the first stage trains
    C("pref-second-stage-column", "a pair without `rejected` in the second stage's file",
      ("experiment=sft_then_dpo", "++data.path=DIR/p.jsonl"),
      "error: stage dpo: data.path=DIR/p.jsonl: DIR/p.jsonl:3: missing column(s) ['rejected'] of the paired form (the "
      "file's first row set the form); row has ['chosen', 'prompt']",
      setup=pairs("p.jsonl", ['{"prompt": "2+2=", "chosen": "4"}'])),
    C("pref-stage-override-file", "a stage's own override naming a file with an empty text",
      ("stages=[{name: sft, overrides: ['algorithm=sft', 'data=demonstrations']}, {name: dpo, overrides: "
       "['algorithm=dpo', 'data=static_preferences', 'data.path=DIR/p.jsonl']}]",),
      "error: stage dpo: data.path=DIR/p.jsonl: DIR/p.jsonl:3: 'chosen' is empty",
      setup=pairs("p.jsonl", ['{"prompt": "2+2=", "chosen": " ", "rejected": "5"}'])),
    C("pref-missing-file", "a preference file that does not exist, in the second stage",
      ("experiment=sft_then_dpo", "++data.path=DIR/none.jsonl"),
      "error: stage dpo: data.path=DIR/none.jsonl: DIR/none.jsonl: no such file or directory"),
    C("pref-label", "a KTO label that is not a boolean",
      ("algorithm=kto", "data=static_preferences", "data.path=DIR/u.jsonl", "data.num_heldout=1"),
      "error: stage kto: data.path=DIR/u.jsonl: DIR/u.jsonl:2: 'label' must be a boolean (true/false), got 'yes'",
      setup=jsonl("u.jsonl", raw=b'{"prompt": "1+1=", "completion": "2", "label": true}\n'
                                 b'{"prompt": "1+2=", "completion": "4", "label": "yes"}\n')),
    C("pref-unpaired-for-dpo", "unpaired rows for an algorithm that needs pairs",
      ("algorithm=dpo", "data=static_preferences", "data.path=DIR/u.jsonl", "data.num_heldout=0"),
      "error: stage dpo: data.path=DIR/u.jsonl: DIR/u.jsonl: holds unpaired rows (prompt, completion, label), which "
      "only algorithm=kto learns from; dpo, ipo and reward_model need prompt/chosen/rejected pairs",
      setup=jsonl("u.jsonl", raw=b'{"prompt": "1+1=", "completion": "2", "label": true}\n')),
    C("pref-num-heldout", "data.num_heldout as large as the preference file",
      ("algorithm=dpo", "data=static_preferences", "data.path=DIR/p.jsonl"),
      "error: stage dpo: data.path=DIR/p.jsonl: DIR/p.jsonl: data.num_heldout=200 but only 30 usable rows",
      setup=pairs("p.jsonl")),
    C("epochs-unknown-records", "epochs over pairs made only when the stage runs",
      ("algorithm=dpo", "data=checkpoint_preferences", "data.synthetic.checkpoint=DIR", "trainer.max_epochs=1"),
      "error: stage dpo: trainer.max_epochs=1: data=data_modules.static_preferences.StaticPreferencesDataModule "
      "does not know its training records before the stage runs, so epochs cannot set its length: give "
      "trainer.max_steps=N"),
    # ---- model folders
    C("model-missing", "a model folder that does not exist", HF + ("model.name_or_path=DIR/none",),
      "error: stage sft: model.name_or_path='DIR/none': no such local directory (nor a Hub id: owner/name)"),
    C("model-id-not-cached", "a Hub id that is not in the Hugging Face cache (offline)",
      HF + ("model.name_or_path=acme/absent-model",),
      "error: stage sft: model.name_or_path='acme/absent-model': no such local path, and the Hugging Face cache has "
      "no model 'acme/absent-model' (searched $HF_HUB_CACHE/models--acme--absent-model; HF_HUB_OFFLINE=1: nothing "
      "is downloaded): fetch it with `hf download acme/absent-model`, or let the run download it with "
      "HF_HUB_OFFLINE=0", patches=HUB_CACHE),
    C("no-tokenizer", "a model folder without tokenizer files", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json + merges.txt; the "
      "folder has config.json, generation_config.json, model.safetensors): save the tokenizer there too "
      "(tokenizer.save_pretrained)", setup=model_folder("m", tokenizer=False)),
    C("config-only", "a model folder with config.json only", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin; the "
      "folder has config.json)", setup=model_folder("m", drop("model.safetensors", "generation_config.json"), False)),
    C("no-config", "a model folder without config.json", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: no config.json (the folder has generation_config.json, model.safetensors, "
      "tokenizer.json, tokenizer_config.json): not a saved Hugging Face model (model.save_pretrained writes "
      "config.json and the weights)", setup=model_folder("m", drop("config.json"))),
    C("config-not-json", "a config.json that is not JSON", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/config.json: not valid JSON (Expecting property name enclosed in double quotes)",
      setup=model_folder("m", write_over("config.json", "{oops"))),
    C("truncated-weights", "truncated weights", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/model.safetensors: truncated (1,075 bytes, its header needs 4,075): copy or save the "
      "model again", setup=model_folder("m", truncated_weights)),
    C("missing-shard", "a sharded model with a shard missing", HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m: model.safetensors.index.json names 1 missing shard(s): "
      "model-00002-of-00002.safetensors", setup=model_folder("m", sharded_with_a_missing_shard)),
    C("adapter-hub-base", "a LoRA adapter folder whose base model is a Hub id not in the cache",
      HF + ("model.name_or_path=DIR/m",),
      "error: stage sft: DIR/m/adapter_config.json base_model_name_or_path='Qwen/Qwen2.5-0.5B': no such local path, "
      "and the Hugging Face cache has no model 'Qwen/Qwen2.5-0.5B' (searched $HF_HUB_CACHE/models--Qwen--Qwen2.5-0.5B; "
      "HF_HUB_OFFLINE=1: nothing is downloaded): fetch it with `hf download Qwen/Qwen2.5-0.5B`, or let "
      "the run download it with HF_HUB_OFFLINE=0", setup=model_folder("m", adapter_of_a_hub_model), patches=HUB_CACHE),
    C("adapter-continue-with-lora", "a second LoRA adapter on one that continues",
      HF + ("model.name_or_path=DIR/m", "model.lora={r: 4, target_modules: all-linear}"),
      "error: stage sft: model.lora with model.adapter=continue: DIR/m is a LoRA adapter, which this run keeps "
      "training (with its own settings); one adapter trains at a time: drop model.lora, or set model.adapter=merge "
      "(the adapter is merged into the base, then model.lora adds a fresh one)", setup=adapter_on_a_local_base),
    C("adapter-mode", "an unknown model.adapter", HF + ("model.name_or_path=DIR/m", "model.adapter=copy"),
      "error: stage sft: model.adapter='copy' must be one of continue, merge (how a LoRA run's policy/ given as "
      "model.name_or_path is loaded)", setup=model_folder("m")),
    C("vocab-exceeds-embedding", "a tokenizer larger than the embedding", HF + ("model.name_or_path=DIR/m",),
      "error: DIR/m: the tokenizer has 150 tokens but the model's embedding has 100 rows (config.json vocab_size): "
      "ids ≥ 100 index past it; use the tokenizer saved with these weights",
      setup=model_folder("m", bigger_tokenizer)),
    C("tokenizer-broken", "a tokenizer.json that is not JSON", HF + ("model.name_or_path=DIR/m",),
      "error: DIR/m: the tokenizer does not load (…", setup=model_folder("m", write_over("tokenizer.json", "{oops"))),
    C("weights-mismatch", "weights of another shape than config.json says",
      HF + ("model.name_or_path=DIR/m", "generator.max_new_tokens=8"),  # a 64-token context: not recipe=pretrained's 256
      "error: DIR/m: the weights do not load (RuntimeError: …", when="load",
      setup=model_folder("m", edit_config(intermediate_size=48))),
]
