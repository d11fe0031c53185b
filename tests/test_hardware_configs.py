"""conf/hardware and conf/hydra/launcher: every hardware choice composes, its trainer node becomes the
strategy it names (run.stages.trainer_arguments), DeepSpeed is refused clearly where it cannot run
(run.validation.hardware.check_hardware), and the SLURM launcher takes its resources from the trainer node.
No training, no subprocess."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from run.stages import trainer_arguments
from run.validation.hardware import check_hardware

CONF = Path(__file__).resolve().parent.parent / "conf"
HARDWARE = sorted(p.stem for p in (CONF / "hardware").glob("*.yaml"))
DEEPSPEED = {"deepspeed_zero2": 2, "deepspeed_zero3": 3}
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_submitit = pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                                    reason="hydra-submitit-launcher not installed (pip install hydra-submitit-launcher)")
INSTALL = "pip install -r requirements-deepspeed.txt"


@pytest.fixture
def conf():
    """compose(overrides, hydra=False) inside an initialized Hydra, cleared before and after."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda overrides=(), hydra=False: compose("train", overrides=list(overrides),
                                                        return_hydra_config=hydra)
    GlobalHydra.instance().clear()


@pytest.fixture
def gpus(monkeypatch):
    """gpus(n): torch sees n CUDA GPUs (0: none), whatever this machine has."""
    def see(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return see


@pytest.fixture
def deepspeed_installed(monkeypatch):
    """deepspeed_installed(flag): the package is (a stand-in spec) or is not importable."""
    real = importlib.util.find_spec

    def set_installed(flag: bool) -> None:
        if flag:
            monkeypatch.setattr(importlib.util, "find_spec",
                                lambda name, *a: object() if name == "deepspeed" else real(name, *a))
        else:  # None in sys.modules: find_spec returns None and `import deepspeed` raises ImportError
            monkeypatch.setitem(sys.modules, "deepspeed", None)
    return set_installed


def errors_of(cfg: DictConfig) -> list[str]:
    errors: list[str] = []
    check_hardware(cfg, errors)
    return errors


def test_the_hardware_group_has_every_strategy():
    assert set(HARDWARE) >= {"cpu", "gpu", "ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"}


@pytest.mark.parametrize("choice", HARDWARE)
def test_every_hardware_choice_composes_and_resolves(conf, choice):
    trainer = OmegaConf.to_container(conf([f"hardware={choice}"]).trainer, resolve=True, throw_on_missing=True)
    assert trainer["accelerator"] in ("cpu", "gpu", "auto")
    assert isinstance(trainer["devices"], int) and trainer["devices"] >= 1
    assert trainer["reload_dataloaders_every_n_epochs"] == 1  # the base trainer keys survive the package
    if choice.startswith(("ddp", "fsdp", "deepspeed")):
        assert trainer["devices"] == 2 and trainer["num_nodes"] == 1
    if choice in ("gpu", *DEEPSPEED):
        assert trainer["accelerator"] == "gpu" and trainer["precision"] == "bf16-mixed"


def test_ddp_is_lightnings_ddp_without_its_sampler(conf):
    kwargs = trainer_arguments(conf(["hardware=ddp"]).trainer)
    assert kwargs["strategy"] == "ddp"
    assert kwargs["use_distributed_sampler"] is False
    assert kwargs["devices"] == 2 and kwargs["max_steps"] == 100


def test_fsdp_is_a_model_parallel_strategy_object(conf):
    from lightning.pytorch.strategies import ModelParallelStrategy
    kwargs = trainer_arguments(conf(["hardware=fsdp"]).trainer)
    assert isinstance(kwargs["strategy"], ModelParallelStrategy)
    assert kwargs["use_distributed_sampler"] is False
    assert kwargs["strategy"]._save_distributed_checkpoint is False  # one gathered file per checkpoint


@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_deepspeed_config_is_a_plain_dict_with_its_stage(conf, choice):
    """What DeepSpeedStrategy receives, read without deepspeed: a plain dict (its `_load_config` asserts
    `isinstance(config, dict)`), the stage, no offload, the algorithm's clipping norm."""
    cfg = conf([f"hardware={choice}", "algorithm.max_grad_norm=0.5"])
    node = OmegaConf.to_container(cfg.trainer.strategy, resolve=True)
    assert node["_target_"] == "lightning.pytorch.strategies.DeepSpeedStrategy"
    assert node["_convert_"] == "all"
    zero = node["config"]["zero_optimization"]
    assert zero["stage"] == DEEPSPEED[choice]
    assert zero["offload_optimizer"]["device"] == "none"
    assert node["config"]["gradient_clipping"] == 0.5
    assert node["config"]["managed_gradient_accumulation"] is False
    if choice == "deepspeed_zero3":
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True
        assert zero["offload_param"]["device"] == "none"


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed not installed (pip install -r requirements-deepspeed.txt)")
@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_deepspeed_strategy_instantiates_with_its_stage(conf, choice):
    from lightning.pytorch.strategies import DeepSpeedStrategy
    kwargs = trainer_arguments(conf([f"hardware={choice}"]).trainer)
    strategy = kwargs["strategy"]
    assert isinstance(strategy, DeepSpeedStrategy)
    assert type(strategy.config) is dict and type(strategy.config["zero_optimization"]) is dict
    assert strategy.config["zero_optimization"]["stage"] == DEEPSPEED[choice]
    assert strategy.zero_stage_3 is (DEEPSPEED[choice] == 3)
    assert strategy.config["gradient_clipping"] == 1.0  # the algorithms' default max_grad_norm
    assert kwargs["use_distributed_sampler"] is False


def test_deepspeed_strategy_without_deepspeed_is_refused_by_lightning(conf, deepspeed_installed):
    """Without the package the strategy cannot be built at all: check_hardware must come first."""
    from hydra.errors import InstantiationException
    from lightning.pytorch.strategies import deepspeed as lightning_deepspeed
    deepspeed_installed(False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lightning_deepspeed, "_DEEPSPEED_AVAILABLE", False)
        with pytest.raises(InstantiationException, match="must have DeepSpeed installed"):
            instantiate(conf(["hardware=deepspeed_zero2"]).trainer.strategy)


@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_deepspeed_not_installed_names_the_install_command(conf, gpus, deepspeed_installed, choice):
    gpus(2)
    deepspeed_installed(False)
    errors = errors_of(conf([f"hardware={choice}"]))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"hardware={choice} (trainer.strategy=DeepSpeedStrategy): deepspeed is not installed")
    assert INSTALL in errors[0] and "\n" not in errors[0]


