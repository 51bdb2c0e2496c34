#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own PostgreSQL, Redis and servers on 127.0.0.1.
# It runs in the checkout's .venv (made by ./install.sh) when there is one, else with python3.
set -uo pipefail
cd "$(dirname "$0")"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
"$python" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
