"""README.md and docs/*.md stay true: every relative link resolves, no page cites a file the repository
lacks, the numbers they quote match the configs they describe, the W&B names they show are the ones runs
produce, and every `python train.py ...` command they show plans (composes and validates every stage) as
pasted, with the user's own files replaced by small fixtures (tests/documented_commands.py). The commands
that promise learning run with `-m slow` (tests/test_docs_learning.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from run.stages import plan_stages
from tests.documented_commands import PAGES, ROOT, commands, runnable

LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|sh|txt|toml))`")  # `dir/file.ext` in backticks
TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:|^#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_of_the_repository(page):
    broken = [t for t in _relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to files that do not exist: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_cites_a_file_the_repository_lacks(page):
    """A path in backticks whose first folder is one of the repository's names a file that is here; no page
    cites the project's design notes, which are not part of the repository."""
    text = page.read_text()
    missing = [c for c in CITED.findall(text) if c.split("/")[0] in TOP and not (ROOT / c).exists()]
    assert not missing, f"{page.relative_to(ROOT)} cites files that are not in the repository: {missing}"
    assert "DESIGN" not in text, f"{page.relative_to(ROOT)} cites DESIGN.md, which is not in the repository"


# ---------------------------------------------------------------------------------------------------------
# every documented command plans

DOCUMENTED = commands()
ELSEWHERE = re.compile(r"torch sees no CUDA GPU|needs the vllm package|deepspeed is not installed|no Hugging Face token")  # the machine, not the docs


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """Small stand-ins for what the user brings: prompts + answers, preference pairs, chats, a model folder."""
    from models.synthetic import write_qwen_like
    from tests.helpers import CHAT_MODEL
    d = tmp_path_factory.mktemp("user_files")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n"
                                             for a in range(300)))
    (d / "prefs.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "chosen": str(a + 1),
                                                       "rejected": str(a)}) + "\n" for a in range(300)))
    chat = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]
    (d / "chats.jsonl").write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(300)))
    write_qwen_like(d / "model", seed=0, tokenizer="bpe", **(CHAT_MODEL | {"max_position_embeddings": 1024}))
    return {"jsonl": str(d / "prompts.jsonl"), "prefs": str(d / "prefs.jsonl"), "chats": str(d / "chats.jsonl"),
            "model": str(d / "model"), "reward_fn": "tests.helpers.char_sum_scores"}


def test_the_pages_show_commands():
    pages = {c.page for c in DOCUMENTED}
    assert "README.md" in pages and len(DOCUMENTED) >= 30, sorted(pages)


@pytest.mark.parametrize("doc", DOCUMENTED, ids=lambda c: c.where)
def test_documented_command_plans(doc, fixtures, hydra_conf, monkeypatch):
    """The command composes and every stage validates, as train.py plans it before building a model."""
    overrides = runnable(doc.args, fixtures)
    if isinstance(overrides, str):
        pytest.skip(f"{doc.where}: {overrides}")
    for assignment in doc.env:  # HF_HUB_OFFLINE=0 python train.py ...
        monkeypatch.setenv(*assignment.split("=", 1))
    try:
        stages = plan_stages(hydra_conf(overrides), overrides)
    except Exception as e:  # noqa: BLE001  (any failure: name the page, the line and the command)
        if ELSEWHERE.search(str(e)):
            pytest.skip(f"{doc.where} needs what this machine lacks: {ELSEWHERE.search(str(e))[0]}")
        pytest.fail(f"{doc.where}: `{doc.text}` does not plan: {type(e).__name__}: {e}")
    assert stages, doc.where


# ---------------------------------------------------------------------------------------------------------
# numbers the pages quote, against the configs they describe

def _text(page: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / page).read_text())  # a phrase may wrap


