"""extra_directives are read the way sbatch reads them: an option hpctrain sets is refused
however it is abbreviated or spelled (``--no-requ``, ``--sig=``, ``-J x``, ``--outp /x``).

The option table is checked against the capture of sbatch 22.05 in tests/fixtures/sbatch-22.05,
the resolver against Python's own getopt (an independent getopt_long), and the live check
against a real ``sbatch --test-only -v`` on the dev cluster, which prints the options it
resolved from the script's #SBATCH lines.
"""

from __future__ import annotations

import getopt
import re
import subprocess

import pytest
from hypothesis import given, strategies as st

from hpctrain.config import profile_from_mapping
from hpctrain.config.safety import NOT_JOB_OPTIONS, OWNED_DIRECTIVES
from hpctrain.config.sbatch_options import (ALIASES, LONG_OPTIONS, NONE, REQUIRED, SHORT_OPTIONS,
                                            DirectiveError, long_name, resolve)
from hpctrain.errors import ConfigError
from tests.conftest import REPO

CAPTURE = REPO / "tests" / "fixtures" / "sbatch-22.05"


def refusal(directive: str) -> str | None:
    try:
        profile_from_mapping({"slurm": {"extra_directives": [directive]}}, "p.yaml")
    except ConfigError as e:
        (path, msg), = e.problems
        assert path == "slurm.extra_directives[0]"
        return msg
    return None


@pytest.mark.parametrize("directive, option", [
    ("--no-requ", "no-requeue"), ("--sig=USR1@60", "signal"), ("--outp=/tmp/x", "output"),
    ("--outp /tmp/x", "output"), ("-J x", "job-name"), ("-Jx", "job-name"), ("-HN2", "nodes"),
    ("--tasks-per=4", "ntasks-per-node"), ("--nice --sig=1", "signal"), ("--exclus", "exclusive"),
    # options that take the job out of hpctrain's hands: a blocking sbatch, another cluster,
    # an environment from elsewhere, GPU and memory requests beside hpctrain's own
    ("-W", "wait"), ("--wait", "wait"), ("-M other", "clusters"), ("--cluster=b", "clusters"),
    ("--export-f=/x", "export-file"), ("--get-user-env", "get-user-env"), ("-G 16", "gpus"),
    ("--gpus=16", "gpus"), ("--mem-per-c=4G", "mem-per-cpu"), ("--mem-per-gpu=80G", "mem-per-gpu"),
    ("--gpus-per-task=1", "gpus-per-task"), ("--ntasks-per-gpu=1", "ntasks-per-gpu")])
def test_abbreviated_or_short_owned_options_are_refused_with_the_fix(directive, option):
    msg = refusal(directive)
    assert msg and msg.startswith(f"--{option} is managed by hpctrain") and OWNED_DIRECTIVES[option] in msg


@pytest.mark.parametrize("directive, expect", [
    ("--comm=x", None), ("--comment x", None), ("--mail-type=END", None), ("--nice", None),
    ("--re=x", "ambiguous"), ("--bogus=1", "not an sbatch option"), ("--comment", "needs a value"),
    ("--hold=1", "takes no value"), ("--vers", "not a job option"), ("-Z", "not an sbatch option")])
def test_other_directives(directive, expect):
    msg = refusal(directive)
    assert (msg is None) if expect is None else (expect in msg)


def test_table_is_sbatchs_captured_table():
    probe = (CAPTURE / "long-prefix-probe.txt").read_text()
    listed = set(re.findall(r"'--([a-z-]+)'", probe))
    documented = set(re.findall(r"--([a-z][a-z-]*[a-z])", (CAPTURE / "help.txt").read_text()
                                + (CAPTURE / "usage.txt").read_text()))
    assert listed | {"job-name", "kill-on-invalid-dep", "licenses"} == set(LONG_OPTIONS)
    assert documented <= set(LONG_OPTIONS)
    for line in (CAPTURE / "has-arg-probe.txt").read_text().splitlines():
        name = line.split()[0][2:]
        if "allow an argument" in line:
            assert LONG_OPTIONS[name] == NONE, name
    for letter, name in re.findall(r"-([A-Za-z]), --([a-z-]+)", (CAPTURE / "help.txt").read_text()):
        assert SHORT_OPTIONS[letter] == ALIASES.get(name, name)


