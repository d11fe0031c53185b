"""policyshift as a library, for notebooks and scripts: the same run as `python train.py OVERRIDES`.

    import policyshift
    summary = policyshift.train(overrides=["algorithm=sft", "trainer.max_steps=5"], output_dir="runs/sft")
    summary = policyshift.train(overrides=["algorithm=grpo"], reward_fn=my_score)   # reward=function

`policyshift` on the command line (pyproject's console script) is `python train.py`.
"""
from __future__ import annotations

__all__ = ["main", "train"]


def main() -> None:
    """The `policyshift` console script: `python train.py ARGS`. The command line is checked first, with
    Hydra alone, so a wrong key answers in seconds; the training stack is imported after."""
    from run.command_line import check_command_line
    check_command_line()
    from policyshift.api import main as run
    run()


def __getattr__(name: str):
    """`policyshift.train` (and `policyshift.api`) import the training stack when first used."""
    if name == "train":
        from policyshift.api import train
        return train
    if name == "api":
        import policyshift.api as api
        return api
    raise AttributeError(f"module 'policyshift' has no attribute {name!r}")
