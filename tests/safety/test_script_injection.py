"""No value reaches the batch script as a command or as a stray #SBATCH directive.

Every string field of every shipped profile and every shipped job, and every path the script
is rendered with, is replaced in turn by each payload of a corpus (newlines before and after,
CRLF, NUL, quotes, ``$(...)``, backticks, ``${IFS}``, ``;``, ``|``, ``&&``, Unicode line
separators, ...). Each case is either refused with a clear error naming the value, or rendered;
every rendered script then runs under bash with Slurm's commands stubbed. Nothing may run
(a canary file is never created), the script must run to its end, sbatch must read exactly the
directives hpctrain meant (the clean render's, in its order, with this case's values), and
the values must arrive intact where they are used (srun's arguments, the rank environment).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.config import job_from_mapping, profile_from_mapping, resolve
from hpctrain.errors import ConfigError, UsageError
from hpctrain.scheduler.slurm.render import (ScriptInputs, render_sbatch, render_step_script,
                                   sbatch_directives)
from tests.conftest import REPO
from tests.safety import corpus, stubs


@dataclasses.dataclass
class Case:
    label: str
    home: str                           # the profile the case renders on
    profile: dict
    job: dict
    field: str                          # the loader's name of what was changed ("" for inputs)
    inputs: dict                        # ScriptInputs overrides
    kind: str = "train"
    env: tuple[str, str] | None = None  # an env entry whose value must reach the ranks
    payload: str = ""
    dir: Path | None = None
    script: str = ""
    expected: list[str] = dataclasses.field(default_factory=list)
    run_dir: str = ""
    python: str = ""
    step_python: str = ""
    submitit_dir: str = ""


def _job_for(profile_path: Path) -> Path:
    return REPO / "examples" / ("llama2-7b.yaml" if profile_path.stem in ("h100-ib-pyxis", "a100-roce")
                                else "tiny.yaml")


def profile_cases(payload_list) -> list[Case]:
    cases = []
    for pfile in corpus.PROFILES:
        pdata, jdata = corpus.load_yaml(pfile), corpus.load_yaml(_job_for(pfile))
        for path, kind in corpus.PROFILE_STRINGS:
            for i, payload in enumerate(payload_list):
                label = f"{pfile.stem}:{corpus.dotted(path)}#{i}"
                home = pfile.stem
                if kind == "str":
                    cases.append(Case(label, home, corpus.with_value(pdata, path, payload), jdata,
                                      corpus.dotted(path), {}, payload=payload))
                elif kind == "list":
                    cases.append(Case(label, home, corpus.with_value(pdata, path, [payload]), jdata,
                                      corpus.dotted(path) + "[0]", {}, payload=payload))
                else:
                    cases.append(Case(label + ":value", home, corpus.with_value(
                        pdata, path, {"HPCTRAIN_TEST_VALUE": payload}), jdata,
                        corpus.dotted(path), {}, env=("HPCTRAIN_TEST_VALUE", payload), payload=payload))
                    cases.append(Case(label + ":key", home, corpus.with_value(
                        pdata, path, {payload: "1"}), jdata, corpus.dotted(path), {}, payload=payload))
    # the preflight step script of every profile, with the payload in its most exposed fields
    for pfile in corpus.PROFILES:
        pdata, jdata = corpus.load_yaml(pfile), corpus.load_yaml(_job_for(pfile))
        for i, payload in enumerate(payload_list):
            cases.append(Case(f"{pfile.stem}:preflight:env#{i}", pfile.stem, corpus.with_value(
                pdata, ("env",), {"HPCTRAIN_TEST_VALUE": payload}), jdata, "env", {},
                kind="preflight", env=("HPCTRAIN_TEST_VALUE", payload), payload=payload))
            cases.append(Case(f"{pfile.stem}:preflight:name#{i}", pfile.stem, corpus.with_value(
                pdata, ("name",), payload), jdata, "name", {}, kind="preflight", payload=payload))
    return cases


def one_corpus(jdata: dict) -> dict:
    """The job with its blend's last corpus as ``data.path``, so that every string field of
    ``data`` (``path`` and ``prepare_from`` among them) can be given a payload."""
    data = jdata.get("data", {})
    if "blend" in data:
        last = data.pop("blend")[-1]
        data["path"], data["prepare_from"] = last["path"], last.get("prepare_from")
    return jdata


def job_cases(payload_list) -> list[Case]:
    cases = []
    for jfile in corpus.JOBS:
        home, pdata = corpus.home_profile(jfile)
        jdata = one_corpus(corpus.load_yaml(jfile))
        for path, kind in corpus.JOB_STRINGS:
            for i, payload in enumerate(payload_list):
                value = [payload] if kind == "list" else payload
                field = corpus.dotted(path) + ("[0]" if kind == "list" else "")
                cases.append(Case(f"{jfile.stem}:{corpus.dotted(path)}#{i}", home, pdata,
                                  corpus.with_value(jdata, path, value), field, {}, payload=payload))
    return cases


INPUT_FIELDS = ("run_dir", "python", "step_python", "submitit_dir", "array_run_dirs",
                "dependency", "extra_excludes")


def input_cases(payload_list) -> list[Case]:
    cases = []
    for pname in ("dev-slurm", "h100-ib-pyxis"):
        pfile = REPO / "cluster_profiles" / f"{pname}.yaml"
        pdata, jdata = corpus.load_yaml(pfile), corpus.load_yaml(_job_for(pfile))
        for name in INPUT_FIELDS:
            for i, payload in enumerate(payload_list):
                cases.append(Case(f"{pname}:inputs.{name}#{i}", pname, pdata, jdata, "",
                                  {name: payload}, payload=payload))
    return cases


def _inputs(case: Case, work: Path, stub_python: Path) -> ScriptInputs:
    """The case's ScriptInputs; a path payload sits inside the case's folder (dirs it names
    are created later, so the script can change into them)."""
    base = case.dir
    values = dict(run_dir=str(base / "run"), python=str(stub_python), step_python="python3",
                  submitit_dir=str(base / "run" / "submitit"), kind=case.kind)
    for name, payload in case.inputs.items():
        if name in ("run_dir", "submitit_dir", "python"):
            values[name] = f"{base}/p/{name}{payload}"
        elif name == "array_run_dirs":
            values[name] = [str(base / "run0"), f"{base}/p/d{payload}"]
        elif name == "extra_excludes":
            values[name] = [payload]
        else:
            values[name] = payload
    return ScriptInputs(**values)


def _refusal_ok(case: Case, err: Exception) -> str | None:
    """None if the refusal is a clear one naming what was wrong, else why not."""
    text = str(err)
    if not text.strip():
        return "empty error message"
    if isinstance(err, ConfigError) and case.field:
        fields = [p for p, _ in err.problems]
        if not any(f == case.field or f.startswith(case.field + ".") or f.startswith(case.field + "[")
                   for f in fields):
            return f"the error does not name {case.field}: {fields}"
    return None


def render(case: Case, work: Path, stub_python: Path) -> str | None:
    """Render the case: None when refused (checked to be a clear refusal), else the script."""
    try:
        profile = profile_from_mapping(case.profile, "profile.yaml", "profile")
        job = job_from_mapping(case.job, "job.yaml")
        resolved = resolve(job, profile)
        inputs = _inputs(case, work, stub_python)
        if case.kind == "train":
            script = render_sbatch(resolved, inputs)
            job_name = job.name
        else:
            script = render_step_script(profile, inputs)
            job_name = f"hpctrain-{case.kind}"
    except (ConfigError, UsageError) as e:
        why = _refusal_ok(case, e)
        assert why is None, f"{case.label}: {why}"
        return None
    case.expected = [f"--{k}" if v is None else f"--{k}={v}"
                     for k, v in sbatch_directives(profile, job_name, inputs)]
    case.expected += list(profile.slurm.extra_directives)
    case.run_dir = inputs.array_run_dirs[1] if inputs.array_run_dirs else inputs.run_dir
    case.python, case.step_python, case.submitit_dir = (inputs.python, inputs.step_python,
                                                        inputs.submitit_dir)
    try:
        for d in [inputs.run_dir, case.run_dir] + list(inputs.array_run_dirs):
            os.makedirs(d, exist_ok=True)
        if inputs.python != str(stub_python):
            stubs.install_python_at(inputs.python)
    except (OSError, ValueError) as e:   # a folder no file system can hold was accepted
        raise AssertionError(f"{case.label}: rendered with a path that cannot exist: {e}") from None
    return script


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args]


@pytest.fixture(scope="module")
def canary():
    # a short path without spaces: the payloads carry it
    d = Path(tempfile.mkdtemp(prefix="hpct-canary-"))
    yield d / "ran"
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def test_no_value_runs_a_command_or_moves_a_directive(tmp_path, canary):
    payload_list = corpus.payloads(str(canary))
    bin_dir, stub_python = stubs.install(tmp_path)
    clean_flags = {}
    for pfile in corpus.PROFILES:
        case = Case("clean", pfile.stem, corpus.load_yaml(pfile), corpus.load_yaml(_job_for(pfile)),
                    "", {})
        case.dir = tmp_path / f"clean-{pfile.stem}"
        clean_flags[pfile.stem] = _flags(corpus.sbatch_reads(render(case, tmp_path, stub_python)))
        assert clean_flags[pfile.stem][0] == "--job-name"
    cases = profile_cases(payload_list) + job_cases(payload_list) + input_cases(payload_list)
    rendered, refused = [], 0
    for n, case in enumerate(cases):
        case.dir = tmp_path / f"c{n:05d}"
        case.dir.mkdir()
        script = render(case, tmp_path, stub_python)
        if script is None:
            refused += 1
            continue
        (case.dir / "script.sh").write_text(script, encoding="utf-8", errors="surrogateescape")
        case.script = script
        rendered.append(case)
    assert refused and rendered, (refused, len(rendered))

    problems = []
    for case in rendered:
        try:
            reads = corpus.sbatch_reads(case.script)
        except ValueError as e:
            problems.append(f"{case.label}: sbatch would refuse the script: {e}")
            continue
        if reads != case.expected:
            problems.append(f"{case.label}: sbatch reads {reads}, hpctrain meant {case.expected}")
        # the same directives as the clean render, in its order (--array, --dependency and an
        # --exclude of the inputs' own come from the inputs; an emptied optional value drops its
        # directive, as it should)
        extra = ("--array", "--dependency") + (("--exclude",) if "extra_excludes" in case.inputs
                                               else ())
        flags = [f for f in _flags(reads) if f not in extra]
        if case.kind == "train" and case.payload != "" and flags != clean_flags[case.home]:
            problems.append(f"{case.label}: directives {flags} differ from the clean "
                            f"render's {clean_flags[case.home]}")
    stubs.run_all(tmp_path, bin_dir, canary, [c.dir for c in rendered])
    for case in rendered:
        if (case.dir / "EXECUTED").exists():
            problems.append(f"{case.label}: a payload ran (or one beside it did)")
        rc = (case.dir / "rc").read_text().strip()
        if rc != "0":
            problems.append(f"{case.label}: the script exited {rc}: "
                            f"{(case.dir / 'out').read_text(errors='replace')[-300:]!r}")
            continue
        args = stubs.srun_args(case.dir)
        folder = (case.run_dir + "/submitit" if "array_run_dirs" in case.inputs
                  else case.submitit_dir)
        if args[-5:] != [case.step_python, "-u", "-m", "submitit.core._submit", folder]:
            problems.append(f"{case.label}: srun got {args[-5:]}")
        if case.kind == "train":
            got = (case.dir / "stub.begin-run-dir").read_text(errors="surrogateescape")
            if got != case.run_dir:
                problems.append(f"{case.label}: the batch steps got run folder {got!r}, not {case.run_dir!r}")
        if case.env:
            key, value = case.env
            if stubs.srun_env(case.dir).get(key) != value:
                problems.append(f"{case.label}: the ranks got {key}="
                                f"{stubs.srun_env(case.dir).get(key)!r}, not {value!r}")
    assert not problems, f"{len(problems)} of {len(rendered)} rendered scripts:\n" + \
        "\n".join(problems[:40])
    assert not canary.exists()


CLI_PATH_OPTIONS = ("--run-dir", "--runs-dir", "HPCTRAIN_RUNS_DIR")


def test_path_options_are_refused_or_quoted(tmp_path, canary):
    """--run-dir, --runs-dir and $HPCTRAIN_RUNS_DIR through the real CLI (in process)."""
    runner = CliRunner()
    bin_dir, stub_python = stubs.install(tmp_path)
    job = str(REPO / "examples" / "tiny.yaml")
    profile = tmp_path / "dev-stubbed.yaml"     # the dev cluster's, with the batch steps' stand-in
    profile.write_text(yaml.safe_dump({**corpus.load_yaml(REPO / "cluster_profiles" / "dev-slurm.yaml"),
                                       "name": "dev-stubbed", "python": str(stub_python)}))
    rendered = []
    for option in CLI_PATH_OPTIONS:
        for i, payload in enumerate(corpus.payloads(str(canary))):
            case_dir = tmp_path / f"{option.strip('-')}-{i}"
            case_dir.mkdir()
            value = f"{case_dir}/p/{payload}"
            args, env = ["render", job, "-p", str(profile)], {}
            if option == "HPCTRAIN_RUNS_DIR":
                if "\0" in value:
                    continue            # no environment variable can hold a NUL byte
                env[option] = value
            else:
                args += [option, value]
            result = runner.invoke(cli, args, env=env)
            label = f"{option} #{i} {payload!r}"
            assert result.exit_code in (0, 2), f"{label}: exit {result.exit_code}\n{result.output}"
            assert "Traceback" not in result.output and "internal error" not in result.output, label
            if result.exit_code == 2:   # refused by the option, or at the script's door
                name = option if option != "HPCTRAIN_RUNS_DIR" else "--runs-dir"
                assert f"Error: Invalid value for '{name}'" in result.output or \
                    "Error: cannot write the batch script: " in result.output, f"{label}: {result.output}"
                continue
            reads = corpus.sbatch_reads(result.stdout)
            if option == "--run-dir":
                run_dir = str(Path(value).resolve())
            else:                       # a new run folder named as submit names it
                root = str(Path(value).resolve()).replace('%', '%%')
                outputs = [r for r in reads if r.startswith(f"--output={root}/tiny-gpt-")]
                assert len(outputs) == 1, (label, reads)
                run_dir = outputs[0][len("--output="):].rsplit("/logs/", 1)[0].replace('%%', '%')
            os.makedirs(run_dir, exist_ok=True)
            (case_dir / "script.sh").write_text(result.stdout, errors="surrogateescape")
            assert f"--output={run_dir.replace('%', '%%')}/logs/slurm-%j.log" in reads, (label, reads)
            rendered.append(case_dir)
    assert rendered
    stubs.run_all(tmp_path, bin_dir, canary, rendered)
    for d in rendered:
        assert not (d / "EXECUTED").exists(), d
        assert (d / "rc").read_text().strip() == "0", (d / "out").read_text(errors="replace")
    assert not canary.exists()


@pytest.mark.slurm
def test_real_sbatch_reads_the_directives_of_a_hostile_run_folder(slurm_cluster, tmp_path):
    """The emulated #SBATCH reader above, checked against the real one: a run folder with
    spaces, both quotes, #, $(...) and % gets its log exactly there, under the job's name."""
    import subprocess
    import time

    from hpctrain.config import load_job, load_profile
    from hpctrain.scheduler.slurm.commands import job_info
    run_dir = tmp_path / "it's a \"run\" #1 $(id) 100%"
    (run_dir / "logs").mkdir(parents=True)
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    text = render_sbatch(r, ScriptInputs(run_dir=str(run_dir), python="python3",
                                         step_python="python3",
                                         submitit_dir=str(run_dir / "submitit")))
    block = text.split("\nset -u\n", 1)[0]          # the header and every #SBATCH line
    script = tmp_path / "directives-only.sbatch"
    script.write_text(block + "\necho directives-read\n")
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    log = run_dir / "logs" / f"slurm-{job_id}.log"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and "directives-read" in log.read_text()):
        time.sleep(0.5)
    assert log.read_text().strip() == "directives-read"
    info = job_info(job_id)
    assert info["JobName"] == r.job.name and info["NumNodes"] == "2", info


