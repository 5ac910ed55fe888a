#!/usr/bin/env bash
# The Python packages some tests talk to the engine through, from PyPI into .venv-test/ (git-ignored; it sees the
# system's packages too): the openai client (`dscpp serve` end to end, tests/python/test_serve_openai.py) and jinja2
# (the chat templates against jinja2, tests/python/test_chat_template.py). Best effort: without a network those two
# tests skip (exit 77) and everything else runs.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=.venv-test
if [ ! -x "$venv/bin/python3" ] && ! python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
  echo "install-test-deps.sh: python3 -m venv failed (Debian: apt-get install python3-venv); openai/jinja2 tests will skip"
  exit 0
fi
"$venv/bin/python3" -c "import openai, jinja2" 2>/dev/null && exit 0
echo "installing into $venv: openai jinja2 (PyPI)"
"$venv/bin/python3" -m pip install -q --disable-pip-version-check openai jinja2 ||
  echo "install-test-deps.sh: pip could not install openai / jinja2: their tests will skip"
exit 0
