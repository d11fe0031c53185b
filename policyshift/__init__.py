"""policyshift as a library, for notebooks and scripts: the same run as `python train.py OVERRIDES`.

    import policyshift
    summary = policyshift.train(overrides=["algorithm=sft", "trainer.max_steps=5"], output_dir="runs/sft")
    summary = policyshift.train(overrides=["algorithm=grpo"], reward_fn=my_score)   # reward=function

`policyshift` on the command line (pyproject's console script) is `python train.py`.
"""
from policyshift.api import main, train

__all__ = ["main", "train"]
