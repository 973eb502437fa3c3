#!/usr/bin/env bash
# The observer's GPU check (benchmarks/gpu_check.py) on a lent GPU machine, in one command.
#
# 1. HERE, once per session, before calling the device tool (it has no registry there):
#        bash benchmarks/gpu_check.sh prepare
#    fetches the wheels of fabricpace's dependencies that the GPU image lacks (polars, pydantic and
#    their own dependencies; ~58 MB, for CPython ${GPU_PY_VERSION:-3.12}) into .whl/ and ignores that
#    folder in git. plotly is left out (another 10 MB would pass the 64 MiB carry limit): the check
#    then skips `fabricpace report` there and returns the run directories as gpu_check_runs.tar.gz,
#    so `fabricpace report` runs here on them.
# 2. The device tool's call:   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=420)
#    It picks the Python that holds torch with CUDA (GPU_CHECK_PYTHON, else python3 — the image's
#    /opt/torch/.venv one — else python), installs the carried wheels into /tmp/fp-site (no index, no
#    deps), puts the working tree's src/ on PYTHONPATH (nothing is built or installed from it, so no
#    build backend is needed there), and runs every item within a 270 s budget, the whole command
#    within 330 s. Everything lands in $OUT: gpu_check.json, gpu_check.log, gpu_check_runs.tar.gz.
#    Fallback when the wheels do not install (another Python version there): the env item lists what
#    is missing and the items that need it fail with the import error; `prepare` again with
#    GPU_PY_VERSION set to the version gpu_check.log printed. An editable install works too where the
#    image has setuptools>=77: python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/pip install
#    --no-deps --no-build-isolation -e . (then GPU_CHECK_PYTHON=/tmp/v/bin/python).
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = "prepare" ]; then
    py="${PREPARE_PYTHON:-.venv/bin/python}"
    grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    mkdir -p .whl
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d .whl polars==2.1.0 polars-runtime-32==2.1.0 pydantic==2.14.4 pydantic_core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 ijson==3.6.0 || exit 1
    du -sh .whl
    exit 0
fi

OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=""
for c in "${GPU_CHECK_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 python; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
        PY="$c"; break
    fi
done
if [ -z "$PY" ]; then  # no torch with CUDA: run anyway, the check reports CUDA as missing
    PY="${GPU_CHECK_PYTHON:-python3}"
fi
{
    echo "gpu_check.sh: $(date -u +%FT%TZ) python=$(command -v "$PY") $("$PY" -V 2>&1)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
    if ls .whl/*.whl >/dev/null 2>&1; then
        timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/fp-site .whl/*.whl && echo "wheels installed into /tmp/fp-site" \
            || echo "wheels did NOT install (see above): continuing without them"
    else
        echo "no .whl/ carried: using only what the image has"
    fi
} 2>&1 | tee "$OUT/gpu_check.log"
export PYTHONPATH="$PWD/src:/tmp/fp-site${PYTHONPATH:+:$PYTHONPATH}"
set -o pipefail
timeout -k 10 330 "$PY" benchmarks/gpu_check.py --out "$OUT" --budget 270 "$@" 2>&1 | tee -a "$OUT/gpu_check.log"
rc=$?
echo "gpu_check.sh: exit $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$OUT/gpu_check.log"
exit $rc
