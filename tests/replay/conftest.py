"""The pipeline's world (forge doubles, git server, scripted model) for replay tests."""

from tests.pipeline.conftest import world  # noqa: F401  (registers the fixture here)
