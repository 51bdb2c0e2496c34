"""Test doubles shared by the test suites and the bench: a scripted OpenAI server, a sandbox."""
