#!/usr/bin/env bash
# The CUDA backend's check on a GPU machine (issue 15): build mgtrace with
# CUDA, run tests/cuda, run benchmarks/bench_cuda.py, and leave every log and
# result under $OUT. Each step is bounded by `timeout`, so whatever finished is
# written even when a later step hangs or fails; the summary is $OUT/SUMMARY.
#
# Made for the project's device machine (an H200, CUDA 13 with cuBLAS, Python
# 3.12 with numpy, Cython, msgpack, pytest, setuptools and PyTorch; no package
# index). The other dependencies come from ./wheelhouse, prepared on a machine
# with an index (it is git-ignored, so `run` must carry it):
#
#   mkdir -p wheelhouse && pip download --no-deps --only-binary=:all: \
#       --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#       --platform any -d wheelhouse ml_dtypes "ml_dtypes==0.4.1" \
#       scipy-openblas32 rich markdown-it-py mdurl pygments wheel      # ~10 MB
#
# The exact invocation, from the repository root of a session that has a GPU:
#
#   run(command="bash scripts/device_check.sh", carry=["wheelhouse"], timeout_s=600)
#
# then read files_at/SUMMARY, build.log, cuda-tests.log, bench_cuda.txt.
# Budget (16 cores, H200): install ~3 min (limit 6), tests ~1 min (limit 2),
# benchmark ~1.5 min (limit 100 s); all of it fits one 600 s call.
# Knobs: DEVICE_CHECK_BENCH=0 skips the benchmark; DEVICE_CHECK_CPU=1 adds the
# CPU column to it; MGTRACE_CUDA_ARCHS (default here: 90, the H200);
# DEVICE_CHECK_TIME_SCALE=N multiplies every step's time limit (slow machines).
#
# Locally (no GPU), the same script checks itself: the install builds both
# extensions, the CUDA tests skip with their reason, the benchmark notes that
# there is no device:  OUT=/tmp/out PY=/path/to/python3.12 bash scripts/device_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(pwd)/device-check-out}
mkdir -p "$OUT"
SUMMARY="$OUT/SUMMARY"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
step() {     # step NAME SECONDS LOG command...: run it bounded, log it, record its status
    local name=$1 secs=$2 log=$3; shift 3
    local t0=$SECONDS
    timeout --kill-after=10 "$((secs * ${DEVICE_CHECK_TIME_SCALE:-1}))" "$@" > "$OUT/$log" 2>&1
    local rc=$?
    note "$(printf '%-8s rc=%-3s %4ss  (%s)' "$name" "$rc" "$((SECONDS - t0))" "$log")"
    return $rc
}

note "device_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && note "gpu      $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null && note "commit   $(cat "$OUT/commit.txt")"

# Python: a venv that sees the machine's packages (numpy, torch...), so pip
# installs nothing outside it; else the interpreter itself.
PY=${PY:-$(command -v python3.12 || command -v python3)}
VENV=${VENV:-/tmp/mgtrace-device-venv}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV" > "$OUT/venv.log" 2>&1 || true
fi
if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else export PIP_BREAK_SYSTEM_PACKAGES=1; fi
note "python   $("$PY" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)' 2>&1)"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# 1. dependencies (setup.py imports scipy_openblas32), then mgtrace with CUDA
export MGTRACE_CUDA=1 MGTRACE_CUDA_ARCHS=${MGTRACE_CUDA_ARCHS:-90}
step deps 60 deps.log "$PY" -m pip install --no-index --find-links wheelhouse \
    scipy-openblas32 ml_dtypes rich wheel
step build 360 build.log "$PY" -m pip install -v --no-build-isolation --no-index \
    --find-links wheelhouse -e .
grep -E "mgtrace build:" "$OUT/build.log" | tail -4 >> "$SUMMARY"

# 2. what was built, and what it sees
step doctor 60 doctor.txt "$PY" -m mgtrace doctor
grep -E "^ *cuda" "$OUT/doctor.txt" | head -2 >> "$SUMMARY"

# 3. the CUDA tests (and the build-switch unit tests, which need no GPU)
step tests 120 cuda-tests.log "$PY" -m pytest tests/cuda tests/test_build.py -q -rfEs --tb=short \
    -p no:cacheprovider --junitxml="$OUT/cuda-tests.xml"
tail -3 "$OUT/cuda-tests.log" >> "$SUMMARY"

# 4. the benchmark, next to PyTorch
if [ "${DEVICE_CHECK_BENCH:-1}" != 0 ]; then
    cpu=--no-cpu
    [ "${DEVICE_CHECK_CPU:-0}" = 1 ] && cpu=
    step bench 100 bench_cuda.txt "$PY" benchmarks/bench_cuda.py $cpu --json "$OUT/bench_cuda.json"
    cat "$OUT/bench_cuda.txt" >> "$SUMMARY"
fi
note "done     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
