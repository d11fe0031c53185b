"""The W&B run of a job (callbacks/wandb_run.py), read back from W&B's offline files.

An offline run writes one `run-<id>.wandb` file: W&B's record log (a LevelDB-style log of 32 KiB
blocks holding `wandb_internal_pb2.Record` protobufs). wandb 0.31 ships no reader for it and writes no
config.yaml / wandb-summary.json offline, so `read_run` below decodes it (a few lines)."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

from callbacks.wandb_run import StageWandbLogger, earlier_steps, sample_rows
from data_modules.experience import ExperienceRecord, Provenance
from tests.test_train_e2e import SMALL, train

BLOCK, HEADER = 32768, 7  # W&B's log: a 7-byte file header (":W&B", magic, version); records in blocks


def wandb_records(path: Path) -> list:
    """Every Record of an offline run's .wandb file (chunks: crc32, length, type 1 full / 2-4 split)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, chunks, out = path.read_bytes(), HEADER, b"", []
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def read_run(run_dir: Path) -> dict:
    """{history: [row, ...], config: {...}, summary: {...}, metrics: [define_metric, ...], files} of the
    one offline W&B run under `run_dir`/wandb."""
    (offline,) = sorted((run_dir / "wandb").glob("offline-run-*"))
    (log,) = offline.glob("run-*.wandb")
    run = {"history": [], "config": {}, "summary": {}, "metrics": [], "files": offline / "files"}

    def key(item):
        return item.key or "/".join(item.nested_key)

    for r in wandb_records(log):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            run["history"].append({key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind in ("config", "summary"):
            run[kind] |= {key(u): json.loads(u.value_json) for u in getattr(r, kind).update}
        elif kind == "metric":
            run["metrics"].append((r.metric.name or r.metric.glob_name, r.metric.step_metric))
    return run


def test_two_stage_run_tells_the_whole_story(tmp_path):
    """python train.py (SFT 4 steps → GRPO 4 rounds) with W&B offline and the progress bar on."""
    out = tmp_path / "run"
    small = [a for a in SMALL if not a.startswith("callbacks.progress.")]
    proc = train(*small, "logger=wandb", "callbacks.progress.refresh_rate=1", f"hydra.run.dir={out}",
                 wandb_mode="offline")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(out)

    # config: every stage's resolved config under its name, with its batch arithmetic
    config = run["config"]
    assert config["stages"] == ["sft", "grpo"]
    assert config["sft"]["algorithm"]["_target_"] == "trainers.sft.SFTModule"
    assert config["grpo"]["algorithm"]["_target_"] == "trainers.grpo.GRPOModule"
    assert config["grpo"]["data"]["prompts_per_round"] == 4 and config["sft"]["trainer"]["max_steps"] == 4
    assert "4 prompts per round × 8 samples" in config["grpo"]["batch_arithmetic"]

    # keys: stage-prefixed only; each stage on its own step; run_step never falls back
    rows = [h for h in run["history"] if "run_step" in h]
    keys = {k for h in rows for k in h if not k.startswith("_")}
    for k in ("sft/train/loss", "sft/val/accuracy", "grpo/train/loss", "grpo/rollout/reward_mean",
              "grpo/val/accuracy", "grpo/train/kl", "sft/step", "grpo/step"):
        assert k in keys, k
    assert not {k for k in keys if k.split("/")[0] in ("train", "rollout", "val", "cost", "trainer")}
    steps = [h["run_step"] for h in rows]
    assert steps == sorted(steps) and steps[-1] == 8, steps
    first_grpo = next(h for h in rows if "grpo/step" in h)
    assert first_grpo["grpo/step"] == 0 and first_grpo["run_step"] == 4  # after SFT's 4 steps
    assert ("grpo/*", "grpo/step") in run["metrics"] and ("run_step", "") in run["metrics"]
    assert ("grpo/cost/generated_tokens", "grpo/step") in run["metrics"]  # the axes beside the step
    grpo_rows = [h for h in rows if "grpo/step" in h]
    assert all(h["grpo/train/policy_version"] == h["run_step"] for h in grpo_rows)  # SFT's 4 + the step
    assert grpo_rows[-1]["grpo/cost/generated_tokens"] == json.loads((out / "summary.json").read_text())["grpo"][
        "cost/generated_tokens"]

    # a samples table per round: 4 GRPO rounds (and SFT's demonstrations once), 16 rows each
    tables = sorted((run["files"] / "media" / "table" / "grpo").glob("samples_*.table.json"))
    assert len(tables) == 4, tables
    table = json.loads(tables[-1].read_text())
    assert len(table["data"]) == 16
    for column in ("prompt", "completion", "reward", "reward/verifier", "source", "staleness", "policy_version"):
        assert column in table["columns"], column
    row = dict(zip(table["columns"], table["data"][0]))
    assert row["source"] == "fresh" and row["staleness"] == 0 and row["round"] == 4
    assert list((run["files"] / "media" / "table" / "sft").glob("samples_*.table.json"))

    # summary: summary.json's figures per stage
    summary, written = run["summary"], json.loads((out / "summary.json").read_text())
    for stage in ("sft", "grpo"):
        for k in ("val/accuracy_before", "val/accuracy_after", "cost/usd", "train/steps"):
            assert summary[f"{stage}/{k}"] == written[stage][k], (stage, k)
    assert summary["grpo/rollout/trigger/start"] == 1 and "grpo/val/curve" in summary
    assert summary["sft/wall_seconds"] == written["sft"]["wall_seconds"]

    # console: the before-stage accuracy line, one bar per stage in optimizer steps, no project noise
    console = proc.stdout + proc.stderr
    assert console.count("[eval] step 0: held-out greedy accuracy") == 2
    assert "grpo round 4: 100%" in console and "4/4" in console and "v_num" not in console
    for noise in ("anonymous setting", "in eval mode", "already in progress", "transfer_batch_to_device"):
        assert noise not in console, noise


class FakeRun:
    """Stands in for a wandb Run: what the logger logs, defines and configures."""

    def __init__(self):
        self.rows, self.defined, self.configs, self.summary = [], [], [], {}
        self.config = SimpleNamespace(update=lambda d, allow_val_change=False: self.configs.append(d))

    def define_metric(self, name, step_metric=None, **settings):
        self.defined.append((name, step_metric))

    def log(self, row, step=None, commit=None):  # noqa: F811 - the logger must never name a step
        assert step is None and commit is None, "a row logged against an explicit W&B step may be dropped"
        self.rows.append(row)


def test_a_resumed_stage_continues_the_run_step(tmp_path):
    """The offset comes from summary.json (the stages finished before this one, in order)."""
    (tmp_path / "summary.json").write_text(json.dumps({"sft": {"train/steps": 30}, "dpo": {"train/steps": 5},
                                                       "grpo": {"train/steps": 7}}))
    assert earlier_steps(tmp_path, "sft") == 0 and earlier_steps(tmp_path, "dpo") == 30
    assert earlier_steps(tmp_path, "grpo") == 35 and earlier_steps(tmp_path / "none", "grpo") == 0
    run = FakeRun()
    logger = StageWandbLogger(stage="grpo", save_dir=str(tmp_path), project="p", experiment=run)
    logger.log_metrics({"train/loss": 0.5, "epoch": 2}, step=3)
    assert run.rows == [{"grpo/train/loss": 0.5, "grpo/epoch": 2, "grpo/train/policy_version": 38, "grpo/step": 3,
                         "run_step": 38}]
    assert ("grpo/*", "grpo/step") in run.defined
    assert run.configs[0]["stages"] == []  # no config.yaml in this folder: nothing recorded yet
    assert run.summary == {"sft/train/steps": 30, "dpo/train/steps": 5}  # the other finished stages
    assert "anonymous" not in logger._wandb_init


def test_generated_tokens_and_policy_version_are_axes_of_every_row(tmp_path):
    """Beside the steps, every row carries the stage's generated tokens so far (the latest a round logged,
    carried forward; none before the first round) and the run-wide policy version (earlier stages' 35 steps +
    this stage's step), both defined as metrics; rows at the same step stay separate rows (no explicit step)."""
    (tmp_path / "summary.json").write_text(json.dumps({"sft": {"train/steps": 35}}))
    run = FakeRun()
    logger = StageWandbLogger(stage="grpo", save_dir=str(tmp_path), project="p", experiment=run)
    logger.log_metrics({"val/accuracy": 0.8}, step=0)
    logger.log_metrics({"rollout/reward_mean": 0.4, "cost/generated_tokens": 900.0}, step=0)
    logger.log_metrics({"train/loss": 0.5}, step=1)
    logger.log_metrics({"rollout/reward_mean": 0.5, "cost/generated_tokens": 1800.0}, step=1)
    logger.log_metrics({"train/loss": 0.4}, step=2)
    tokens = [r.get("grpo/cost/generated_tokens") for r in run.rows]
    assert tokens == [None, 900.0, 900.0, 1800.0, 1800.0]
    assert [r["grpo/train/policy_version"] for r in run.rows] == [35, 35, 36, 36, 37]
    assert [r["grpo/step"] for r in run.rows] == [0, 0, 1, 1, 2] and run.rows[4]["grpo/train/loss"] == 0.4
    assert {("grpo/cost/generated_tokens", "grpo/step"), ("grpo/train/policy_version", "grpo/step")} <= set(run.defined)


def test_sample_rows_name_the_source_staleness_and_each_reward():
    def record(version, served_as, rewards):
        prov = Provenance(source="policy_rollout", created_step=version or 0, policy_version=version)
        return ExperienceRecord([1], [2], prov, prompt_text="1+1=", completion_text="2", answer="2",
                                rewards=rewards, reward=rewards.get("verifier", 0.0), served_as=served_as)

    records = [record(10, "fresh", {"verifier": 1.0, "gold": 1.0}), record(7, "replay", {"verifier": 0.0}),
               record(None, "dataset", {})]
    columns, rows = sample_rows(records, round_=3, step=10, version=10, online=True)
    table = [dict(zip(columns, r)) for r in rows]
    assert [t["source"] for t in table] == ["fresh", "replay", "dataset"]
    assert [t["staleness"] for t in table] == [0, 3, None]
    assert [t["reward/gold"] for t in table] == [1.0, None, None] and table[1]["reward/verifier"] == 0.0
    _, offline = sample_rows(records[:1], round_=1, step=0, version=0, online=False)
    assert offline[0][columns.index("source")] == "dataset"


def test_group_and_name_tell_runs_apart(tmp_path):
    """Hydra's default dirs name a run by the time of day alone; the W&B names add the date, the
    experiment and the command line. Names given by hand (a sweep dir, a run dir) are kept."""
    from callbacks.wandb_run import readable_names
    single = tmp_path / "outputs" / "2026-03-01" / "10-20-00"
    (single / ".hydra").mkdir(parents=True)
    (single / ".hydra" / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n      experiment: quickstart\n")
    (single / ".hydra" / "overrides.yaml").write_text("- seed=2\n- hydra.run.dir=x\n")
    assert readable_names(single, "10-20-00", "10-20-00") == ("quickstart-2026-03-01", "2026-03-01 10:20:00 seed=2")
    job = tmp_path / "multirun" / "2026-03-01" / "11-00-00" / "1"
    assert readable_names(job, "11-00-00", "1:seed=2") == ("run-2026-03-01-11-00-00", "1:seed=2")
    assert readable_names(tmp_path / "sweep" / "1", "sweep", "1:seed=2") == ("sweep", "1:seed=2")
    assert readable_names(tmp_path / "mine", "mine", "mine") == ("mine", "mine")
