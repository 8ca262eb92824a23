""".ci/run: after `make test` it reruns the `numeric` tests under other CPU kernels, and the marker stays on
the tests that depend on torch's float path (issue 26: a test that passed on AVX2 kernels only failed a
fresh clone on an AVX-512 machine).

The script runs for real in a copy of the repository's layout whose `make`, `.venv/bin/python` and CPU
flags are stand-ins that record what they were asked: the order of the steps, the marker expression and
the capability of each rerun, without running the suite again.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RERUN = "-m pytest -q -m numeric and not slow and not gpu"

FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then  # the capability query: what torch would pick under ATEN_CPU_CAPABILITY
  echo "${ATEN_CPU_CAPABILITY:-$FAKE_NATIVE}"
  exit 0
fi
echo "python ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-native} $*" >> "$CALLS"
[ "${ATEN_CPU_CAPABILITY:-}" != "${FAKE_FAIL_UNDER:-none}" ]
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_ci(tmp_path: Path, *, native: str, flags: str, fail_under: str = "none", caller_aten: str = ""):
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    (repo / ".venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy2(ROOT / ".ci" / "run", repo / ".ci" / "run")
    _executable(repo / ".venv" / "bin" / "python", FAKE_PYTHON)
    _executable(bin_dir / "make", '#!/usr/bin/env bash\necho "make $*" >> "$CALLS"\n')
    _executable(bin_dir / "chromium", "#!/usr/bin/env bash\n")  # present: the script installs nothing
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu sse sse2 {flags}\n")
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(calls),
        "FAKE_NATIVE": native,
        "FAKE_FAIL_UNDER": fail_under,
        "FEDBENCH_CPUINFO": str(cpuinfo),
        "FEDBENCH_CACHE_DIR": str(tmp_path / "cache"),
        "ATEN_CPU_CAPABILITY": caller_aten,  # the caller's setting (the suite may run under one)
    }
    if not caller_aten:
        del env["ATEN_CPU_CAPABILITY"]
    out = subprocess.run(["bash", str(repo / ".ci" / "run")], env=env, capture_output=True, text=True)
    return out, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    "native, flags, reruns",
    [
        ("avx512", "avx avx2 avx512f", ["default", "avx2"]),  # the CPU of the issue
        ("avx2", "avx avx2", ["default"]),  # make test already ran on AVX2 kernels
        ("default", "sse4_2", ["default"]),  # no AVX2 to ask for
    ],
)
def test_make_test_then_the_numeric_tests_under_each_capability(tmp_path, native, flags, reruns):
    out, calls = run_ci(tmp_path, native=native, flags=flags)
    assert out.returncode == 0, out.stderr
    assert calls == ["make test"] + [f"python ATEN_CPU_CAPABILITY={cap} {RERUN}" for cap in reruns]
    for cap in reruns:  # each rerun says which kernels it asked for and which torch reports
        said = f"numeric tests under ATEN_CPU_CAPABILITY={cap}: torch uses {cap} (native: {native})"
        assert said in out.stdout


def test_a_numeric_failure_under_one_capability_fails_ci_after_every_rerun(tmp_path):
    out, calls = run_ci(tmp_path, native="avx512", flags="avx2", fail_under="default")
    assert out.returncode != 0
    assert len(calls) == 3  # the avx2 rerun still ran: CI reports every capability that fails
    assert "ATEN_CPU_CAPABILITY: default" in out.stderr


def test_make_test_is_the_readme_command_and_the_marker_is_registered():
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python -m pytest -q" in recipe  # the whole suite; the reruns are .ci/run's
    assert "make test" in (ROOT / "README.md").read_text()
    pytest_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("numeric:") for m in pytest_cfg["markers"])


def _numeric_tests(path: Path) -> set[str]:
    """Names of the tests in `path` marked numeric, by a decorator or the module's `pytestmark`."""
    tree = ast.parse(path.read_text())
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    module = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and "pytest.mark.numeric" in ast.unparse(n.value)
        for n in tree.body
    )
    if module:
        return {t.name for t in tests}
    return {t.name for t in tests if any(ast.unparse(d) == "pytest.mark.numeric" for d in t.decorator_list)}


#: Tests whose assertions ride on a float path: if one loses the marker, no capability reruns it.
KNOWN_NUMERIC = {
    "test_attacks_inversion.py": [
        "test_plateau_schedule_reaches_the_paper_schedules_objective_sooner",  # the test of the issue
        "test_idlg_and_dlg_reach_high_psnr",
        "test_batched_ig_equals_separate_runs",
    ],
    "test_fl.py": ["test_dp_gaussian_noise_stream_is_unchanged", "test_fedavg_one_step_equals_fedsgd"],
    "test_ghost_clipping.py": ["test_fed_cdp_ghost_equals_materialise"],
    "test_models.py": ["test_per_example_grads_match_loop"],
    "test_membership.py": ["test_loss_and_direct_attacks_detect_a_memorising_model"],
    "test_sdan.py": ["test_poisoning_replaces_fc1_and_recovers_the_batch"],
    "test_loda.py": ["test_decoding_breaks_mixup_given_its_encodings"],
}


@pytest.mark.parametrize("module", sorted(KNOWN_NUMERIC))
def test_float_path_tests_carry_the_numeric_marker(module):
    marked = _numeric_tests(ROOT / "tests" / module)
    assert set(KNOWN_NUMERIC[module]) <= marked, set(KNOWN_NUMERIC[module]) - marked


def test_the_numeric_set_is_large_enough_to_mean_something():
    """Marks are not dropped wholesale: 66 test functions in 17 files carried it when this was written."""
    counts = {p.name: len(_numeric_tests(p)) for p in (ROOT / "tests").glob("test_*.py")}
    assert sum(counts.values()) >= 60 and sum(1 for c in counts.values() if c) >= 12, counts


def test_the_native_capability_is_the_cpus_whatever_the_caller_set(tmp_path):
    """Run under ATEN_CPU_CAPABILITY=default (as a whole suite may be), an AVX-512 CPU still reruns
    under default and avx2: the native choice is read with the variable unset."""
    out, calls = run_ci(tmp_path, native="avx512", flags="avx avx2 avx512f", caller_aten="default")
    assert out.returncode == 0, out.stderr
    assert [c.split()[1] for c in calls[1:]] == ["ATEN_CPU_CAPABILITY=default", "ATEN_CPU_CAPABILITY=avx2"]
    assert "(native: avx512)" in out.stdout
