"""Tests write only under pytest's temporary folders: conftest points TMPDIR (and wandb's and trackio's folders) at
``<basetemp>/tmp`` for the whole run, so what the library, the benchmarks and the subprocesses the tests start put in
"the temporary directory" (tiny_testbed_*, learning_*, gpu_check_*, torchelastic_*, torch's caches) lands there, and
a run with a fresh TMPDIR leaves only pytest's own folder in it."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _under(path, folder) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def test_the_temporary_directory_is_under_pytests_own_folder(tmp_path_factory):
    basetemp = tmp_path_factory.getbasetemp()
    assert _under(tempfile.gettempdir(), basetemp), tempfile.gettempdir()
    made = tempfile.mkdtemp(prefix="tiny_testbed_")  # what trl_credit/testbed/runner.py does
    assert _under(made, basetemp), made
    for name in ("TMPDIR", "WANDB_DIR", "TRACKIO_DIR"):
        assert _under(os.environ[name], basetemp), (name, os.environ[name])
    # a subprocess a test starts (torchrun, a benchmark script) inherits it
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True)
    assert _under(child.stdout.strip(), basetemp), child.stdout


# Tests that made folders in the system temporary directory before conftest redirected it: gpu_check_* (the
# benchmark's work folder), torchelastic_* (torchrun), tiny_testbed_* (the testbed runner).
REPRESENTATIVE = [
    "tests/test_gpu_check.py::test_tiny_cpu_run_writes_ratios",
    "tests/test_multiprocess_smoke.py",
    "tests/test_testbed.py::test_every_grid_method_trains_two_steps_on_the_reduced_model[grpo]",
]


@pytest.mark.slow  # ~1 minute: a pytest run of its own
def test_a_run_with_a_fresh_tmpdir_leaves_only_pytests_folder(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    env = {**os.environ, "TMPDIR": str(fresh), "TEMP": str(fresh), "TMP": str(fresh), "OMP_NUM_THREADS": "1"}
    for name in ("WANDB_DIR", "TRACKIO_DIR"):  # as a user's shell has them: unset
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", *REPRESENTATIVE],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    left = sorted(p.name for p in fresh.iterdir())
    assert all(name.startswith("pytest-of-") for name in left), left
