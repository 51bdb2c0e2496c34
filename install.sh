#!/usr/bin/env bash
# Installs everything FrogFix and its tests need on a fresh Debian machine (run as root or with sudo).
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
command -v git >/dev/null || missing+=(git)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v chromium >/dev/null || missing+=(chromium)
command -v runuser >/dev/null || missing+=(util-linux)
# the local sandbox runs target repositories' tests with the system python3
/usr/bin/python3 -c "import pytest" 2>/dev/null || missing+=(python3-pytest)
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's own python3 is "externally managed" (PEP 668); a pyenv or venv python3 ignores this.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check -e ".[dev]"
echo "install.sh: ready"
