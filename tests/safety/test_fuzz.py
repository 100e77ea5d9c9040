"""Fuzz: every leaf of every shipped job and profile, replaced by wrong types, huge, negative and
non-finite numbers, long and binary strings, through ``validate``, ``render``, ``plan``,
``profiles validate`` and ``submit --dry-run``.

Zero tracebacks, zero hangs (each command runs under a timeout), and every refusal is an
``Error:`` line with exit code 2; a value the schema refuses is refused by name (the field's
path is in the message). The commands run in process (click's runner) so the whole matrix
takes seconds; a few subprocess runs in test_bad_files.py prove the real exit codes.

A document the schema refuses is refused at load, the same way by every command: the loader's
verdict is checked for every such case (it must name the field), and every third one also goes
through one command (in turn, so every command sees every kind of refusal). A document the
schema accepts goes through all of them: that is where a bad value would reach the planner,
the template or the file system. Profiles are exercised with examples/tiny.yaml (on one node of
the large ones, where its layout is valid); jobs on a shipped profile their layout fits.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.config import job_from_mapping, profile_from_mapping
from hpctrain.errors import ConfigError
from tests.conftest import REPO
from tests.safety import corpus

BINARY = "".join(chr(i) for i in range(1, 256)) + "\ud800\ufffe\uffff"
WRONG_TYPES = [[], {}, True, None, "x"]
NUMBERS = [0, -1, 0.5, 10**30, -2**63, 1e308, 1e-300, math.nan, math.inf, "nan", "1e999"]
STRINGS = ["a" * 10_000, BINARY, "", 10**30]
LISTS = [[10**30], ["a" * 10_000], [None], [BINARY]]
CLI_EVERY_NTH_REFUSAL = 3
PER_COMMAND_TIMEOUT_S = 60


def mutations(value) -> list:
    if isinstance(value, bool):
        return WRONG_TYPES + [0, 1, "yes"]
    if isinstance(value, (int, float)):
        return WRONG_TYPES + NUMBERS
    if isinstance(value, list):
        return WRONG_TYPES + LISTS
    if isinstance(value, dict):
        return WRONG_TYPES
    return WRONG_TYPES + STRINGS   # strings and nulls


def absolute_paths(data: dict, folder: Path) -> dict:
    """The job's relative paths made absolute, so a copy written elsewhere reads the same data."""
    d = data.get("data", {})
    if "path" in d:
        d["path"] = str((folder / d["path"]).resolve())
    if d.get("prepare_from"):
        d["prepare_from"] = [str((folder / f).resolve()) for f in d["prepare_from"]]
    for name in ("blend", "valid_blend", "test_blend"):
        for entry in d.get(name) or []:
            entry["path"] = str((folder / entry["path"]).resolve())
            entry["prepare_from"] = [str((folder / f).resolve())
                                     for f in entry.get("prepare_from", [])]
    if d.get("tokenizer") not in (None, "byte"):
        d["tokenizer"] = str((folder / d["tokenizer"]).resolve())
    return data


