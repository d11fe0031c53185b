"""The model card (`README.md`) of a saved policy folder: what it was trained from, how, and how to redo it.

    write_model_card(folder, run_dir, stages, summary) -> folder / "README.md"

`folder` is a `save_pretrained` folder train.py wrote (`<run>/policy/`; with LoRA that is the adapter, and
`<run>/policy_merged/` the merged model when `model.lora.save_merged` is set); `stages` maps each stage's
name to its resolved config, in run order; `summary` is summary.json's {stage: metrics}. The card holds:

- a YAML header (`library_name`, `tags`, `base_model` when the model is a Hub id) for the Hub;
- the base model: `model.name_or_path`, or the embedded tiny model's sizes; LoRA's settings;
- the stages: algorithm, its main settings, data source, task, reward, optimizer steps;
- experience provenance, only from what summary.json holds (records generated, dropped and trained on,
  mean reuse, replay share, staleness at the last step): no number here is computed anew;
- the metrics table: the rows RunSummary.table (callbacks/summary.py) prints at the end of a run;
- the command that reproduces the run: `python train.py` + `<run>/.hydra/overrides.yaml`, with the
  changes later resumes allowed (`run.json`) listed.

A pure function of its arguments and the run's record files: it reads `.hydra/overrides.yaml`,
`run.json` and the folder's `config.json`/`adapter_config.json`, and writes README.md only.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

ALGORITHM_KEYS = ("group_size", "epochs_per_round", "beta", "tau", "clip_range", "vf_coef", "loss_agg_mode")
DATA_KEYS = ("source", "path", "replay_ratio", "max_staleness", "max_reuse", "harvest", "prompts_per_round",
             "batch_size", "max_examples")
TASK_KEYS = ("train_path", "heldout_path", "digits", "num_heldout")
TINY_KEYS = {"hidden_size": "hidden size", "num_layers": "layers", "num_heads": "attention heads",
             "intermediate_size": "intermediate size", "max_position_embeddings": "context",
             "dtype": "dtype", "seed": "init seed"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, not a local path


def write_model_card(folder: Path, run_dir: Path, stages: dict[str, DictConfig], summary: dict[str, dict]) -> Path:
    """Write `folder`/README.md for the policy saved there by the run in `run_dir`; returns its path."""
    folder, run_dir = Path(folder), Path(run_dir)
    path = folder / "README.md"
    path.write_text(model_card(folder, run_dir, stages, summary))
    return path


def model_card(folder: Path, run_dir: Path, stages: dict[str, DictConfig], summary: dict[str, dict]) -> str:
    """The card's markdown text (see the module docstring)."""
    folder, run_dir = Path(folder), Path(run_dir)
    first = next(iter(stages.values()), None)
    model = _node(first, "model") or {}
    kind = _kind(folder)
    parts = [_front_matter(model, kind, stages), _title(folder, run_dir, stages, kind),
             _base_model(model, folder), _stages(stages, summary), _provenance(stages, summary),
             _metrics(summary), _reproduce(run_dir)]
    return "\n\n".join(p.strip("\n") for p in parts if p) + "\n"


# ---- the sections -------------------------------------------------------------------------------
def _front_matter(model: dict, kind: str, stages: dict) -> str:
    meta: dict = {"library_name": "peft" if kind == "adapter" else "transformers"}
    name = model.get("name_or_path")
    if isinstance(name, str) and HUB_ID.match(name) and not Path(name).exists():
        meta["base_model"] = name
    algorithms = [str(_get(cfg, "algorithm.name")) for cfg in stages.values() if _get(cfg, "algorithm.name")]
    meta["tags"] = ["policyshift", *dict.fromkeys(algorithms)]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---"


def _title(folder: Path, run_dir: Path, stages: dict, kind: str) -> str:
    chain = " → ".join(name if name == _get(cfg, "algorithm.name") else f"{name} ({_get(cfg, 'algorithm.name')})"
                       for name, cfg in stages.items())
    what = {"adapter": f"the LoRA adapter of the final policy (load it with `peft`: "
                       f"`AutoPeftModelForCausalLM.from_pretrained(\"{folder}\")`)",
            "merged": "the final policy with its LoRA adapter merged into the base weights "
                      "(`AutoModelForCausalLM.from_pretrained`)",
            "full": "the final policy and its tokenizer (`AutoModelForCausalLM.from_pretrained`, "
                    "`AutoTokenizer.from_pretrained`)"}[kind]
    merged = folder.with_name(folder.name + "_merged")
    also = f" The merged model is in `{merged.name}/` beside it." if kind == "adapter" and merged.is_dir() else ""
    return (f"# policyshift policy: {run_dir.name}\n\n"
            f"Trained with policyshift in `{run_dir}`, stages {chain or '(none)'}. "
            f"This folder holds {what}.{also}")


