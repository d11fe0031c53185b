"""`push_to_hub`: upload the run's final policy folder to the Hugging Face Hub once it is saved.

    python train.py push_to_hub.repo_id=me/my-model                       # <run>/policy/, a private repo
    python train.py push_to_hub.repo_id=me/my-model push_to_hub.private=false push_to_hub.revision=v1

After the last stage, train.py saves the policy to `<run>/policy/` (models/lora.save_policy; with LoRA the
adapter, and `<run>/policy_merged/` with model.lora.save_merged) and writes its model card (README.md,
run/model_card.py); `push_to_hub.folder` names the one uploaded, model card included: the repo is created
when missing (`HfApi.create_repo`, exist_ok), the branch `revision` too, then `HfApi.upload_folder`.
transformers' and TRL's `push_to_hub` + `hub_model_id` + `hub_private_repo` are these keys.

Checked when the run is planned, not after hours of training: the repo id's form, a Hub reachable in
principle (HF_HUB_OFFLINE=0: train.py's default is offline) and a token (`hf auth login`, HF_TOKEN).
An upload that fails at the end costs the upload only: the policy stays in the run folder, and the line
printed says how to upload it by hand.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from omegaconf import DictConfig

from hardware.console import say0
from models.hub import hub_cli, offline
from run.validation.values import raw

REPO_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")  # name or owner/name
FOLDERS = ("policy", "policy_merged")


def push_problems(cfg: DictConfig) -> list[str]:
    """Why the stage's push_to_hub cannot work (nothing when push_to_hub.repo_id is null)."""
    repo_id = raw(cfg, "push_to_hub.repo_id")
    if repo_id is None:
        return []
    key = f"push_to_hub.repo_id={repo_id}"
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id):
        return [f"{key}: a Hub repo id is owner/name (or name, in your own namespace)"]
    folder = raw(cfg, "push_to_hub.folder")
    if folder == "policy_merged" and not raw(cfg, "model.lora.save_merged"):
        return [f"push_to_hub.folder=policy_merged: only a LoRA run with model.lora.save_merged=true writes "
                f"<run>/policy_merged/; push policy (push_to_hub.folder=policy)"]
    if offline():
        return [f"{key}: HF_HUB_OFFLINE=1 (train.py's default) forbids the upload, which would fail after the "
                f"training: run with HF_HUB_OFFLINE=0, or drop push_to_hub and upload <run>/policy later "
                f"({hub_cli('upload')} {repo_id} <run>/policy)"]
    from huggingface_hub import get_token
    if not get_token():
        return [f"{key}: no Hugging Face token for the upload: `{hub_cli('login')}`, or set HF_TOKEN"]
    return []


def push_final_policy(cfg: DictConfig, saved: list[Path]) -> str | None:
    """Upload the folder `push_to_hub.folder` names among `saved` (the folders train.py wrote); its URL,
    or None when push_to_hub.repo_id is null or the upload failed (said on stderr, the run kept)."""
    repo_id = raw(cfg, "push_to_hub.repo_id")
    if repo_id is None:
        return None
    name = raw(cfg, "push_to_hub.folder") or "policy"
    folder = next((p for p in saved if p.name == name), saved[0])
    try:
        url = upload(folder, repo_id, bool(raw(cfg, "push_to_hub.private")), raw(cfg, "push_to_hub.revision"))
    except Exception as e:  # noqa: BLE001 - network, permissions, quota: the run's files are safe
        lines = str(e).strip().splitlines()
        print(f"warning: push_to_hub: the upload of {folder} to {repo_id} failed ({type(e).__name__}: "
              f"{lines[0] if lines else ''}); the policy is in the run folder: {hub_cli('upload')} {repo_id} "
              f"{folder}", file=sys.stderr, flush=True)
        return None
    say0(f"push_to_hub: {folder} → {url}")
    return url


def upload(folder: Path, repo_id: str, private: bool, revision: str | None) -> str:
    """Create the model repo (if missing) and its branch `revision`, upload `folder`; the repo's URL."""
    from huggingface_hub import HfApi
    api = HfApi()
    repo = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
    repo_id = getattr(repo, "repo_id", None) or repo_id  # the full owner/name
    if revision:
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model", revision=revision,
                      commit_message=f"policyshift: {folder.parent.name}/{folder.name}")
    return str(repo) + (f"/tree/{revision}" if revision else "")
