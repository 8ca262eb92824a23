#!/usr/bin/env bash
# The GPU checks in one command: the `gpu` tests (tests/test_gpu.py) and the benchmarks that run tensors
# (inversion, per_example, fl: `--device auto` picks the GPU), with their logs and JSON under $OUT.
#
#   OUT=/tmp/gpu bash benchmarks/gpu.sh
#
# Written for a bare machine with CUDA torch and no network: fedbench runs from the checkout
# (PYTHONPATH), its missing dependencies come as wheels in .whl/ (pip download them for the machine's
# Python where there is a network), and torch is the machine's own (the CPU pin of pyproject.toml is not
# installed). Each step has its own time limit, so one that hangs leaves the others their time.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to a folder for the logs and results}
mkdir -p "$OUT/bench"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -e fedbench/_presets ] || ln -s ../registry/presets fedbench/_presets  # what the install maps
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
    echo "== gpu tests"
    timeout "${GPU_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
    echo "== benchmarks (--quick)"
    timeout "${GPU_BENCH_S:-300}" python3 benchmarks/run_all.py --quick --out "$OUT/bench" --only inversion per_example fl
} 2>&1 | tee "$OUT/log"
