"""A whole world on 127.0.0.1 for the pipeline: forge API doubles, a real git server, a scripted model."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.forge.api import basic_auth_header
from tests.conftest import GITEA_SECRET, configure, shared_fixture
from tests.doubles.git_http import GitHttpDouble, bare_repo_from
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble
from tests.doubles.openai_server import ScriptedOpenAIServer, Status, assistant, text_call, tool_call
from tests.webhook_requests import gitea_headers, gitlab_headers
from worker.commands.demo import make_sample_repo

GITLAB_TOKEN = "glpat-CANARY-pipeline-4f2a9b7c1d"
GITEA_TOKEN = "gitea-CANARY-pipeline-8e3b6a0f5c"
MODEL_KEY = "model-CANARY-pipeline-2c7d9e1a4b"
PROJECT = "acme/calc"
TRIGGER = "frognano-fix"


def fixing_script() -> list[Any]:
    return [
        assistant(None, reasoning="Read the code.", tool_calls=[tool_call("Read", {"file_path": "calc.py"})]),
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")),
        assistant(None, tool_calls=[tool_call("Bash", {"command": "python3 -m pytest -q; env"})]),
        assistant("add() subtracted; it now adds. Tests pass."),
    ]


def breaking_script() -> list[Any]:
    """A 'fix' that changes the code but leaves the tests failing."""
    return [
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return b - a")),
        assistant("Swapped the operands."),
    ]


@dataclass
class World:
    tmp: Path
    gitlab: GitLabDouble
    gitea: GiteaDouble
    git_gitlab: GitHttpDouble
    git_gitea: GitHttpDouble
    model: ScriptedOpenAIServer
    env: dict[str, Any]

    def gitlab_webhook(self, iid: int, *, delivery: str | None = None) -> tuple[bytes, dict[str, str]]:
        body = json.loads((Path(__file__).parents[1] / "payloads" / "gitlab_label_added.json").read_text())
        body["object_attributes"]["iid"] = iid
        body["project"]["path_with_namespace"] = PROJECT
        return json.dumps(body).encode(), gitlab_headers(delivery=delivery)

    def gitea_webhook(self, number: int) -> tuple[bytes, dict[str, str]]:
        body = json.loads((Path(__file__).parents[1] / "payloads" / "gitea_label_updated.json").read_text())
        body["issue"]["number"] = body["number"] = number
        body["repository"]["full_name"] = PROJECT
        body["sender"]["login"] = "dev"
        raw = json.dumps(body).encode()
        return raw, gitea_headers(raw, secret=GITEA_SECRET)

    def bare(self, forge: str) -> Path:
        return self.tmp / f"git-{forge}" / f"{PROJECT}.git"


@pytest.fixture
def world(frogfix_env: dict[str, Any], tmp_path: Path) -> Iterator[World]:
    fixtures = shared_fixture("MANIFEST.json").parent
    sample = make_sample_repo(tmp_path / "src")
    gitlab_git = GitHttpDouble(tmp_path / "git-gitlab", authorization=basic_auth_header("oauth2", GITLAB_TOKEN))
    gitea_git = GitHttpDouble(tmp_path / "git-gitea", authorization=basic_auth_header(GITEA_TOKEN, "x-oauth-basic"))
    for root in (tmp_path / "git-gitlab", tmp_path / "git-gitea"):
        bare_repo_from(sample, root, f"{PROJECT}.git")
    gitlab = GitLabDouble(token=GITLAB_TOKEN, fixtures=fixtures)
    gitlab.add_project(PROJECT, default_branch="main", clone_url=gitlab_git.url_for(f"{PROJECT}.git"))
    gitlab.add_member(PROJECT, "dev", 30)
    gitlab.add_member(PROJECT, "rep", 20)
    gitea = GiteaDouble(token=GITEA_TOKEN, fixtures=fixtures)
    gitea.add_repo(PROJECT, default_branch="main", clone_url=gitea_git.url_for(f"{PROJECT}.git"))
    gitea.set_permission(PROJECT, "dev", "write")
    gitea.set_permission(PROJECT, "rep", "read")
    model = ScriptedOpenAIServer(fixing_script()).start()
    workspaces = Path(tempfile.mkdtemp(prefix="frogfix-pipeline-ws-"))
    workspaces.chmod(0o711)
    configure(
        frogfix_env["monkeypatch"],
        gitlab_url=gitlab.base_url,
        gitlab_token=GITLAB_TOKEN,
        gitea_url=gitea.base_url,
        gitea_token=GITEA_TOKEN,
        model_base_url=model.base_url,
        model_name="scripted",
        model_api_key=MODEL_KEY,
        model_max_retries="2",
        workspace_dir=str(workspaces),
        public_url="https://frogfix.example",
        stale_job_seconds="600",
    )
    world = World(tmp_path, gitlab, gitea, gitlab_git, gitea_git, model, frogfix_env)
    try:
        yield world
    finally:
        model.stop()
        for double in (gitlab, gitea, gitlab_git, gitea_git):
            double.close()
        shutil.rmtree(workspaces, ignore_errors=True)


__all__ = ["PROJECT", "TRIGGER", "Status", "World", "breaking_script", "fixing_script"]
