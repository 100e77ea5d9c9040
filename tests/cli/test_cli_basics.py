"""The CLI's contract: fast start (no torch), help with examples, clean errors and exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpctrain.cli import COMMANDS, cli
from tests.conftest import REPO, hpctrain

HEAVY = ("torch", "megatron", "submitit", "numpy", "matplotlib")

PROBE = """
import atexit, sys
def report():
    heavy = sorted({m.split('.')[0] for m in sys.modules} & set(%r))
    sys.stderr.write('HEAVY=' + ','.join(heavy) + '\\n')
atexit.register(report)
from hpctrain.cli import main
main(sys.argv[1:])
"""


def imported_heavy_modules(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE % (HEAVY,), *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY="):].split(",") if m]


@pytest.mark.parametrize("args", [["--help"], ["render", "examples/tiny.yaml", "-p", "dev-slurm"],
                                  ["validate", "examples/tiny.yaml"], ["profiles", "list"],
                                  ["plan", "--help"], ["preflight", "--help"], ["runs", "--help"],
                                  ["status", "--help"], ["data", "--help"]])
def test_cli_paths_that_do_not_train_import_no_heavy_modules(args):
    # validate opens the indexes of the corpora this machine has (numpy's memmap) to check that
    # every split the job evaluates on holds data; nothing else that does not train imports numpy
    allowed = {"numpy"} if args[0] == "validate" else set()
    assert [m for m in imported_heavy_modules(*args) if m not in allowed] == []


API_PROBE = """
import sys
import hpctrain
objects = [hpctrain.submit, hpctrain.plan, hpctrain.runs, hpctrain.Run, hpctrain.__version__]
import hpctrain.api, hpctrain.record.folder, hpctrain.planner, hpctrain.submission, hpctrain.view.follow
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(%r))
names = [getattr(o, '__qualname__', o) for o in (hpctrain.submit, hpctrain.plan, hpctrain.runs)]
print('HEAVY=' + ','.join(heavy), 'NAMES=' + ','.join(names))
"""


def test_importing_hpctrain_and_its_python_api_imports_no_heavy_module():
    proc = subprocess.run([sys.executable, "-c", API_PROBE % (HEAVY,)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the API's names stay the API's functions after the modules below them are imported
    assert proc.stdout.split() == ["HEAVY=", "NAMES=submit,plan,runs"]


def test_every_command_is_registered_and_has_an_example():
    from click.testing import CliRunner
    runner = CliRunner()
    missing = []
    for name in COMMANDS:
        res = runner.invoke(cli, [name, "--help"])
        if res.exit_code != 0 or "Example" not in res.output:
            missing.append(name)
    assert missing == [], f"commands without a working --help example: {missing}"


def test_unknown_command_is_a_usage_error():
    proc = hpctrain("sumbit")
    assert proc.returncode == 2
    assert "No such command 'sumbit'" in proc.stderr


def test_missing_job_file_is_one_line():
    proc = hpctrain("validate", "nope.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "Error: job file nope.yaml does not exist"
