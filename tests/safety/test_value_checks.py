"""What a profile or job value may hold before it goes near a generated script, said back in one
line that names the character, its position or the limit (``config/safety.py``, called in
process: the CLI's doors are tested in test_bad_files.py and test_script_injection.py).

The stories: a partition pasted from a terminal with its newline or colour codes, a run folder
under a name of 255 bytes in a non-ASCII language, a number of many digits in a field, an
extra directive spelled the short way, a job name that would split the job in two.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hpctrain.config import safety
from hpctrain.config.problems import Problems


def _problems(fn, *args) -> list[str]:
    problems = Problems()
    fn(*args, problems)
    return [f"{path}: {message}" for path, message in problems.items]


@pytest.mark.parametrize("value, where, what", [
    ("gpu\n", 3, "a line feed (\\n)"),
    ("\rgpu", 0, "a carriage return (\\r)"),
    ("ab\x1b[31mc", 2, "the control character U+001B"),      # colour codes from a terminal
    ("a\tb", 1, "a tab (\\t)"),
    ("gpu\x85", 3, "a next-line character (U+0085)"),
    ("x\u2028y", 1, "a line separator (U+2028)"),
    ("x\u2029y", 1, "a paragraph separator (U+2029)"),
])
def test_a_value_pasted_from_a_terminal_names_the_character_and_where(value, where, what):
    assert safety.text_problem(value) == \
        f"holds {what} at position {where}; it must be one line of printable text"


def test_text_that_reads_differently_from_what_it_is_is_refused():
    assert safety.text_problem("gpu-\u202eh100") == (
        "holds a bidirectional control (U+202E) at position 4, which makes the text display "
        "differently from what it is")
    assert safety.text_problem("n\udcff") == \
        "holds an unpaired surrogate (U+DCFF) at position 1; it is not text"
    assert safety.text_problem("données ü 東京 -_./") is None


def test_a_value_at_the_length_limit_passes_and_one_more_character_does_not():
    assert safety.text_problem("x" * safety.MAX_TEXT) is None
    assert safety.text_problem("x" * (safety.MAX_TEXT + 1)) == \
        "is 4,097 characters long; the limit is 4,096"
    assert safety.text_problem("k" * 256, 256) is None              # a mapping key's limit
    assert safety.text_problem("k" * 257, 256) == "is 257 characters long; the limit is 256"


def test_the_script_allows_a_tab_but_nothing_that_ends_a_line():
    assert safety.script_problem("a\tb") is None
    assert safety.script_problem("/runs/a\nb") == "holds a line feed (\\n) at position 7"
    assert safety.script_problem("a\x00") == "holds a NUL byte (\\0) at position 1"
    assert safety.script_problem("a\u2028") == "holds a line separator (U+2028) at position 1"


def test_a_folder_name_counts_bytes_as_the_file_system_does():
    assert safety.path_problem("/scratch/" + "a" * 255 + "/ckpt") is None
    # 128 two-byte letters: 128 characters, 256 bytes, one more than a name may hold
    long_name = "é" * 128
    assert safety.path_problem(f"/scratch/{long_name}/ckpt") == (
        f"has a component 256 bytes long ({'é' * 12}...); a file or folder name may have at "
        "most 255")
    deep = "/" + "/".join(["d" * 200] * 20)
    assert len(deep.encode()) == 4020 and safety.path_problem(deep) is None
    too_deep = deep + "/" + "e" * 75                    # 4096 bytes: PATH_MAX counts the NUL
    assert safety.path_problem(too_deep) == "is 4,096 bytes long; a path must be under 4,096"
    assert safety.path_problem(too_deep[:-1]) is None
    assert safety.path_problem("/a\0b") == "holds a NUL byte, which no file name can hold"
    assert safety.path_problem("/a/\ud800") == "is not a valid file name on this system"


def test_fields_are_checked_whole_and_only_when_set():
    partition = lambda v: _problems(  # noqa: E731
        lambda p: safety.check(safety.SLURM_NAME, v, "slurm.partition", p, "partition"))
    assert partition("gpu") == [] and partition(None) == [] and partition("") == []
    assert partition("gpu; rm -rf ~") == \
        ["slurm.partition: 'gpu; rm -rf ~' is not a valid partition"]
    assert partition("gpu\n") == ["slurm.partition: 'gpu\\n' is not a valid partition"]
    assert partition(8) == ["slurm.partition: 8 is not a valid partition"]


def test_paths_printed_into_the_script_and_paths_too_long_for_the_disk():
    run = lambda v, pattern=None: _problems(  # noqa: E731
        lambda value, path, problems: safety.check_path(value, path, problems, pattern,
                                                        "run folder"), v, "checkpoint.dir")
    assert run("") == [] and run(None) == [] and run("/scratch/ckpt") == []
    assert run("/scratch/a b", safety.PATH_LIKE) == []
    assert run("", safety.PATH_LIKE) == [] and run(None, safety.PATH_LIKE) == []   # unset
    assert run("/scratch/$(id)", safety.PATH_LIKE) == [
        "checkpoint.dir: '/scratch/$(id)' is not a valid run folder (letters, digits, spaces and "
        "_./~+@%:=- only)"]
    assert run("/scratch/" + "é" * 128) == [
        f"checkpoint.dir: the run folder has a component 256 bytes long ({'é' * 12}...); a file or "
        "folder name may have at most 255"]


def test_a_name_holding_hetjob_would_split_the_job_and_is_refused_in_any_case():
    for name in ("my-hetjob", "PackJob-1", "x-HETJOB"):
        (problem,) = _problems(safety.check_sbatch_value, name, "name")
        word = safety.het_job_word(name)
        assert problem == (f"name: {name!r} contains {word!r}, which sbatch reads as the start of "
                           "another heterogeneous-job component; choose another value")
    assert _problems(safety.check_sbatch_value, "pack-job", "name") == []
    assert _problems(safety.check_sbatch_value, 7, "name") == []


def test_environment_variable_names():
    ok = lambda key: _problems(  # noqa: E731
        lambda p: safety.check_env_value(key, "v", f"env.{key}", p)) == []
    assert ok("NCCL_DEBUG") and ok("_X1")
    assert not ok("1BAD") and not ok("BAD-NAME") and not ok("A B")
    # what clusters set: NCCL, CUDA, OpenMP, proxies, Python's reporting, the tests' switches
    for key in ("NCCL_IB_HCA", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "http_proxy",
                "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "HPCTRAIN_TEST_HOOKS",
                "HPCTRAIN_TEST_STEP_SLEEP_S"):
        assert ok(key), key


@pytest.mark.parametrize("key, why", [
    ("RUN_DIR", "RUN_DIR is a variable of hpctrain's batch script"),   # another run's records
    ("PY", "PY is a variable of hpctrain's batch script"),             # another interpreter
    ("HPCTRAIN_RUN_DIR", "HPCTRAIN_*"),
    ("HPCTRAIN_ATTEMPT", "HPCTRAIN_*"),
    ("SLURM_JOB_ID", "SLURM_*"),
    ("SUBMITIT_EXECUTOR", "SUBMITIT_*"),
    ("BASH_FUNC_srun%%", "not a valid environment variable name"),
    ("BASH_ENV", "changes what bash or the loader runs"),
    ("IFS", "changes what bash or the loader runs"),
    ("LD_PRELOAD", "changes what bash or the loader runs"),
    ("PYTHONSAFEPATH", "changes what Python imports or runs"),
    ("PYTHONPATH", "changes what Python imports or runs"),
    ("PYTHONSTARTUP", "changes what Python imports or runs"),
    ("MASTER_ADDR", "set for each rank by srun or the launcher"),
    ("RANK", "set for each rank by srun or the launcher"),
])
def test_a_profiles_env_cannot_take_over_what_hpctrain_sets(key, why):
    (problem,) = _problems(lambda p: safety.check_env_value(key, "v", f"env.{key}", p))
    assert problem.startswith(f"env.{key}: ") and why in problem and "\n" not in problem


def test_every_variable_the_batch_script_assigns_is_closed_to_the_profile():
    """The template's own variables (assignments, ``local``) are what a profile's exports,
    written after them, would overwrite: each one is refused, so a variable added to the
    template later is closed too or this test names it."""
    templates = (Path(__file__).resolve().parents[2] / "sbatch_templates").glob("*.j2")
    assigned = set()
    for text in (t.read_text() for t in templates):
        assigned |= set(re.findall(r"(?:^|[\s;({])(?:local\s+)?([A-Za-z_][A-Za-z0-9_]*)=", text,
                                   re.M))
    assert {"RUN_DIR", "PY", "STEP_OUTPUT"} <= assigned
    open_to_profiles = sorted(k for k in assigned if safety.env_key_problem(k) is None)
    assert open_to_profiles == []


@pytest.mark.parametrize("directive, refusal", [
    ("--comment=tuning", None),
    ("--mail-type=END --mail-user=me@example.org", None),
    ("--time=10", "--time is managed by hpctrain: set slurm.time_limit instead"),
    ("-J x", "--job-name is managed by hpctrain (-J is sbatch's --job-name): set the job's "
             "`name` instead"),
    ("--no-requ", "--no-requeue is managed by hpctrain (--no-requ is sbatch's --no-requeue): "
                  "set preemption.max_requeues: 0 instead"),
    ("--help", "--help is not a job option: sbatch would print its help and submit nothing; "
               "remove it"),
    ("--comment=hetjob", "'--comment=hetjob' contains 'hetjob'"),
    ("comment=x", "is not a valid sbatch directive"),
    ("--comment=x  y", "is not a valid sbatch directive"),
    ("--comment='x'", "is not a valid sbatch directive"),
    ("", "is not a valid sbatch directive"),
])
def test_an_extra_directive_is_read_as_sbatch_reads_it(directive, refusal):
    found = _problems(lambda v, p: safety.check_directive(v, "slurm.extra_directives[0]", p),
                      directive)
    if refusal is None:
        assert found == []
    else:
        assert len(found) == 1 and refusal in found[0], found
        assert found[0].startswith("slurm.extra_directives[0]: ")
    assert _problems(lambda v, p: safety.check_directive(v, "x", p), 5) == []


def test_sbatch_quoting_keeps_plain_values_bare_and_quotes_the_rest():
    assert safety.sbatch_quote("gpu,debug") == "gpu,debug"
    assert safety.sbatch_quote("tiny gpt") == '"tiny gpt"'
    assert safety.sbatch_quote('say "hi" \\o/') == '"say \\"hi\\" \\\\o/"'
    assert safety.sbatch_quote("a#b") == '"a#b"'          # an unquoted # ends the line


def test_a_value_in_a_message_is_shown_whole_when_short_and_cut_when_long():
    assert safety.short("gpu") == "'gpu'"
    assert safety.short("x" * 58) == repr("x" * 58)                   # 60 characters
    cut = safety.short("x" * 59)
    assert cut == "'" + "x" * 39 + "... (59 characters)"
    # a container is summarised, never written out whole (a list of millions of items)
    assert safety.short(["a"] * 30) == "['a', 'a', 'a', 'a', 'a', 'a', ...]"
    assert safety.short([["x" * 50] * 3]) == "[['" + "x" * 37 + "..."     # cut at 40 + ...
    assert safety.short("y" * 100, limit=30) == "'" + "y" * 9 + "... (100 characters)"
    # a number of many digits (YAML reads 1e400-like integers whole) is described, not printed
    assert safety.short(10**18) == "a number of about 19 digits"
    assert safety.short(-(10**25)) == "a negative number of about 26 digits"
    assert safety.short(10**18 - 1) == str(10**18 - 1)
    assert safety.short(True) == "True"
    assert re.fullmatch(r"a number of about \d+ digits", safety.short(2**4000))


# ---- values where a command reads a word may not start with "-" ------------------------------

# Every profile field whose value lands in an option's value or a command's word: pyxis's
# --container-image/-mounts/-workdir, srun's program (the container's or the nodes' python),
# `module load`, the #SBATCH --partition/--account/--qos/--reservation/--constraint/--exclude
# values, NCCL's HCA and interface lists, and the storage roots printed into the script.
OPTION_PLACES = ["container.image", "container.mounts", "container.workdir", "container.python",
                 "python", "modules", "slurm.partition", "slurm.account", "slurm.qos",
                 "slurm.reservation", "slurm.constraint", "slurm.exclude", "interconnect.hcas",
                 "interconnect.socket_ifname", "storage.runs_root", "storage.checkpoint_root"]
LISTS = ("container.mounts", "modules", "slurm.exclude", "interconnect.hcas")


def _pyxis_with(field: str, value: str) -> list[str]:
    """The problems of the shipped pyxis profile with ``field`` set to ``value``."""
    from hpctrain.config import profile_from_mapping
    from hpctrain.errors import ConfigError
    from tests.safety.corpus import PROFILES, load_yaml
    data = load_yaml(next(p for p in PROFILES if p.stem == "h100-ib-pyxis"))
    *sections, name = field.split(".")
    node = data
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = [value] if field in LISTS else value
    try:
        profile_from_mapping(data, "p.yaml")
    except ConfigError as e:
        return [f"{p}: {m}" for p, m in e.problems]
    return []


@pytest.mark.parametrize("field", OPTION_PLACES)
def test_a_value_read_as_an_option_is_refused_naming_the_field(field):
    """``container.image: "--help"`` was rendered as ``--container-image=--help``; now every
    field whose value lands where a command reads a word refuses a leading ``-``, by name."""
    value = "--help"
    where = f"{field}[0]" if field in LISTS else field
    found = [p for p in _pyxis_with(field, value) if p.startswith(f"{where}: ")]
    assert len(found) == 1, (field, found)
    assert "'--help' starts with '-', which a command would read as an option" in found[0] or \
        "is not a valid" in found[0], found            # (an HCA name never holds "-" at all)
    assert "\n" not in found[0]
    assert _pyxis_with(field, "gpu.1") == [] or field in ("interconnect.hcas",)


@given(st.sampled_from(OPTION_PLACES), st.text("-_.:/abcXYZ019", min_size=1, max_size=16))
def test_no_option_place_takes_a_value_starting_with_a_dash(field, tail):
    """Property: whatever follows the dash, the value is refused on that field's path, with the
    leading-dash reason wherever the field's pattern would otherwise take it."""
    value = "-" + tail
    where = f"{field}[0]" if field in LISTS else field
    found = [p for p in _pyxis_with(field, value) if p.startswith(f"{where}: ")]
    assert len(found) == 1, (field, value, found)
    assert "starts with '-'" in found[0] or "is not a valid" in found[0], found


