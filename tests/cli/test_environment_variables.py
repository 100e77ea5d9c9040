"""The environment variables a user sets for hpctrain (``HPCTRAIN_PROFILE_PATH``,
``HPCTRAIN_RUNS_DIR``, ``HPCTRAIN_DEBUG``) and the one it borrows (``HOME``), set to what a
shell can hold: empty, blank, a file, a FIFO, a line break, an escape code, a name too long, a
symlink loop, ``~`` of no user. Each is used, skipped as documented, or refused with one
``Error:`` line naming the variable and the fix, exit 2, never a traceback."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, strategies as st

from hpctrain.config.loader import profile_search_path
from hpctrain.errors import UsageError
from tests.conftest import REPO, hpctrain, one_error_line

TINY = str(REPO / "examples" / "tiny.yaml")


@pytest.fixture
def places(tmp_path):
    (tmp_path / "a-file.yaml").write_text("name: mine\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text(
        (REPO / "cluster_profiles" / "local.yaml").read_text().replace("name: local", "name: mine"))
    return tmp_path


@pytest.mark.parametrize("entry, said", [
    ("{}/a-file.yaml", "is a file, not a folder (give one profile file with --profile FILE)"),
    ("{}/fifo", "is a FIFO, not a folder"),
    ("{}/loop", "Too many levels of symbolic links"),
    ("{}/a\nb", "holds a line feed"),
    ("{}/\x1b]0;t\x07", "holds the control character U+001B"),
    ("{}/" + "n" * 300, "a file or folder name may have at most 255"),
])
def test_a_profile_path_entry_that_cannot_be_a_folder_is_named_with_the_fix(places, entry, said):
    """An entry that was a file (the variable set to one profile file) was skipped in silence,
    so `-p mine` was "unknown profile"; a name too long was an error naming no variable."""
    env = {"HPCTRAIN_PROFILE_PATH": f"{places}/profiles:" + entry.format(places)}
    for command in (["profiles", "list"], ["validate", TINY, "-p", "mine"]):
        proc = hpctrain(*command, env=env)
        one_error_line(proc, "$HPCTRAIN_PROFILE_PATH: the entry", said,
                       "separated by ':'; fix it or unset it")


def test_empty_and_missing_profile_path_entries_are_skipped(places):
    env = {"HPCTRAIN_PROFILE_PATH": f"::{places}/not-mounted:{places}/profiles:"}
    proc = hpctrain("validate", TINY, "-p", "mine", env=env)
    assert proc.returncode == 0, proc.stderr
    # `hpctrain runs` does not need a profile: a bad entry does not stop it
    proc = hpctrain("runs", "--runs-dir", str(places / "runs"),
                    env={"HPCTRAIN_PROFILE_PATH": str(places / "fifo")})
    assert proc.returncode == 0, proc.stderr


def test_profile_names_found_on_disk_are_listed_in_the_printable_form(places):
    (places / "profiles" / "x\x1b]0;title\x07.yaml").write_text("name: [\n")
    proc = hpctrain("profiles", "list", env={"HPCTRAIN_PROFILE_PATH": str(places / "profiles")})
    assert proc.returncode == 0, proc.stderr
    assert "'x\\x1b]0;title\\x07' INVALID:" in proc.stdout
    assert all(line.isprintable() for line in proc.stdout.splitlines())


def test_a_home_folder_that_cannot_be_looked_in_is_skipped(tmp_path):
    proc = hpctrain("profiles", "list", env={"HOME": "/" + "h" * 300})
    assert proc.returncode == 0 and "local" in proc.stdout, proc.stderr


@given(st.lists(st.text(alphabet="ab/:\n\x1b .", max_size=8), max_size=4))
def test_any_profile_path_gives_folders_or_one_usage_error(entries):
    """Property: whatever the variable holds, the search path is a list of folders or one
    UsageError naming the variable, on one printable line."""
    old = os.environ.get("HPCTRAIN_PROFILE_PATH")
    os.environ["HPCTRAIN_PROFILE_PATH"] = ":".join(entries)
    try:
        dirs = profile_search_path()
    except UsageError as e:
        assert str(e).startswith("$HPCTRAIN_PROFILE_PATH: the entry") and str(e).isprintable()
    else:
        assert dirs[-1] == REPO / "cluster_profiles" or dirs[-1].name == "cluster_profiles"
    finally:
        if old is None:
            del os.environ["HPCTRAIN_PROFILE_PATH"]
        else:
            os.environ["HPCTRAIN_PROFILE_PATH"] = old


@pytest.mark.parametrize("value, said", [
    ("{}/a-file.yaml", "is a file, not a folder"),
    ("{}/fifo", "is a FIFO, not a folder"),
    ("{}/a-file.yaml/runs", "a-file.yaml on the way is a file, not a folder"),
    ("/dev/null", "is a character device, not a folder"),
    ("~no-such-user-here/runs", "~no-such-user-here is no user's home folder here"),
    ("{}/loop", "symlink loop"),
    (" ", "is blank"),
])
def test_a_runs_dir_variable_that_cannot_be_a_runs_root_is_named(places, value, said):
    """Before, a FIFO was "--runs-dir ...: not a folder" (naming an option nobody typed) and
    ``~nouser/runs`` "a symlink loop?"."""
    proc = hpctrain("runs", env={"HPCTRAIN_RUNS_DIR": value.format(places)})
    one_error_line(proc, "$HPCTRAIN_RUNS_DIR", said, "name a folder")
    proc = hpctrain("runs", "--runs-dir", value.format(places))
    one_error_line(proc, "--runs-dir", said)


def test_an_empty_runs_dir_variable_is_unset(places):
    proc = hpctrain("runs", env={"HPCTRAIN_RUNS_DIR": ""})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value, traceback", [("", False), ("0", False), ("false", False),
                                              ("No", False), ("off", False), ("1", True),
                                              ("yes", True)])
def test_hpctrain_debug_0_means_off(tmp_path, value, traceback):
    """``HPCTRAIN_DEBUG=0`` showed tracebacks: any value but empty turned them on."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n")
    proc = hpctrain("data", "prepare", str(corpus), "-o", "/proc/hpctrain-test/x",
                    env={"HPCTRAIN_DEBUG": value})
    assert proc.returncode != 0
    assert ("Traceback" in proc.stderr) == traceback, proc.stderr
    if not traceback:
        one_error_line(proc, "/proc/hpctrain-test")


_NCCL = ["NCCL_NET_GDR_LEVEL", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE",
         "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_DEBUG", "NCCL_ALGO"]


@given(st.dictionaries(st.sampled_from(_NCCL),
                       st.one_of(st.text(max_size=12), st.sampled_from(["²", "٣", "9" * 5000,
                                                                       "^=mlx5_0:1,", ":", "^"]))))
def test_any_nccl_variable_is_a_preflight_row_not_a_crash(env):
    """Property: whatever the NCCL variables of the environment hold, preflight's NCCL checks
    give rows (``NCCL_NET_GDR_LEVEL=²`` was a ValueError from int(): "²".isdigit() is true)."""
    from hpctrain.config import load_profile
    from hpctrain.preflight.nccl_env import check_nccl_env
    rows = check_nccl_env(env, load_profile("h100-ib-pyxis"), {"mlx5_0": {1}}, ["lo", "ib0"], 2,
                          "node1")
    assert rows and all(isinstance(r.measured, str) for r in rows)