@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_deepspeed_without_a_gpu_names_the_cpu_strategies(conf, gpus, deepspeed_installed, choice):
    """One message for the missing GPU (not hardware=gpu's as well), naming hardware=ddp/fsdp."""
    gpus(0)
    deepspeed_installed(True)
    errors = errors_of(conf([f"hardware={choice}"]))
    assert len(errors) == 1, errors
    assert "hardware=ddp" in errors[0] and "hardware=fsdp" in errors[0] and "CUDA" in errors[0]
    assert "hardware=cpu" not in errors[0]


def test_deepspeed_neither_installed_nor_a_gpu_says_both(conf, gpus, deepspeed_installed):
    gpus(0)
    deepspeed_installed(False)
    errors = errors_of(conf(["hardware=deepspeed_zero3"]))
    assert len(errors) == 2 and INSTALL in errors[0] and "hardware=fsdp" in errors[1], errors


@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_deepspeed_with_gpus_and_the_package_passes(conf, gpus, deepspeed_installed, choice):
    gpus(2)
    deepspeed_installed(True)
    assert errors_of(conf([f"hardware={choice}"])) == []


def test_deepspeed_more_devices_than_gpus_is_refused(conf, gpus, deepspeed_installed):
    gpus(1)
    deepspeed_installed(True)
    errors = errors_of(conf(["hardware=deepspeed_zero2"]))  # devices: 2
    assert errors == ["trainer.devices=2: only 1 CUDA GPU(s) visible here"]


def test_deepspeed_without_a_clipping_norm_is_refused(conf, gpus, deepspeed_installed):
    """algorithm.max_grad_norm=null would hand DeepSpeed gradient_clipping=None (a TypeError in its step)."""
    gpus(2)
    deepspeed_installed(True)
    errors = errors_of(conf(["hardware=deepspeed_zero2", "algorithm.max_grad_norm=null"]))
    assert len(errors) == 1 and errors[0].startswith("trainer.strategy.config.gradient_clipping=None"), errors
    assert errors_of(conf(["hardware=deepspeed_zero2", "algorithm.max_grad_norm=null",
                           "trainer.strategy.config.gradient_clipping=0.0"])) == []