def test_the_render_door_refuses_an_option_like_value_however_the_profile_was_made():
    """A profile built in Python, past the loader's checks, still never renders a value
    where srun, pyxis or module would read it as an option."""
    import dataclasses
    from hpctrain.config import load_job, load_profile, resolve
    from hpctrain.errors import UsageError
    from hpctrain.scheduler.slurm.render import ScriptInputs, render_sbatch
    from tests.conftest import REPO
    profile = load_profile("h100-ib-pyxis")
    inputs = ScriptInputs(run_dir="/runs/x", python="/usr/bin/python3",
                          step_python="/usr/bin/python3", submitit_dir="/runs/x/submitit")
    job = load_job(REPO / "examples" / "llama2-7b.yaml")
    render_sbatch(resolve(job, profile), inputs)                       # as shipped: renders
    for changed, words in [
            (dataclasses.replace(profile, container=dataclasses.replace(
                profile.container, image="--help")), "'--help' starts with '-'"),
            (dataclasses.replace(profile, container=dataclasses.replace(
                profile.container, mounts=["-x:/y"])), "'-x:/y,/runs/x:/runs/x' starts with '-'"),
            (dataclasses.replace(profile, modules=["--force"]), "'--force' starts with '-'")]:
        with pytest.raises(UsageError, match=f"cannot write the batch script: {words}"):
            render_sbatch(resolve(job, changed), inputs)
    with pytest.raises(UsageError, match="'-c' starts with '-'"):
        render_sbatch(resolve(job, profile), dataclasses.replace(inputs, step_python="-c"))


