"""Every config composes and instantiates; stages are planned and validated before anything heavy."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.errors import HydraException
from hydra.utils import get_class, get_method, instantiate
from omegaconf import OmegaConf

from run.errors import ConfigError
from run.stages import build, build_callbacks, build_loggers, plan_stages, set_run_fields
from tests.helpers import TINY, TINY_MODEL, tiny_model

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())
NOT_MODEL = [o for o in TINY if not o.startswith(("model.", "logger="))]  # for model=hf
CHOICES = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(30)))
    return str(path)


def required(group: str, choice: str, jsonl: str, model_dir: str = "/nonexistent") -> list[str]:
    """The keys a choice cannot do without (and sft's data: see test_algorithm_sft_alone_is_one_stage)."""
    return {("model", "hf"): [f"model.name_or_path={model_dir}"],
            ("experiment", "tool_use_chat"): [f"model.name_or_path={model_dir}"],  # it picks model=hf
            ("task", "jsonl"): [f"task.train_path={jsonl}"],
            ("algorithm", "sft"): ["data=demonstrations"],
            **{("algorithm", a): ["data=static_preferences"] for a in ("dpo", "ipo", "kto", "reward_model")},
            ("data", "checkpoint_preferences"): [f"data.synthetic.checkpoint={model_dir}"],
            }.get((group, choice), [])


def test_every_group_has_choices():
    assert {"algorithm", "data", "task", "reward", "model", "generator", "hardware", "logger", "callbacks",
            "experiment"} <= set(GROUPS)
    assert len(CHOICES) >= 18


@pytest.mark.parametrize("group,choice", CHOICES, ids=[f"{g}={c}" for g, c in CHOICES])
def test_every_choice_composes_and_resolves(hydra_conf, tmp_path, jsonl_file, group, choice):
    """Each file composes, and the whole config resolves with no '???' left once train.py's run fields
    are filled in; every `_target_` in it imports."""
    cfg = hydra_conf([f"{group}={choice}"] + required(group, choice, jsonl_file))
    set_run_fields(cfg, tmp_path, "stage", "group", "name")
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert "trainer" in resolved and resolved["trainer"]["reload_dataloaders_every_n_epochs"] == 1
    if group == "hardware":
        expected = {"cpu": "cpu", "gpu": "gpu", "ddp": "auto", "fsdp": "auto"}.get(choice, "gpu")  # deepspeed: CUDA
        assert resolved["trainer"]["accelerator"] == expected
    elif group == "experiment":
        assert isinstance(resolved["stages"], list)
    elif group == "scheduler":  # `# @package algorithm.scheduler`
        assert resolved["algorithm"]["scheduler"]["_target_"].startswith("transformers.get_")
    elif group == "env" and choice == "none":  # no environment: one turn (callbacks build none)
        assert resolved["env"] == {}
    elif group not in ("logger", "hparams_search"):  # hparams_search sets hydra.sweeper only
        assert resolved[group], f"{group}={choice} composed to an empty node"

    def targets(node):
        if isinstance(node, dict):
            if "_target_" in node:
                yield node["_target_"]
            for v in node.values():
                yield from targets(v)
        elif isinstance(node, list):
            for v in node:
                yield from targets(v)

    for target in targets(resolved):
        try:
            get_class(target)
        except Exception:
            get_method(target)  # a function target


def test_algorithm_and_data_nodes_build_with_live_objects(hydra_conf, jsonl_file):
    """build() passes the live policy/task/tokenizer through; every algorithm and data choice builds."""
    import data_modules.base
    import trainers.base
    policy, tok = tiny_model()
    for alg in sorted(f.stem for f in (CONF / "algorithm").glob("*.yaml")):
        cfg = hydra_conf([f"algorithm={alg}"] + TINY)
        module = build(cfg.algorithm, policy=policy, tokenizer=tok)
        assert isinstance(module, trainers.base.PolicyModule) and module.policy is policy
        assert module.algorithm_name == alg and module.temperature == cfg.algorithm.temperature
    grpo_cfg = hydra_conf(["algorithm=grpo"] + TINY)
    task = instantiate(grpo_cfg.task)
    for data in sorted(f.stem for f in (CONF / "data").glob("*.yaml")):
        if data in ("checkpoint_preferences", "conversations"):  # a saved policy, a chat file: built in
            continue  # tests/data_modules/test_preferences.py and tests/data_modules/test_conversations.py
        if data == "episode_demonstrations":  # teacher episodes: an environment and a task with calls
            cfg = hydra_conf([f"data={data}", "algorithm=sft", "env=calculator", "task=tool_arithmetic"] + TINY)
            dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
            assert dm.records[0].loss_mask is not None
            continue
        cfg = hydra_conf([f"data={data}", "algorithm=grpo"] + TINY)
        dm = build(cfg.data, task=task, tokenizer=tok)
        assert isinstance(dm, data_modules.base.ExperienceDataModule)
        assert dm.task is task and dm.tokenizer is tok and dm.batch_size == cfg.data.batch_size


def test_task_reward_generator_callbacks_loggers_model_instantiate(hydra_conf, tmp_path, jsonl_file):
    from callbacks.evaluate import HeldOutEvaluation
    from callbacks.regenerate import RegenerateExperience
    from generators.hf import HFGenerator
    from rewards.base import RewardSource
    policy, tok = tiny_model()
    policy.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = hydra_conf(["task=jsonl", f"task.train_path={jsonl_file}", "model=hf",
                      f"model.name_or_path={tmp_path / 'm'}", "logger=csv"] + NOT_MODEL)
    set_run_fields(cfg, tmp_path, "sft", "g", "n")
    task = instantiate(cfg.task)
    assert len(task.heldout) == 20 and len(task.train) == 10
    assert len(instantiate(hydra_conf(TINY).task).heldout) == 20  # the arithmetic default
    reward, gen = instantiate(cfg.reward), instantiate(cfg.generator)
    assert isinstance(reward, RewardSource) and isinstance(gen, HFGenerator)
    assert reward.score(["1+1="], ["2"], task.train[:1]) in ([0.0], [1.0])
    cbs = build_callbacks(cfg, gen, reward, task)
    regen = next(c for c in cbs if isinstance(c, RegenerateExperience))
    ev = next(c for c in cbs if isinstance(c, HeldOutEvaluation))
    assert regen.generator is gen and regen.reward is reward and ev.task is task and ev.generator is gen
    assert ev.num_examples == 20
    [csv] = build_loggers(cfg)
    assert Path(csv.log_dir) == tmp_path / "csv" / "sft"
    assert build_loggers(hydra_conf(["logger=none"])) == []
    model, mtok = instantiate(cfg.model)
    assert model.config.hidden_size == 32 and mtok.pad_token_id == tok.pad_token_id
    tiny, _ = instantiate(hydra_conf(TINY_MODEL).model)
    assert tiny.config.num_hidden_layers == 1


# ---------------------------------------------------------------- stage planning
def plan(hydra_conf, overrides):
    return plan_stages(hydra_conf(overrides), overrides)


def test_default_plan_is_sft_then_grpo(hydra_conf):
    stages = plan(hydra_conf, [])
    assert [s.name for s in stages] == ["sft", "grpo"]
    sft, grpo = (s.cfg for s in stages)
    assert sft.algorithm._target_ == "trainers.sft.SFTModule"
    assert sft.data._target_.endswith("DemonstrationsDataModule")
    assert grpo.algorithm._target_ == "trainers.grpo.GRPOModule"
    assert grpo.data._target_.endswith("FreshRolloutsDataModule")
    assert (sft.trainer.max_steps, grpo.trainer.max_steps) == (2000, 600)
    assert all(s.task is not None and s.task.train for s in stages)


def test_user_key_override_wins_over_stage_overrides(hydra_conf):
    stages = plan(hydra_conf, ["trainer.max_steps=7", "seed=5"])
    assert [(s.cfg.trainer.max_steps, s.cfg.seed) for s in stages] == [(7, 5), (7, 5)]
    assert stages[0].cfg.algorithm.scheduler.num_training_steps == 7  # interpolations follow


def test_key_override_applies_only_to_stages_that_have_the_key(hydra_conf):
    sft, grpo = plan(hydra_conf, ["algorithm.beta=0.0"])
    assert grpo.cfg.algorithm.beta == 0.0
    assert "beta" not in sft.cfg.algorithm


def test_naming_an_algorithm_runs_it_alone(hydra_conf):
    [stage] = plan(hydra_conf, ["algorithm=dr_grpo"])
    assert stage.name == "dr_grpo" and stage.cfg.algorithm.loss_agg_mode == "seq_mean_token_sum_norm"
    assert stage.cfg.algorithm.advantage.scale_by_std is False
    [stage] = plan(hydra_conf, ["algorithm=sft", "data=demonstrations"])
    assert stage.name == "sft" and stage.cfg.trainer.max_steps == 100  # the base default, no stage's


@pytest.mark.parametrize("algorithm,fn,scale_by_std", [
    ("grpo", "group_relative_advantages", True), ("dr_grpo", "group_relative_advantages", False),
    ("rloo", "rloo_advantages", False), ("reinforce_pp", "reinforce_pp_advantages", True)])
def test_advantage_node_of_each_grpo_variant(hydra_conf, algorithm, fn, scale_by_std):
    """The variants inherit grpo.yaml's advantage node and point it at their estimator. Hydra cannot
    delete grpo's `scale_by_std` there, so every estimator takes one and each file sets it."""
    [stage] = plan(hydra_conf, [f"algorithm={algorithm}"])
    node = stage.cfg.algorithm.advantage
    assert set(node) == {"_target_", "_partial_", "scale_by_std"}
    advantage = instantiate(node)
    assert advantage.func.__name__ == fn and advantage.keywords == {"scale_by_std": scale_by_std}


def test_algorithm_sft_alone_is_one_stage(hydra_conf):
    [stage] = plan(hydra_conf, ["algorithm=sft"])
    assert stage.name == "sft" and stage.cfg.algorithm._target_ == "trainers.sft.SFTModule"


def test_stage_only_key_override_from_the_command_line(hydra_conf):
    """`python train.py ++data.max_examples=50`: @hydra.main composes the base config (data=fresh_rollouts)
    first, so a key of another stage's group is written with ++; plan_stages then gives it only to the
    stages whose config has the key."""
    sft, grpo = plan(hydra_conf, ["++data.max_examples=50"])
    assert sft.cfg.data.max_examples == 50 and "max_examples" not in grpo.cfg.data


def test_misspelled_key_names_it(hydra_conf):
    with pytest.raises(ConfigError, match=r"algorithm\.betta"):
        plan_stages(hydra_conf([]), ["algorithm.betta=0.1"])


def test_misspelled_group_choice_is_a_hydra_error_naming_it(hydra_conf):
    with pytest.raises(HydraException, match="grpoo"):
        hydra_conf(["algorithm=grpoo"])
    with pytest.raises(HydraException, match="grpoo"):
        plan_stages(hydra_conf([]), ["algorithm=grpoo"])


@pytest.mark.parametrize("overrides,key", [
    (["algorithm.group_size=0"], "algorithm.group_size"),
    (["algorithm.group_size=1"], "algorithm.group_size"),
    (["data.prompts_per_round=3", "data.batch_size=16"], "data.batch_size"),
    (["algorithm.beta=-0.1"], "algorithm.beta"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["generator.temperature=0"], "generator.temperature"),
    (["algorithm=grpo", "algorithm.epochs_per_round=0"], "algorithm.epochs_per_round"),
    (["data.micro_batch_size=0"], "data.micro_batch_size"),
    (["data.micro_batch_size=3"], "data.micro_batch_size"),          # does not divide 512
    (["data.micro_batch_size=1024"], "data.micro_batch_size"),       # larger than the batch
    (["model.dtype=float8"], "model.dtype"),
    (["model.activation_checkpointing=maybe"], "model.activation_checkpointing"),
    (["algorithm.max_grad_norm=-1"], "algorithm.max_grad_norm"),
    (["algorithm.annotate_batch_size=0"], "algorithm.annotate_batch_size"),
    (["generator.top_p=1.5"], "generator.top_p"),
])
def test_invalid_values_raise_config_error_naming_the_key(hydra_conf, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        plan(hydra_conf, overrides)


def test_grpo_on_demonstrations_is_refused(hydra_conf):
    with pytest.raises(ConfigError, match="data"):
        plan(hydra_conf, ["data=demonstrations"])


def test_missing_model_dir_is_found_when_planning(hydra_conf):
    with pytest.raises((ConfigError, FileNotFoundError), match="model.name_or_path"):
        plan(hydra_conf, ["model=hf", "model.name_or_path=/nonexistent/model"])


REPLAY = ["algorithm=grpo", "data=replay_mix"]


def test_uncorrected_replay_is_refused_unless_allowed(hydra_conf):
    with pytest.raises(ConfigError, match=r"correction=none.*data\.allow_uncorrected=true"):
        plan(hydra_conf, REPLAY + ["correction=none", "data.replay_ratio=0.5"])
    [stage] = plan(hydra_conf, REPLAY + ["correction=none", "data.replay_ratio=0.5", "data.allow_uncorrected=true"])
    assert stage.cfg.algorithm.correction._target_ == "losses.correction.no_correction"
    [stage] = plan(hydra_conf, REPLAY + ["correction=none", "data.replay_ratio=0"])  # pure on-policy: fine
    for choice in ("ppo_clip", "truncated_is", "masked_is"):
        [stage] = plan(hydra_conf, REPLAY + [f"correction={choice}"])
        assert callable(instantiate(stage.cfg.algorithm.correction))


@pytest.mark.parametrize("overrides,key", [
    (["data.replay_ratio=1.0"], "data.replay_ratio"),
    (["data.harvest=/nonexistent/store"], "data.harvest"),
])
def test_bad_replay_settings_name_the_key(hydra_conf, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        plan(hydra_conf, REPLAY + overrides)


def test_onpolicy_vs_replay_sweeps_the_ratio_from_the_command_line(hydra_conf):
    """`-m experiment=onpolicy_vs_replay data.replay_ratio=0,0.5,0.9`: the ratio reaches the GRPO stage."""
    sft, grpo = plan(hydra_conf, ["experiment=onpolicy_vs_replay", "data.replay_ratio=0.9"])
    assert grpo.cfg.data.replay_ratio == 0.9 and "replay_ratio" not in sft.cfg.data


def test_generator_vllm_without_the_package_names_the_install_command(hydra_conf):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here: the refusal cannot happen")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"generator=vllm.*install_vllm\.sh"):
        plan(hydra_conf, ["generator=vllm"])