def _base_model(model: dict, folder: Path) -> str:
    lines = ["## Base model", ""]
    target = str(model.get("_target_", ""))
    if model.get("name_or_path") not in (None, "???"):
        lines.append(f"- `{model['name_or_path']}` (`model={_short(target)}`, dtype {model.get('dtype', '?')})")
        if (Path(str(model["name_or_path"])) / "adapter_config.json").is_file():  # a LoRA run's policy/
            lines.append(f"- a LoRA adapter on its base model, loaded with `model.adapter="
                         f"{model.get('adapter', 'continue')}` (docs/real_models.md)")
    elif target.endswith("build_tiny"):
        sizes = ", ".join(f"{label} {model[k]}" for k, label in TINY_KEYS.items() if k in model)
        lines.append(f"- the embedded tiny Llama built in code (`{target}`, random initial weights, "
                     f"character tokenizer): {sizes}")
    else:
        lines.append(f"- `{target}`: " + _settings(model, [k for k in model if k not in ("_target_", "lora")]))
    lora = model.get("lora")
    if lora:
        lines.append(f"- LoRA adapter: {_settings(lora, list(lora))}")
    arch = _read_json(folder / "config.json").get("architectures")
    if arch:
        lines.append(f"- architecture: {', '.join(arch)}")
    return "\n".join(lines)


def _stages(stages: dict, summary: dict) -> str:
    rows = ["## Stages", "", "Each stage starts from the previous stage's final policy.", "",
            "| # | stage | algorithm | settings | data source | task | reward | optimizer steps |",
            "|---:|---|---|---|---|---|---|---:|"]
    for i, (name, cfg) in enumerate(stages.items(), 1):
        algo = _node(cfg, "algorithm") or {}
        settings = _settings(algo, ALGORITHM_KEYS)
        lr = _get(cfg, "algorithm.optimizer.lr")
        optimizer = _short(str(_get(cfg, "algorithm.optimizer._target_") or ""))
        if optimizer:
            settings = ", ".join(s for s in (f"{optimizer} lr={_value(lr)}", settings) if s)
        correction = algo.get("correction")
        if isinstance(correction, dict) and correction.get("_target_"):
            knobs = _settings(correction, [k for k in correction if not k.startswith("_")])
            settings += f", correction={_short(str(correction['_target_']))}" + (f"({knobs})" if knobs else "")
        steps = (summary.get(name) or {}).get("train/steps")
        rows.append(f"| {i} | {name} | {algo.get('name', '?')} | {settings or '-'} | {_data(cfg)} | "
                    f"{_task(cfg)} | {_reward(cfg)} | {_num(steps)} |")
    return "\n".join(rows)


def _provenance(stages: dict, summary: dict) -> str:
    columns = [("cost/records_generated", "records generated by the policy", True),
               ("cost/records_dropped", "dropped (unscored)", True),
               ("cost/records_filtered", "filtered (scored, in a tied group: dynamic sampling)", True),
               ("cost/records_used", "distinct records trained on", True),
               ("cost/mean_reuse", "mean reuse (serves per record)", False),
               ("rollout/replay_frac_mean", "replayed share of groups (mean over rounds)", False),
               ("train/staleness_mean", "staleness at the last step (mean, policy versions)", False)]
    rows = ["## Experience provenance", "",
            "Where each stage's training records came from, and the counts summary.json holds for them "
            "(- where the stage has none).", "",
            "| stage | records by source | " + " | ".join(label for _, label, _ in columns) + " |",
            "|---|---|" + "---:|" * len(columns)]
    for name, cfg in stages.items():
        metrics = summary.get(name) or {}
        numbers = [_num(metrics.get(k), count) for k, _, count in columns]
        rows.append(f"| {name} | {_sources(cfg)} | " + " | ".join(numbers) + " |")
    return "\n".join(rows)


