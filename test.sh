#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own PostgreSQL, Redis and servers on 127.0.0.1.
set -uo pipefail
cd "$(dirname "$0")"
python3 -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
