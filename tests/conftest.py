"""Test environment: no network, no W&B prompt, project root importable, Hydra compose helper."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n 2` (the default, pyproject.toml): one thread per worker and
    os.environ["OMP_NUM_THREADS"] = "1"    # per train.py it starts, or 2 workers × 2 threads thrash 2 cores

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402

CONF = str(ROOT / "conf")


@pytest.fixture
def hydra_conf():
    """Yield a `compose(overrides)` function inside an initialized Hydra (cleared afterwards)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        yield lambda overrides=(): compose("train", overrides=list(overrides))
    GlobalHydra.instance().clear()