def test_gpu_checks_are_kept(conf, gpus):
    gpus(0)
    errors = errors_of(conf(["hardware=gpu"]))
    assert errors == ["hardware=gpu (trainer.accelerator=gpu): torch sees no CUDA GPU here: use hardware=cpu, or "
                      "check the driver and CUDA_VISIBLE_DEVICES"]
    gpus(1)
    assert errors_of(conf(["hardware=gpu"])) == []
    assert errors_of(conf(["hardware=gpu", "trainer.devices=2"])) == [
        "trainer.devices=2: only 1 CUDA GPU(s) visible here"]


@pytest.mark.parametrize("choice", ["cpu", "ddp", "fsdp"])
def test_cpu_strategies_need_neither_gpu_nor_deepspeed(conf, gpus, deepspeed_installed, choice):
    gpus(0)
    deepspeed_installed(False)
    assert errors_of(conf([f"hardware={choice}"])) == []


@needs_submitit
def test_slurm_launcher_takes_nodes_and_tasks_from_the_trainer(conf):
    cfg = conf(["hydra/launcher=slurm", "hardware=ddp", "trainer.devices=4", "trainer.num_nodes=2"], hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    assert launcher.max_num_timeout == 0 and launcher.timeout_min > 0
    assert str(launcher.submitit_folder) == f"{cfg.hydra.sweep.dir}/.submitit/%j"
    assert "export SLURM_KILL_BAD_EXIT=1" in launcher.setup  # a failing rank ends the job's other tasks
    built = instantiate(launcher)  # what submitit will be asked for (no cluster needed to build it)
    assert (built.params["nodes"], built.params["tasks_per_node"]) == (2, 4)


@needs_submitit
def test_slurm_launcher_on_hardware_without_num_nodes_is_one_node(conf):
    cfg = conf(["hydra/launcher=slurm", "hardware=gpu"], hydra=True)
    assert (cfg.hydra.launcher.nodes, cfg.hydra.launcher.tasks_per_node) == (1, 1)


@needs_submitit
def test_submitit_local_launcher_composes(conf):
    cfg = conf(["hydra/launcher=submitit_local", "hardware=ddp"], hydra=True)
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.LocalLauncher")
    assert cfg.hydra.launcher.tasks_per_node == 1  # train.py starts the ranks itself (torchrun) there


@pytest.mark.parametrize("choice", ["ddp", "fsdp"])
def test_vllm_engine_per_rank_is_accepted_under_ddp_and_fsdp(conf, choice):
    from run.validation.hardware import check_ranks
    errors: list[str] = []
    check_ranks(conf([f"hardware={choice}", "generator=vllm", "algorithm=grpo"]), errors)
    assert errors == []


@pytest.mark.parametrize("choice", sorted(DEEPSPEED))
def test_vllm_with_deepspeed_ranks_is_refused_in_one_line(conf, choice):
    from run.validation.hardware import check_ranks
    errors: list[str] = []
    check_ranks(conf([f"hardware={choice}", "generator=vllm", "algorithm=grpo"]), errors)
    said = [e for e in errors if e.startswith("generator=vllm")]
    assert said == ["generator=vllm with 2 ranks under trainer.strategy=DeepSpeedStrategy: one engine per rank is "
                    "built for hardware=ddp and hardware=fsdp only (DeepSpeed's weights are not streamed into "
                    "engines yet); use hardware=ddp or hardware=fsdp"]


def test_vllm_tensor_parallel_engine_on_ranks_is_refused(conf):
    from run.validation.hardware import check_ranks
    errors: list[str] = []
    check_ranks(conf(["hardware=ddp", "generator=vllm", "generator.tensor_parallel_size=2"]), errors)
    assert errors == ["generator.tensor_parallel_size=2 with 2 ranks: each rank owns one engine on its own device "
                      "(tensor_parallel_size=1); an engine over several devices is one process's only"]