def test_a_percent_in_the_run_folder_reaches_srun_as_a_literal_percent(tmp_path, canary):
    """srun reads --output as a pattern (%j: the job id, %t: the task): a folder holding a %
    is written %% there, as in the #SBATCH --output line, so the rank logs land in the run
    folder and not in one named after the job id."""
    runner = CliRunner()
    bin_dir, stub_python = stubs.install(tmp_path)
    profile = tmp_path / "dev-stubbed.yaml"
    profile.write_text(yaml.safe_dump({**corpus.load_yaml(REPO / "cluster_profiles" / "dev-slurm.yaml"),
                                       "name": "dev-stubbed", "python": str(stub_python)}))
    case_dir = tmp_path / "pct%jdir%%x"          # also where the stub puts the attempt's folder
    case_dir.mkdir()
    run_dir = case_dir / "run"
    result = runner.invoke(cli, ["render", str(REPO / "examples" / "tiny.yaml"), "-p", str(profile),
                                 "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    run_dir.mkdir()
    (case_dir / "script.sh").write_text(result.stdout)
    stubs.run_all(tmp_path, bin_dir, canary, [case_dir])
    assert (case_dir / "rc").read_text().strip() == "0", (case_dir / "out").read_text()
    escaped = str(case_dir).replace("%", "%%")
    assert f"--output={escaped}/attempt/rank-%t.log" in stubs.srun_args(case_dir)