def test_render_refuses_a_container_image_read_as_an_option_in_one_line(tmp_path):
    """The CLI: one ``Error:`` line naming the file and the field, exit 2, nothing rendered."""
    from tests.conftest import REPO, hpctrain
    text = (REPO / "cluster_profiles" / "h100-ib-pyxis.yaml").read_text()
    profile = tmp_path / "pyxis.yaml"
    profile.write_text(text.replace("  image: /lustre/fsw/llm-pretrain/images/hpctrain-ngc25.11.sqsh",
                                    '  image: "--help"'))
    proc = hpctrain("render", "examples/llama2-7b.yaml", "-p", str(profile))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == (f"Error: {profile}: container.image: '--help' starts with '-', which a "
                           "command would read as an option; a container image may not start "
                           "with '-'\n")


# ---- digits are ASCII digits ------------------------------------------------------------------

# a digit of another script (Arabic-Indic ٣, fullwidth １, Devanagari ३, ...): `\d` and float()
# both took them, so `time_limit: "٣٠"` rendered `#SBATCH --time="٣٠"` and `--set train.lr=٣`
# ran at 3.0
_OTHER_DIGITS = st.characters(whitelist_categories=["Nd"]).filter(lambda c: not c.isascii())
# fields whose #SBATCH (or NCCL) pattern takes digits, with a valid value to put one in
PATTERN_FIELDS = {"slurm.time_limit": "30", "slurm.mem": "4G",
                  "interconnect.hcas": "mlx5_0:1"}
