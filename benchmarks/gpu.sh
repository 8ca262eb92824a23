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
#
#   GPU_BOARD=board-cnn-b8 GPU_BENCH_S=0 OUT=/tmp/gpu bash benchmarks/gpu.sh
#
# also builds that board from an empty cache on the machine (device auto: the GPU; `--n-jobs auto`:
# a worker per free core, all on the one GPU), timed by the build's own wall ledger (`build_wall` in
# its board.json), and leaves the board folder in $OUT/board.tar.gz. GPU_BENCH_S=0 skips the
# benchmarks, GPU_TESTS_S=0 the tests.
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
    if [ "${GPU_TESTS_S:-240}" != 0 ]; then
        echo "== gpu tests"
        timeout "${GPU_TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
    fi
    if [ "${GPU_BENCH_S:-300}" != 0 ]; then
        echo "== benchmarks (--quick)"
        timeout "${GPU_BENCH_S:-300}" python3 benchmarks/run_all.py --quick --out "$OUT/bench" --only inversion per_example fl
    fi
    if [ -n "${GPU_BOARD:-}" ]; then
        echo "== board $GPU_BOARD from an empty cache ($(nproc) cores, --n-jobs auto, device auto)"
        rm -rf /tmp/gpu-board-cache /tmp/gpu-boards && mkdir -p /tmp/gpu-boards
        # SIGTERM at the limit: the build keeps its wall ledger, so a rerun on a kept cache resumes it
        timeout -s TERM "${GPU_BOARD_S:-480}" python3 -c 'from fedbench.cli import main; main()' \
            leaderboard build "$GPU_BOARD" --n-jobs auto --cache-dir /tmp/gpu-board-cache --dir /tmp/gpu-boards
        echo "build exit $?"
        tar -C /tmp/gpu-boards -czf "$OUT/board.tar.gz" .
        nvidia-smi --query-gpu=memory.used --format=csv,noheader
    fi
} 2>&1 | tee "$OUT/log"
