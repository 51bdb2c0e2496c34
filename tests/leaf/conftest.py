"""Fixtures for the Leaf tests: a scripted OpenAI server on loopback and a model client on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.doubles.openai_server import ScriptedOpenAIServer, ScriptItem
from worker.leaf.model import OpenAIChatModel

ServerFactory = Callable[..., ScriptedOpenAIServer]


@pytest.fixture
def serve() -> Iterator[ServerFactory]:
    """Start scripted servers; all are stopped when the test ends."""
    started: list[ScriptedOpenAIServer] = []

    def factory(*script: ScriptItem, **kwargs: Any) -> ScriptedOpenAIServer:
        server = ScriptedOpenAIServer(list(script), **kwargs).start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[..., OpenAIChatModel]]:
    """Model clients with test-sized timeouts and backoff; closed when the test ends."""
    made: list[OpenAIChatModel] = []

    def factory(server: ScriptedOpenAIServer, **kwargs: Any) -> OpenAIChatModel:
        options: dict[str, Any] = {"timeout": 5.0, "max_retries": 3, "backoff_base": 0.01, "backoff_max": 0.05}
        options.update(kwargs)
        model = OpenAIChatModel(server.base_url, "frognano-test", **options)
        made.append(model)
        return model

    yield factory
    for model in made:
        model.close()
