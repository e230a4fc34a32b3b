#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run).
#
# Why a script: the tests must see torch_fl the way a user gets it. So every run
# makes a brand-new virtual environment, builds an sdist from this tree and a
# wheel from that sdist (what `pip install torch_fl` from an index would do),
# installs the wheel with its test extra, and runs pytest against the installed
# package. Nothing left on the machine by hand, and nothing in this checkout
# that the sdist or wheel would leave out, can make a test pass.
#
#   scripts/test.sh                     every test, the notebooks included, then the zoo, dispatch,
#                                       replay, lean-runtime, stream and profiler tests again with FL_EMU_ASYNC=1
#   scripts/test.sh tests               the test suite alone
#   scripts/test.sh notebooks           the notebooks alone (nbval re-runs the built .ipynb files)
#   scripts/test.sh tests/runtime/test_device.py -x    arguments go to pytest
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/torch_fl-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*" >&2; }

# The opencl backend's tests need an OpenCL driver: pocl (OpenCL on the CPU) from Debian/Ubuntu where this
# runs as root with apt; anywhere else they skip, saying why (tests/opencl/test_opencl.py).
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] \
    && ! { dpkg -s pocl-opencl-icd && dpkg -s libclblast1; } >/dev/null 2>&1; then
  step "an OpenCL driver for the opencl backend, and CLBlast: apt-get install pocl-opencl-icd ocl-icd-libopencl1 libclblast1"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pocl-opencl-icd ocl-icd-libopencl1 \
    libclblast1 \
    >"${TMPDIR:-/tmp}/torch_fl-pocl.log" 2>&1 \
    || echo "scripts/test.sh: could not install pocl (see ${TMPDIR:-/tmp}/torch_fl-pocl.log); the opencl tests will skip" >&2
elif ! dpkg -s pocl-opencl-icd >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libOpenCL.so.1; then
  echo "scripts/test.sh: no OpenCL driver and no root apt to install pocl; the opencl tests will skip" >&2
fi

# tests/notebook/test_browser.py drives the system's Chromium with Playwright; without it that test skips, saying why.
# (Debian's chromium; on Ubuntu the package is a snap stub.)
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && ! dpkg -s chromium >/dev/null 2>&1; then
  step "Chromium for the browser test: apt-get install chromium"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium \
    >"${TMPDIR:-/tmp}/torch_fl-chromium.log" 2>&1 \
    || echo "scripts/test.sh: could not install chromium (see ${TMPDIR:-/tmp}/torch_fl-chromium.log); tests/notebook/test_browser.py will skip" >&2
fi
# what tests keep for people to look at (the browser test's screenshots), outside the temporary folder
export FL_TEST_ARTIFACTS="${FL_TEST_ARTIFACTS:-$root/test-artifacts}"

step "fresh virtual environment in $work/venv"
"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
# torch first: this wheel lies on disk; a bare torch>=2.9 would make pip fetch a multi-GB CUDA build
pip install -q torch==2.13.0
pip install -q build

step "sdist from the tree, wheel from the sdist"
python -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/torch_fl-*.whl)
sdist=$(ls "$work"/dist/torch_fl-*.tar.gz)

step "pip install $(basename "$wheel")[test]"
pip install -q "$wheel[test]"

step "pytest against the installed package"
cd "$root"
export FL_TEST_INSTALLED=1 FL_TEST_WHEEL="$wheel" FL_TEST_SDIST="$sdist"
# the notebooks' Plotly figures as their JSON mime bundle, comparable by nbval (notebooks/build.py does the same)
export PLOTLY_RENDERER=plotly_mimetype
# `python -m torch_fl.cli ...` started by a test from this directory must not import the source tree
export PYTHONSAFEPATH=1
set +e
pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests (exit status 5); that is a failure, not a pass" >&2
  exit 1
fi
if [ "$#" -eq 0 ]; then
  # The emulated chips once more, as real chips behave (plugins_cffi/emulated/async.c): kernels finish
  # after their call returns and device memory is unreadable from the host, so a missing wait or a
  # host read of device memory anywhere in torch_fl fails here. (The cpu backend is the host itself.)
  step "the zoo, dispatch, replay, lean-runtime, stream and profiler tests on asynchronous emulated chips (FL_EMU_ASYNC=1)"
  set +e
  FL_EMU_ASYNC=1 pytest -p no:cacheprovider -o addopts="-ra" -k "not cpu" tests/tools/test_zoo.py tests/dispatch/test_dispatch.py \
    tests/compile/test_replay.py tests/compile/test_lean.py tests/runtime/test_streams.py tests/runtime/test_async.py tests/tools/test_profiler.py
  rc_async=$?
  set -e
  if [ "$rc_async" -ne 0 ]; then
    [ "$rc_async" -eq 5 ] && echo "scripts/test.sh: the FL_EMU_ASYNC=1 run collected no tests" >&2
    exit 1
  fi
fi
exit "$rc"
