from tests.pipeline.conftest import world  # noqa: F401  (registers the fixture here)
