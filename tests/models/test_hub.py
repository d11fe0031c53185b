"""Hub ids through the Hugging Face cache (models/hub.py), offline as train.py runs by default: a cache
folder laid out by the test (`models--owner--name/refs/main` + `snapshots/<hash>/...`, as
`hf download` leaves it) stands in for the Hub; nothing touches the network."""
from __future__ import annotations

import json

import pytest

import policyshift
from data_modules.preference_files import PreferenceDataError, read_rows
from models.hf_checks import ModelFolderError
from models.synthetic import write_qwen_like
from run.errors import ConfigError
from tasks.jsonl import DataFileError, jsonl_task
from tests.test_real_model_e2e import SMALL

HASH = "0123456789abcdef0123456789abcdef01234567"


def cached(cache, kind: str, repo_id: str):
    """The snapshot folder of `repo_id` in cache folder `cache`, created with its refs/main."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(HASH)
    snapshot = repo / "snapshots" / HASH
    snapshot.mkdir(parents=True)
    return snapshot


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def test_a_model_id_and_a_dataset_id_train_from_the_cache(cache, tmp_path, capsys):
    write_qwen_like(cached(cache, "model", "acme/tiny-qwen"), vocab_size=1000, hidden_size=64, num_layers=1,
                    num_heads=2, intermediate_size=128)
    data = cached(cache, "dataset", "acme/sums")
    write_jsonl(data / "data" / "train.jsonl", [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(40)])
    write_jsonl(data / "data" / "test.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(8)])
    out = tmp_path / "run"
    summary = policyshift.train(overrides=["model=hf", "model.name_or_path=acme/tiny-qwen", "task=jsonl",
                                           "task.train_path=acme/sums", "task.heldout_path=acme/sums", *SMALL],
                                output_dir=out)
    assert summary["grpo"]["train/steps"] == 2
    printed = capsys.readouterr().out
    assert f"task.train_path=acme/sums: {data / 'data' / 'train.jsonl'}" in printed
    assert f"task.heldout_path=acme/sums: {data / 'data' / 'test.jsonl'}" in printed
    assert (out / "policy" / "config.json").is_file()
    assert "base_model: acme/tiny-qwen" in (out / "policy" / "README.md").read_text()


def test_a_missing_model_id_is_refused_at_plan_time_naming_the_cache(cache, tmp_path):
    with pytest.raises(ConfigError) as info:
        policyshift.train(overrides=["model=hf", "model.name_or_path=acme/absent", *SMALL],
                          output_dir=tmp_path / "run")
    message = str(info.value)
    for part in ("model.name_or_path='acme/absent'", str(cache / "models--acme--absent"), "HF_HUB_OFFLINE=1",
                 "hf download acme/absent", "HF_HUB_OFFLINE=0"):
        assert part in message, part
    assert not (tmp_path / "run").exists()


def test_a_local_folder_that_is_missing_is_not_looked_up(cache, tmp_path):
    from models.hf_checks import check_folder
    with pytest.raises(ModelFolderError, match="no such local directory"):
        check_folder(tmp_path / "nowhere")


def test_a_missing_dataset_id_names_the_key_and_how_to_fetch_it(cache):
    with pytest.raises(DataFileError, match=r"task.train_path='acme/nothing'.*--repo-type dataset"):
        jsonl_task("acme/nothing", None, chat=False, num_heldout=1, prompt_key="prompt", answer_key="answer")


def test_preference_shards_of_the_split_and_a_heldout_split(cache):
    data = cached(cache, "dataset", "acme/prefs")
    row = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}
    write_jsonl(data / "data" / "train-00000-of-00002.jsonl", [row] * 3)
    write_jsonl(data / "data" / "train-00001-of-00002.jsonl", [row] * 2)
    write_jsonl(data / "data" / "test-00000-of-00001.jsonl", [row])
    assert len(read_rows("acme/prefs", "train")) == 5  # both shards
    assert len(read_rows("acme/prefs", "train", key="data.heldout_path")) == 1
    assert len(read_rows("acme/prefs/data/test-00000-of-00001.jsonl", "train")) == 1  # a file in the repo
    write_jsonl(data / "other" / "b.jsonl", [row])
    write_jsonl(data / "other" / "c.jsonl", [row])
    with pytest.raises(PreferenceDataError, match="none names the split.*owner/name/<file>"):
        read_rows("acme/prefs/other", "train")


def test_a_missing_relative_file_is_not_taken_for_an_id(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFileError, match=r"^data/train.jsonl: file not found$"):
        jsonl_task("data/train.jsonl", None, chat=False, num_heldout=1, prompt_key="prompt", answer_key="answer")


def test_online_an_id_missing_from_the_cache_is_downloaded_into_it(cache, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=0: snapshot_download may fetch (stood in for here: no network in tests), into the
    cache folder; a repo without .safetensors weights gets its .bin weights in a second call."""
    import huggingface_hub

    from models.hub import model_folder
    calls = []

    def fake_download(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(tmp_path / "snapshot")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert model_folder("acme/online", "model.name_or_path", ModelFolderError) == tmp_path / "snapshot"
    assert [c[0] for c in calls] == ["acme/online", "acme/online"]
    first, second = calls[0][1], calls[1][1]
    assert first["local_files_only"] is False and first["cache_dir"] == cache and first["repo_type"] == "model"
    assert "*.safetensors" in first["allow_patterns"] and second["allow_patterns"] == ["*.bin"]

    def not_found(repo_id, **kw):
        raise RuntimeError("404 Client Error: Repository Not Found")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_found)
    with pytest.raises(ModelFolderError, match=r"model.name_or_path='acme/gone': .*did not download.*404.*login"):
        model_folder("acme/gone", "model.name_or_path", ModelFolderError)


@pytest.mark.parametrize("action", ["download", "login", "upload"])
def test_the_advised_hub_command_is_installed_and_knows_its_subcommand(action):
    """Every error that tells the user to run a Hub command names one the installed huggingface_hub ships
    (its `huggingface-cli` is gone from recent releases): the program is on PATH and `--help` of the advised
    subcommand exits 0."""
    import shutil
    import subprocess
    from models.hub import hub_cli
    words = hub_cli(action).split()
    assert shutil.which(words[0]), f"{words[0]} is not on PATH"
    done = subprocess.run([*words, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
