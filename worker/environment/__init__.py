"""A repository's test environment, built from the company's package mirror and cached.

- `declared`: what a checkout declares (pyproject, requirements, setup.py/setup.cfg, tox.ini,
  uv.lock, poetry.lock, `.frogfix.yml`'s `environment`), read as text only: no code of the
  repository runs on the host.
- `build_code`: the files a checkout's own install runs (setup.py and the modules it imports, an
  in-tree PEP 517 backend, build hooks, local path dependencies' build files), read as text only:
  a patch changing one is flagged like a dependency file, and the environment's cache hashes them.
- `relay`: the host side of the one way out of a setup sandbox: an HTTP relay on a unix socket
  that forwards GETs for the index and the files its pages linked to, adding the mirror's credentials.
- `steps`: the setup phase's three steps as scripts (resolve, the mirror's packages, the project's
  own install), and the strict reading of the pins the first one leaves.
- `generated`: the files the project's install generated in the checkout, laid into each later
  checkout where nothing is, never a conftest.py, *.pth or sitecustomize.py.
- `builder`: the setup phase (a sandbox that reaches the relay and nothing else) and the cache
  keyed by what determines an environment; every later sandbox of the job gets it read-only.
- `readiness`: whether a base-commit test run could start at all (not whether it passed).

Room rule (tests/test_import_graph.py): may import `worker.git`; nothing here imports the attempt, the
job core or the commands.
"""
