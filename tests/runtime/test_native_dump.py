"""A rank's native stack dump on a hang (``watchdog.native_dump``): py-spy's native unwinding
fails now and then on a thread that moves under it (captured: ``UNW_EINVAL``); the dump is
tried again and the file gets the good one. Real py-spy on this test's own process; the
failure is the captured output, replayed once by a stand-in in front of the real py-spy."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from hpctrain.runtime import watchdog

FAILURE = Path(__file__).parents[1] / "fixtures" / "py-spy" / "dump-native-unw-einval.txt"
NATIVE_FRAME = re.compile(r"\(lib[\w.+-]*\.so[\d.]*\)")


def flaky_py_spy(tmp_path: Path, failures: int) -> Path:
    """A py-spy that prints the captured failure (exit 1) on its first ``failures`` calls,
    then runs the real one."""
    real = shutil.which("py-spy")
    assert real, "py-spy is installed with the test dependencies"
    exe = tmp_path / "py-spy"
    exe.write_text(f"""#!/bin/sh
n=$(cat {tmp_path}/calls 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {tmp_path}/calls
if [ $n -le {failures} ]; then cat {FAILURE}; exit 1; fi
exec {real} "$@"
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def calls(tmp_path: Path) -> int:
    return int((tmp_path / "calls").read_text())


def test_a_failed_native_unwind_is_tried_again_and_the_good_dump_kept(tmp_path):
    watchdog._allow_tracing_by_children()
    out = watchdog.native_dump(str(flaky_py_spy(tmp_path, failures=2)), os.getpid())
    assert calls(tmp_path) == 3
    assert "UNW_EINVAL" not in out and "py-spy failed" not in out, out
    assert f"Process {os.getpid()}" in out and NATIVE_FRAME.search(out), out


def test_a_dump_that_keeps_failing_says_so_and_stops_after_its_tries(tmp_path):
    out = watchdog.native_dump(str(flaky_py_spy(tmp_path, failures=99)), os.getpid(), tries=3)
    assert calls(tmp_path) == 3
    assert "UNW_EINVAL" in out and out.endswith("py-spy failed (exit 1, try 3 of 3)\n"), out
    assert out.count("Error: Failed to get stack traces") == 1       # the last failure only


def test_a_dump_whose_time_is_spent_tries_nothing(tmp_path):
    """The dump's time bound covers every try: none is started once it is spent."""
    assert watchdog.native_dump(str(flaky_py_spy(tmp_path, failures=0)), os.getpid(),
                                timeout_s=0) == ""
    assert not (tmp_path / "calls").exists()
