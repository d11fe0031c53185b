"""Bad inputs of generation engines in their own processes (generator=vllm_server, docs/scaling.md): refused at
plan time, before a model loads or an engine starts."""
from __future__ import annotations

from tests.bad_inputs.case import Case

C = Case
SERVER = ("algorithm=grpo", "experiment=single", "generator=vllm_server")

CASES: list[Case] = [
    C("vllm-server-no-engines", "generator=vllm_server with no engine to start and no address to reach",
      SERVER + ("generator.engines=0",),
      "error: stage grpo: generator.engines=0 with no generator.urls: nothing would generate; start engines "
      "(generator.engines=1) or give the servers' addresses (generator.urls=[http://host:8000])"),
    C("vllm-server-url-silent", "a server address where nothing answers",
      SERVER + ("generator.engines=0", "generator.urls=[http://127.0.0.1:9]"),
      "error: stage grpo: generator.urls[0]=http://127.0.0.1:9: no vLLM server there (did not answer /health "
      "within 5 s (ConnectError)); start one with `VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --logprobs-mode "
      "processed_logprobs --generation-config vllm` (docs/scaling.md)"),
]