_plain = [n for n, a in LONG_OPTIONS.items() if a in (NONE, REQUIRED)]
_word = st.one_of(
    st.builds(lambda n, k, v: f"--{n[:k]}" + (f"={v}" if LONG_OPTIONS[n] == REQUIRED else ""),
              st.sampled_from(_plain), st.integers(1, 30), st.sampled_from(["1", "x", "a:b"])),
    st.builds(lambda n, k: f"--{n[:k]}", st.sampled_from(_plain), st.integers(1, 30)),
    st.sampled_from(["1", "x"]))


@given(st.lists(_word, min_size=1, max_size=3))
def test_resolution_matches_getopt_long(words):
    """Python's getopt implements getopt_long's prefix rules: both must agree on every argv
    built from options with no value or a required one."""
    longopts = [n + ("=" if a == REQUIRED else "") for n, a in LONG_OPTIONS.items()
                if a in (NONE, REQUIRED)]
    argv = list(words)
    rest: list = []
    try:
        theirs, rest = getopt.getopt(argv, "", longopts)
    except getopt.GetoptError:
        theirs = None
    try:
        ours = resolve(argv)
    except DirectiveError:
        ours = None
    if theirs is None or rest:
        assert ours is None or rest
        return
    assert ours is not None
    assert [(o.name, o.value or "") for o in ours] == [(ALIASES.get(n[2:], n[2:]), v)
                                                      for n, v in theirs]


@given(st.sampled_from(sorted(OWNED_DIRECTIVES)), st.integers(1, 30),
       st.sampled_from(["=", " "]), st.booleans())
def test_every_spelling_of_an_owned_option_is_refused(option, cut, sep, short):
    letters = [k for k, v in SHORT_OPTIONS.items() if v == option]
    if short and letters:
        directive = f"-{letters[0]}" + ("" if LONG_OPTIONS[option] == NONE else f"{sep.strip()}1")
    else:
        prefix = option[:cut]
        try:
            if long_name(prefix) != option and ALIASES.get(long_name(prefix)) != option:
                return
        except DirectiveError:
            return
        directive = f"--{prefix}" + ("" if LONG_OPTIONS[option] != REQUIRED else f"{sep}1")
    msg = refusal(directive)
    assert msg and f"--{option} is managed by hpctrain" in msg


VALUES = {"job-name": "abc", "nodes": "1", "ntasks": "1", "ntasks-per-node": "1",
          "gpus-per-node": "1", "gres": "gpu:1", "partition": "debug", "account": "root",
          "qos": "normal", "reservation": "r1", "time": "10", "cpus-per-task": "1", "mem": "100",
          "constraint": "x", "exclusive": "user", "exclude": "n9", "signal": "USR1@60",
          "output": "/tmp/o", "error": "/tmp/e", "open-mode": "append", "chdir": "/tmp",
          "array": "1-2", "dependency": "singleton", "export": "NONE", "export-file": "/tmp/env",
          "get-user-env": "10", "gpus": "1", "gpus-per-task": "1", "ntasks-per-gpu": "1",
          "mem-per-cpu": "100", "mem-per-gpu": "100", "clusters": "hpctrain-dev"}


def shortest_prefix(name: str) -> str:
    return next(name[:n] for n in range(1, len(name) + 1) if _resolves(name[:n], name))


def _resolves(prefix: str, name: str) -> bool:
    try:
        return long_name(prefix) == name
    except DirectiveError:
        return False


@pytest.mark.slurm
def test_sbatch_expands_the_abbreviations_hpctrain_refuses(slurm_cluster, tmp_path):
    """A real sbatch 22.05 reads each owned option's shortest unique prefix (per the frozen
    table) in an #SBATCH line as that option: the refusals above are not hypothetical."""
    for name in sorted(OWNED_DIRECTIVES):
        if name == "wrap":   # sbatch ignores --wrap inside a script
            continue
        prefix = shortest_prefix(name)
        directive = f"--{prefix}" if LONG_OPTIONS[name] == NONE else f"--{prefix}={VALUES.get(name, 'x')}"
        script = tmp_path / f"{name}.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH {directive}\ntrue\n")
        proc = subprocess.run(["sbatch", "--test-only", "-v", str(script)], capture_output=True,
                              text=True, timeout=60)
        defined = {line.split(":")[1].strip() for line in proc.stderr.splitlines()
                   if re.match(r"sbatch: \S+\s+: ", line)}
        assert name in defined, f"{directive}: {proc.stderr[-500:]}"
        assert refusal(directive) is not None
