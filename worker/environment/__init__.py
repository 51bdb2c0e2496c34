"""A repository's test environment, built from the company's package mirror and cached.

- `declared`: what a checkout declares (pyproject, requirements, setup.py/setup.cfg, tox.ini,
  uv.lock, poetry.lock, `.frogfix.yml`'s `environment`), read as text only: no code of the
  repository runs on the host.
- `relay`: the host side of the one way out of a setup sandbox: an HTTP relay on a unix socket
  that forwards GET/HEAD to the mirror's origin only, adding the mirror's credentials itself.
- `builder`: the setup phase (a sandbox that reaches the relay and nothing else) and the cache
  keyed by what determines an environment; every later sandbox of the job gets it read-only.
- `readiness`: whether a base-commit test run could start at all (not whether it passed).

Imports: app (settings, logs), sandbox, worker.gitcalls and worker.mirrors; nothing here imports the pipeline.
"""