@pytest.fixture(scope="module")
def planned():
    """{experiment: {stage name: resolved config}} of the experiments the pages quote (planned once)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    out = {}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for experiment in ("quickstart", "short_sft_grpo", "short_sft_adaptive", "sft_then_spin", "tool_use"):
            overrides = [f"experiment={experiment}"]
            out[experiment] = {s.name: s for s in plan_stages(compose("train", overrides=overrides), overrides)}
    GlobalHydra.instance().clear()
    return out


def test_the_default_run_as_the_readme_tells_it_is_the_quickstart_config(planned):
    sft, grpo = planned["quickstart"]["sft"], planned["quickstart"]["grpo"]
    task = grpo.task
    text = _text("README.md")
    quoted = [f"{len(task.train):,} training prompts and {len(task.heldout):,} held out",
              f"sft**: supervised fine-tuning on {sft.cfg.data.max_examples:,} demonstrations",
              f"{sft.cfg.trainer.max_steps:,} steps. The student copies the flaw",
              f"on all {len(task.train):,} training prompts, {grpo.cfg.data.prompts_per_round} prompts × "
              f"{grpo.cfg.algorithm.group_size} samples a round, {grpo.cfg.trainer.max_steps} rounds",
              f"β = {grpo.cfg.algorithm.beta} KL", f"up to {grpo.cfg.algorithm.max_gen_batches} generation batches",
              f"on the {len(task.heldout)} held-out sums"]
    assert [q for q in quoted if q not in text] == []
    assert sft.cfg.task.teacher == "no_carry_at_ten" and grpo.cfg.algorithm.dynamic_sampling
    assert f"after sft ({sft.cfg.trainer.max_steps:,} steps)" in text
    assert f"after grpo ({grpo.cfg.trainer.max_steps} steps)" in text


@pytest.mark.parametrize("page, pattern, experiment, stage, key", [
    ("README.md", r"experiment=short_sft_grpo +# SFT, then (\d+) GRPO rounds", "short_sft_grpo", "grpo", "trainer.max_steps"),
    ("docs/cli.md", r"experiment=short_sft_grpo +# SFT, then (\d+) GRPO rounds", "short_sft_grpo", "grpo", "trainer.max_steps"),
    ("docs/experience.md", r"# SFT, then (\d+) GRPO rounds on data=adaptive", "short_sft_adaptive", "grpo",
     "trainer.max_steps"),
    ("docs/real_models.md", r"the quickstart's ([\d,]+) SFT steps", "quickstart", "sft", "trainer.max_steps"),
    ("docs/spin.md", r"SPIN on its ([\d,]+) demonstrations", "sft_then_spin", "sft", "data.max_examples"),
    ("docs/episodes.md", r"30% of its (\d+) demonstrations", "tool_use", "sft", "data.max_examples"),
])
def test_a_number_a_page_quotes_is_the_configs(planned, page, pattern, experiment, stage, key):
    from omegaconf import OmegaConf
    found = re.findall(pattern, (ROOT / page).read_text())
    assert found, f"{page}: no `{pattern}` (the page changed: update this test)"
    want = OmegaConf.select(planned[experiment][stage].cfg, key)
    assert {int(f.replace(",", "")) for f in found} == {want}, f"{page} quotes {found}; {experiment}'s {stage} {key}={want}"


def test_the_wandb_page_shows_the_names_runs_get(tmp_path):
    """docs/wandb.md's examples of group and run names are what callbacks/wandb_run.readable_names makes of
    Hydra's default folders (a multirun job, a single run), and its example keys exist."""
    from callbacks.wandb_run import readable_names
    from omegaconf import OmegaConf
    text = (ROOT / "docs" / "wandb.md").read_text()
    job = tmp_path / "multirun" / "2026-03-01" / "10-20-00" / "1"
    run = tmp_path / "outputs" / "2026-03-01" / "10-20-00"
    for folder, overrides in ((job, ["algorithm.optimizer.lr=1e-5", "seed=2"]), (run, ["algorithm.optimizer.lr=1e-5"])):
        (folder / ".hydra").mkdir(parents=True)
        OmegaConf.save({"hydra": {"runtime": {"choices": {"experiment": "quickstart"}}}}, folder / ".hydra" / "hydra.yaml")
        OmegaConf.save(overrides, folder / ".hydra" / "overrides.yaml")
    group, name = readable_names(job, "10-20-00", "1:algorithm.optimizer.lr=1e-5,seed=2")
    assert f"`{group}`" in text and f"`{name}`" in text, (group, name)
    group, name = readable_names(run, "10-20-00", "10-20-00")
    assert f"`{group}`" in text and f"`{name}`" in text, (group, name)
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["algorithm=grpo"])
    for key in re.findall(r"`grpo\.([\w.]+)`", text):
        assert OmegaConf.select(cfg, key) is not None, f"docs/wandb.md names grpo.{key}, which a GRPO stage lacks"


def test_the_conversations_example_fits_the_default_model(tmp_path, hydra_conf):
    """docs/conversations.md's example row plans with the tiny default model (its 64-token context); the same
    row with a system turn first is refused, as the page says."""
    block = re.search(r"```json\n(.*?)```", (ROOT / "docs" / "conversations.md").read_text(), re.S)[1]
    row = json.loads(block.replace("\n", " "))
    path = tmp_path / "chats.jsonl"
    overrides = ["algorithm=sft", "data=conversations", f"data.path={path}"]
    path.write_text((json.dumps(row) + "\n") * 300)
    assert plan_stages(hydra_conf(overrides), overrides)
    row["messages"].insert(0, {"role": "system", "content": "Be brief."})
    path.write_text((json.dumps(row) + "\n") * 300)
    with pytest.raises(Exception, match="context"):
        plan_stages(hydra_conf(overrides), overrides)


def test_the_readme_lists_every_choice_of_each_config_group():
    """The README's config groups at a glance name exactly the YAML files of each group it lists."""
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", (ROOT / "README.md").read_text(), re.M)
    assert len(rows) >= 8
    for group, cell in rows:
        folder = ROOT / "conf" / group
        if folder.is_dir():
            listed = set(re.findall(r"`(\w+)`", cell.split(": ")[0]))
            assert listed == {p.stem for p in folder.glob("*.yaml")}, f"README's {group} row: {sorted(listed)}"
