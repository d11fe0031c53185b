"""push_to_hub (run/push_to_hub.py) without the network: huggingface_hub.HfApi's create_repo, create_branch
and upload_folder are replaced in this process by recorders (what the Hub would be asked, and the files
of the folder at the moment of the upload), so a real run's upload is checked end to end; the offline
default and a missing token are refused at plan time."""
from __future__ import annotations

import huggingface_hub
import pytest

import policyshift
from run.errors import ConfigError
from run.push_to_hub import push_problems
from tests.helpers import TINY

SFT = TINY + ["algorithm=sft", "trainer.max_steps=2", "++data.batch_size=8", "++data.max_examples=16"]


@pytest.fixture
def hub(monkeypatch):
    """The calls the run makes on HfApi, recorded; online with a token, as a user who pushes has."""
    calls = []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", repo_id, kw))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_branch(self, repo_id, **kw):
        calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, *, repo_id, folder_path, **kw):
        files = sorted(p.name for p in folder_path.iterdir())
        calls.append(("upload_folder", repo_id, kw | {"files": files, "folder": folder_path}))

    for name, fn in (("create_repo", create_repo), ("create_branch", create_branch), ("upload_folder", upload_folder)):
        monkeypatch.setattr(huggingface_hub.HfApi, name, fn)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    return calls


def test_the_final_policy_and_its_model_card_are_uploaded(hub, tmp_path):
    out = tmp_path / "run"
    policyshift.train(overrides=SFT + ["push_to_hub.repo_id=me/tiny-sft", "push_to_hub.revision=v1"],
                      output_dir=out)
    assert [c[0] for c in hub] == ["create_repo", "create_branch", "upload_folder"]
    _, repo_id, kw = hub[0]
    assert repo_id == "me/tiny-sft" and kw["private"] is True and kw["exist_ok"] is True
    assert hub[1][1] == "me/tiny-sft" and hub[1][2]["branch"] == "v1"
    _, repo_id, kw = hub[2]
    assert repo_id == "me/tiny-sft" and kw["folder"] == out / "policy" and kw["revision"] == "v1"
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json"} <= set(kw["files"])


def test_no_repo_id_no_upload(hub, tmp_path):
    policyshift.train(overrides=SFT, output_dir=tmp_path / "run")
    assert hub == []


def test_offline_is_refused_at_plan_time(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"push_to_hub.repo_id=me/x: HF_HUB_OFFLINE=1 .* HF_HUB_OFFLINE=0"):
        policyshift.train(overrides=SFT + ["push_to_hub.repo_id=me/x"], output_dir=tmp_path / "run")
    assert hub == [] and not (tmp_path / "run").exists()


def test_plan_time_checks_of_the_settings(hub, hydra_conf, monkeypatch):
    assert push_problems(hydra_conf(["push_to_hub.repo_id=me/x"])) == []
    assert "owner/name" in push_problems(hydra_conf(["push_to_hub.repo_id='a/b/c'"]))[0]
    merged = push_problems(hydra_conf(["push_to_hub.repo_id=me/x", "push_to_hub.folder=policy_merged"]))
    assert "model.lora.save_merged=true" in merged[0]
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert "hf auth login" in push_problems(hydra_conf(["push_to_hub.repo_id=me/x"]))[0]


def test_a_failed_upload_keeps_the_run(hub, tmp_path, monkeypatch, capsys):
    def refuse(self, repo_id, **kw):
        raise RuntimeError("403 Forbidden")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    out = tmp_path / "run"
    summary = policyshift.train(overrides=SFT + ["push_to_hub.repo_id=me/x"], output_dir=out)
    assert summary["sft"]["train/steps"] == 2 and (out / "policy" / "config.json").is_file()
    err = capsys.readouterr().err
    assert "push_to_hub: the upload" in err and "403 Forbidden" in err and "hf upload me/x" in err
