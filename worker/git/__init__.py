"""Git and workspaces: every git call of a job, the forge's mirrors, the checkouts attempts run in.

- `gitcalls`: the isolated git environment every call uses (no user or system config, no hooks,
  bounded), its errors, and the mirror locks.
- `mirrors`: the forge's repositories mirrored on the worker.
- `workspace_pool`: per-job workspaces and the warm pool; `workspace_sources`: where an attempt's
  workspace comes from (the pool, a mirror, a local checkout).
- `merging`: git's merge of a moved target (merge-tree, the private conflicted commit).
- `publishing`: the fix commit and its push to FrogFix's own branch.

Room rule (tests/test_import_graph.py): imports app's core and sandbox/, and no other room of
worker/: every other room may use it.
"""
