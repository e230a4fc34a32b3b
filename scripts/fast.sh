#!/usr/bin/env bash
# The fast loop while working (CONTRIBUTING.md): every test not marked slow, against this checkout.
# scripts/test.sh (the README's command) stays the full run, slow tests and notebooks included.
#
#   scripts/fast.sh                       the fast tier
#   scripts/fast.sh tests/dispatch -x     arguments go to pytest
#
# A fast tier that collects nothing (every test marked slow, a typo in a path or -k) is a failure, not a
# pass: pytest's exit status 5 becomes 1 here, with the reason.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"${PYTHON:-python3}" -m pytest -p no:cacheprovider -m "not slow" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/fast.sh: pytest collected no tests outside the slow marker (exit status 5); that is a failure" >&2
  exit 1
fi
exit "$rc"