def sections(data: dict):
    for k, v in data.items():
        if isinstance(v, dict):
            yield (k,), v


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` in the CLI can swallow it."""


def _alarm(signum, frame):
    raise Hang()


def invoke(runner: CliRunner, args: list[str]):
    signal.setitimer(signal.ITIMER_REAL, PER_COMMAND_TIMEOUT_S)
    try:
        return runner.invoke(cli, args, catch_exceptions=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=False)


@pytest.fixture
def alarm():
    old = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.signal(signal.SIGALRM, old)


def build_cases(tmp: Path):
    """(label, kind, mutated data, dotted field, the other document, extra options) for every
    leaf × mutation."""
    cases = []
    tiny = tmp / "tiny.yaml"
    tiny.write_text(dump(absolute_paths(corpus.load_yaml(REPO / "examples" / "tiny.yaml"),
                                        REPO / "examples")))
    for pfile in corpus.PROFILES:
        pdata = corpus.load_yaml(pfile)
        extra = ["--nodes", "1"] if pdata["slurm"].get("nodes", 1) > 1 and \
            pdata["slurm"].get("gpus_per_node", 1) > 4 else []
        leaves = list(corpus.leaves(pdata)) + list(sections(pdata))
        for path, value in leaves:
            for m in mutations(value):
                cases.append((f"{pfile.stem}:{corpus.dotted(path)}={m!r:.40}", "profile",
                              corpus.with_value(pdata, path, m), corpus.dotted(path), tiny, extra))
    for jfile in corpus.EXAMPLE_JOBS:
        jdata = absolute_paths(corpus.load_yaml(jfile), jfile.parent)
        home, pdata = corpus.home_profile(jfile)
        pfile = tmp / f"home-{jfile.stem}.yaml"
        pfile.write_text(dump(pdata))
        leaves = list(corpus.leaves(jdata)) + list(sections(jdata))
        for path, value in leaves:
            for m in mutations(value):
                cases.append((f"{jfile.stem}:{corpus.dotted(path)}={m!r:.40}", "job",
                              corpus.with_value(jdata, path, m), corpus.dotted(path), pfile, []))
    return cases


def schema_refusal(kind: str, data: dict) -> ConfigError | None:
    """The loader's verdict on the document alone."""
    try:
        if kind == "profile":
            profile_from_mapping(data, "mutated", "mutated")
        else:
            job_from_mapping(data, "mutated")
    except ConfigError as e:
        return e
    return None


def test_fuzz_every_leaf_through_every_command(tmp_path, alarm):
    runner = CliRunner()
    cases = build_cases(tmp_path)
    problems: list[str] = []
    started = time.monotonic()
    runs = 0
    accepted = refused = 0
    for n, (label, kind, data, field, other, extra) in enumerate(cases):
        refusal = schema_refusal(kind, data)
        if refusal is not None:
            # the field's own path, a section or item of it, or (a cross-field check) its name
            # in the message of the field it conflicts with
            if not any(p == field or p.startswith((field + ".", field + "["))
                       or field.startswith((p + ".", p + "[")) or field in m
                       for p, m in refusal.problems if p):
                problems.append(f"{label}: refused without naming {field}: {refusal}")
            refused += 1
            if refused % CLI_EVERY_NTH_REFUSAL:
                continue
        else:
            accepted += 1
        doc = tmp_path / f"case-{n}.yaml"
        doc.write_text(dump(data))
        if kind == "profile":
            job, profile = str(other), str(doc)
            commands = [["profiles", "validate", profile]]
        else:
            job, profile = str(doc), str(other)
            commands = []
        commands += [["validate", job, "-p", profile, *extra],
                     ["render", job, "-p", profile, *extra, "--run-dir", str(tmp_path / "run")],
                     ["plan", job, "-p", profile, *extra],
                     ["submit", job, "-p", profile, *extra, "--dry-run", "--runs-dir",
                      str(tmp_path / "runs")]]
        if refusal is not None:
            commands = [commands[(refused // CLI_EVERY_NTH_REFUSAL) % len(commands)]]
        for args in commands:
            runs += 1
            try:
                result = invoke(runner, args)
            except Hang:
                problems.append(f"{label}: `{args[0]}` did not finish in {PER_COMMAND_TIMEOUT_S} s")
                continue
            problems += check(label, args, result, field if refusal is not None else None)
    elapsed = time.monotonic() - started
    print(f"{len(cases)} cases ({accepted} accepted by the schema), {runs} commands, "
          f"{elapsed:.0f} s")
    assert accepted and refused
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


def check(label: str, args: list[str], result, field: str | None) -> list[str]:
    """What is wrong with one command's outcome (nothing, ideally)."""
    where = f"{label}: `hpctrain {args[0]}{' ' + args[1] if args[0] == 'profiles' else ''}`"
    out = result.output + (result.stderr if result.stderr not in result.output else "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return [f"{where} raised {type(result.exception).__name__}: {result.exception}"]
    if "Traceback" in out or "internal error" in out:
        return [f"{where} printed a traceback or an internal error: {out[-500:]}"]
    code = result.exit_code
    if code == 0:
        return []
    if code == 1 and args[0] == "plan" and "No valid layout" in out:
        return []
    if code != 2:
        return [f"{where} exited {code}: {out[-300:]}"]
    if "Error: " not in result.stderr:
        return [f"{where} exited 2 without an `Error:` line: {out[-300:]}"]
    if field and field not in result.stderr and field.split("[")[0] not in result.stderr:
        return [f"{where} refused without naming {field}: {result.stderr[-300:]}"]
    return []