# number fields of a job, with where in a valid value a digit may go
NUMBER_FIELDS = {"train.lr": "3e-4", "train.clip_grad": "1.0", "train.weight_decay": "0.01"}


def _job_problems(field: str, value) -> list[str]:
    import copy

    import yaml

    from hpctrain.config import job_from_mapping
    from hpctrain.errors import ConfigError
    from tests.conftest import REPO
    data = copy.deepcopy(yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text()))
    section, name = field.split(".")
    data[section][name] = value
    try:
        job_from_mapping(data, "job.yaml")
    except ConfigError as e:
        return [f"{p}: {m}" for p, m in e.problems]
    return []


@pytest.mark.parametrize("field, value", [("slurm.time_limit", "٣٠"), ("slurm.mem", "٤G"),
                                          ("slurm.mem", "４G"), ("interconnect.hcas", "mlx5_0:١")])
def test_a_digit_of_another_script_is_not_a_digit_in_a_pattern(field, value):
    where = f"{field}[0]" if field in LISTS else field
    found = [p for p in _pyxis_with(field, value) if p.startswith(f"{where}: ")]
    assert len(found) == 1 and " is not a " in found[0], found


@pytest.mark.parametrize("text", ["٣", "１", "1_0", " 1e-3 ", "1e-3\u3000", "３e-4", "0x10"])
def test_a_number_from_text_is_ascii_notation_only(text):
    assert safety.number_from_text(text) is None
    [found] = _job_problems("train.lr", text)
    assert found.startswith("train.lr: expected a number, got "), found