def _metrics(summary: dict) -> str:
    """The rows RunSummary.table prints, formatted as it formats them."""
    from callbacks.summary import RunSummary

    table = RunSummary(Path("unused"), write=False)
    table.stages = dict(summary)
    columns = table.table().columns
    names = [c.header for c in columns[1:]]
    rows = ["## Metrics", "", "summary.json of the run (held-out greedy accuracy before and after each stage, "
            "rollout reward, cost, steps).", "",
            "| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    cells = [list(c.cells) for c in columns]
    for i, key in enumerate(cells[0]):
        values = [col[i] for col in cells[1:]]
        if any(v != "-" for v in values):
            rows.append(f"| `{key}` | " + " | ".join(values) + " |")
    return "\n".join(rows)


def _reproduce(run_dir: Path) -> str:
    overrides = _read_yaml(run_dir / ".hydra" / "overrides.yaml")
    lines = ["## Reproduce", ""]
    if overrides is None:
        return "\n".join(lines + ["The run's command line was not recorded (no `.hydra/overrides.yaml`)."])
    command = " ".join(["python", "train.py", *(shlex.quote(str(o)) for o in overrides)])
    lines += ["From the policyshift checkout that trained it (`.hydra/overrides.yaml` of the run):", "",
              "```bash", command, "```"]
    changes = [c for r in _read_json(run_dir / "run.json").get("resumes", []) for c in r.get("changes") or []]
    if changes:
        lines += ["", "The run was resumed with these values changed (`resume_allow_changes=true`, run.json):"]
        lines += [f"- `{c.get('key')}`: {c.get('was')} → {c.get('now')}" for c in changes]
    return "\n".join(lines)


# ---- reading configs ----------------------------------------------------------------------------
def _kind(folder: Path) -> str:
    if (folder / "adapter_config.json").is_file():
        return "adapter"
    return "merged" if folder.name.endswith("_merged") else "full"


def _get(cfg, key: str):
    if cfg is None:
        return None
    value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def _node(cfg, key: str) -> dict | None:
    """A config node as a plain dict (interpolations resolved where they resolve, else kept as text)."""
    value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False) if cfg is not None else None
    if not isinstance(value, DictConfig):
        return None
    try:
        return OmegaConf.to_container(value, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation outside this node: keep it unresolved
        return OmegaConf.to_container(value, resolve=False)


def _data(cfg) -> str:
    data = _node(cfg, "data") or {}
    settings = _settings(data, [k for k in DATA_KEYS if k != "source"])
    return f"`{_short(str(data.get('_target_', '?')))}`" + (f" ({settings})" if settings else "")


def _sources(cfg) -> str:
    """The provenance sources of a stage's records, from its data config (data_modules/experience.py)."""
    data = _node(cfg, "data") or {}
    target = str(data.get("_target_", ""))
    if "prompts_per_round" in data:
        out = ["policy_rollout (generated by this run's policy)"]
        if data.get("replay_ratio"):
            out.append("replayed from the buffer")
        if data.get("harvest"):
            out.append(f"harvested from `{data['harvest']}`")
        return " + ".join(out)
    if target.endswith("DemonstrationsDataModule"):
        return f"{data.get('source', 'teacher')} (demonstrations of the task)"
    if "path" in data:
        if data["path"]:
            return f"dataset (`{data['path']}`)"
        synthetic = str((data.get("synthetic") or {}).get("_target_", ""))
        return ("external_model (samples of a checkpoint)" if "checkpoint" in synthetic
                else f"synthetic pairs (`{_short(synthetic)}`)")
    return f"`{_short(target)}`"


def _task(cfg) -> str:
    task = _node(cfg, "task") or {}
    settings = _settings(task, TASK_KEYS)
    return f"`{_short(str(task.get('_target_', '?')))}`" + (f" ({settings})" if settings else "")


def _reward(cfg) -> str:
    reward = _node(cfg, "reward") or {}
    name = reward.get("name")
    return f"`{_short(str(reward.get('_target_', '?')))}`" + (f" ({name})" if name else "")


def _settings(node: dict, keys) -> str:
    return ", ".join(f"{k}={_value(node[k])}" for k in keys
                     if k in node and node[k] is not None and not isinstance(node[k], dict))


def _value(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _short(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def _num(v, count: bool = False) -> str:
    """A summary.json number as the card shows it ("-": absent); a count without decimals."""
    if v is None or isinstance(v, (list, dict)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "-"
        if count and v.is_integer():
            return f"{int(v):,}"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _read_yaml(path: Path):
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}