@pytest.mark.parametrize("text, number", [("1e-4", 1e-4), ("3e-4", 3e-4), (".5", 0.5),
                                          ("-1", -1.0), ("+2.5E3", 2500.0), ("1.", 1.0)])
def test_ascii_notation_still_reads_as_the_number(text, number):
    assert safety.number_from_text(text) == number


def test_inf_and_nan_are_still_read_and_refused_as_not_finite():
    for text in ("inf", "-Infinity", "nan"):
        [found] = _job_problems("train.lr", text)
        assert "expected a finite number" in found, found


@given(st.sampled_from(sorted(PATTERN_FIELDS) + sorted(NUMBER_FIELDS)), st.data())
def test_any_value_holding_a_digit_of_another_script_is_refused_in_one_line(field, data):
    """Property: a non-ASCII digit anywhere in a valid value of a number field or a field an
    #SBATCH (or NCCL) pattern checks makes it one problem on that field, one line."""
    valid = {**PATTERN_FIELDS, **NUMBER_FIELDS}[field]
    at = data.draw(st.integers(0, len(valid)))
    digit = data.draw(_OTHER_DIGITS)
    replace = data.draw(st.booleans())
    value = valid[:at] + digit + valid[at + (1 if replace else 0):]
    if field in NUMBER_FIELDS:
        found = [p for p in _job_problems(field, value) if p.startswith(f"{field}: ")]
    else:
        where = f"{field}[0]" if field in LISTS else field
        found = [p for p in _pyxis_with(field, value) if p.startswith(f"{where}: ")]
    assert len(found) == 1 and "\n" not in found[0], (field, value, found)


def test_a_split_is_read_in_ascii_notation():
    from hpctrain.config.split import parse_split
    with pytest.raises(ValueError, match="expected numbers"):
        parse_split("٩٦٩,30,1")
    assert parse_split("969,30,1")[0] == pytest.approx(0.969)
