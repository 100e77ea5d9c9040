"""What a value may look like before it goes anywhere near a generated shell script.

Three layers protect the rendered sbatch script:

* every string of a profile or job is one line of printable text (``text_problem``, applied by
  the schema loader to every string field, list item and mapping key): no CR, LF, NUL, no other
  character that ends a line for bash, sbatch or Python (\\v, \\f, \\x1c-\\x1e, \\x85, U+2028,
  U+2029), no other control character, no bidirectional override that makes text read
  differently from what runs;
* values are checked against tight patterns, matched whole (``fullmatch``: ``$`` would accept a
  trailing newline), when a profile or job is loaded, so the user hears about
  ``partition: "gpu; rm -rf ~"`` before anything is written. Patterns are deliberately narrow:
  the characters Slurm, environment modules and pyxis actually use, nothing a shell gives
  meaning to;
* ``scheduler/slurm/render.py`` checks every value that reaches the template once more (``script_problem``)
  and quotes each one for whoever reads it: bash (``shlex.quote``) or sbatch's own ``#SBATCH``
  parser (double quotes, see ``sbatch_quote``).
"""

from __future__ import annotations

import os
import re
import reprlib
import unicodedata

from .problems import Problems


def _whole(pattern: str, flags: int = 0) -> re.Pattern:
    """A pattern anchored at both ends with \\A and \\Z (``$`` also matches before a final
    newline), so ``match`` and ``fullmatch`` alike accept only the whole value; ASCII only
    (``re.ASCII``: ``\\d`` would match any Unicode digit, so ``time_limit: "٣٠"`` rendered
    ``#SBATCH --time="٣٠"``). Every validation pattern is made here."""
    return re.compile(rf"\A(?:{pattern})\Z", re.ASCII | flags)


SLURM_NAME = _whole(r"[A-Za-z0-9_.+-]+")
# a job's or profile's name starts run and folder names: not with "-" (read as an option by
# every command given the run's id) nor "." (a hidden folder), and never empty
JOB_NAME = _whole(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
NODE_LIST = _whole(r"[A-Za-z0-9_.,\[\]-]+")
# Slurm features joined by , or matched with [..] and counts (*N); no & | ( ): those mean
# something to a shell, and a constraint this tool renders never needs them.
CONSTRAINT = _whole(r"[A-Za-z0-9_.,\[\]*:!-]+")
MEMORY = _whole(r"\d{1,12}[KMGT]?")
# D-HH:MM:SS, D-HH:MM, D-HH, HH:MM:SS, MM:SS, MM
TIME_LIMIT = _whole(r"\d{1,3}-\d{1,2}(:\d{2}(:\d{2})?)?|\d{1,4}:\d{2}:\d{2}|\d{1,6}:\d{2}|\d{1,6}")
MODULE = _whole(r"[A-Za-z0-9_.+/@-]+")
ENV_KEY = _whole(r"[A-Za-z_][A-Za-z0-9_]*")
IMAGE = _whole(r"[A-Za-z0-9_./:@#+-]+")
MOUNT = _whole(r"[A-Za-z0-9_./+-]+(:[A-Za-z0-9_./+-]+)?(:[a-z,]+)?")
PATH_LIKE = _whole(r"[A-Za-z0-9_./~+@%:=-][A-Za-z0-9_./~+@%:= -]*")
_DIRECTIVE_VALUE = r"[A-Za-z0-9_.,:=@%/+*\[\]-]+"
# one word of an #SBATCH line: --long, --long=VALUE, -X, -XVALUE, or a VALUE after --long / -X
DIRECTIVE_WORD = _whole(rf"--[a-z][a-z0-9-]*(={_DIRECTIVE_VALUE})?|-[A-Za-z]({_DIRECTIVE_VALUE})?"
                        rf"|{_DIRECTIVE_VALUE}")
HCA = _whole(r"[A-Za-z0-9_]+(:\d+)?")
IFNAME = _whole(r"[\^=]?[A-Za-z0-9_.,-]+")
SCRIPT_WORD = _whole(r"[a-z][a-z0-9_-]*")        # kind names the template prints bare
DEPENDENCY = _whole(r"[a-z]+(:[0-9_+]+)+([,?][a-z]+(:[0-9_+]+)+)*|singleton")

# a number written as text (YAML reads 3e-4, without a dot, as a string): ASCII decimal or
# scientific notation only, or inf/nan (refused as not finite by whoever reads it). float()
# alone also takes "٣", "１", "1_0" and " 1e-3 ".
NUMBER_TEXT = _whole(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                     r"|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)


def number_from_text(text: str) -> float | None:
    """The number ``text`` writes (NUMBER_TEXT), or None: the one way text becomes a number
    for a job or profile field (``--set``/``--sweep`` values included)."""
    return float(text) if NUMBER_TEXT.fullmatch(text) else None


MAX_TEXT = 4096          # characters in any string of a profile or job
PATH_MAX = 4096          # bytes in a path (Linux PATH_MAX)
NAME_MAX = 255           # bytes in one path component (Linux NAME_MAX)
# sbatch reads a #SBATCH line holding either word as the start of another heterogeneous-job
# component (and blanks out "packjob" inside the argument): such a value would split the job.
HET_JOB_WORDS = ("hetjob", "packjob")
_BIDI = {"\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
         "\u200e", "\u200f", "\u061c"}
_NAMES = {"\n": "a line feed (\\n)", "\r": "a carriage return (\\r)", "\0": "a NUL byte (\\0)",
          "\t": "a tab (\\t)", "\v": "a vertical tab (\\v)", "\f": "a form feed (\\f)",
          "\x85": "a next-line character (U+0085)", "\u2028": "a line separator (U+2028)",
          "\u2029": "a paragraph separator (U+2029)"}

# Directives the rendered script sets itself; a raw directive must not fight them.
OWNED_DIRECTIVES = {
    "job-name": "set the job's `name` instead",
    "nodes": "set slurm.nodes (or pass --nodes) instead",
    "ntasks": "set slurm.gpus_per_node instead (one task per GPU)",
    "ntasks-per-node": "set slurm.gpus_per_node instead (one task per GPU)",
    "gpus-per-node": "set slurm.gpus_per_node instead",
    "gres": "set slurm.gpu_directive and slurm.gpus_per_node instead",
    "partition": "set slurm.partition instead",
    "account": "set slurm.account instead",
    "qos": "set slurm.qos instead",
    "reservation": "set slurm.reservation instead",
    "time": "set slurm.time_limit instead",
    "cpus-per-task": "set slurm.cpus_per_task instead",
    "mem": "set slurm.mem instead",
    "constraint": "set slurm.constraint instead",
    "exclusive": "set slurm.exclusive instead",
    "exclude": "set slurm.exclude instead",
    "signal": "set preemption.signal and preemption.lead_time_s instead",
    "requeue": "remove it (jobs are always requeueable; see preemption.max_requeues)",
    "no-requeue": "set preemption.max_requeues: 0 instead",
    "output": "remove it (logs go to the run folder)",
    "error": "remove it (logs go to the run folder)",
    "open-mode": "remove it (logs go to the run folder)",
    "chdir": "remove it (the job runs in its run folder)",
    "wrap": "remove it (hpctrain writes the script)",
    "array": "use `hpctrain submit --sweep` instead",
    "dependency": "use `hpctrain submit --chain` instead",
    "export": "use the profile's `env` mapping instead",
    "test-only": "use `hpctrain submit --dry-run` instead",
    "parsable": "remove it",
    # hpctrain submits, follows, cancels and requeues the job on this cluster, itself
    "wait": "remove it (sbatch would block until the job ends; use `hpctrain submit --wait`)",
    "clusters": "remove it (hpctrain follows, cancels and requeues the job on the cluster it "
                "submits to; run hpctrain where that cluster's Slurm commands point)",
    "export-file": "use the profile's `env` mapping instead",
    "get-user-env": "use the profile's `env` mapping instead",
    # GPUs and memory: hpctrain writes one GPU directive and slurm.mem; a second one conflicts
    "gpus": "set slurm.gpu_directive and slurm.gpus_per_node instead",
    "gpus-per-task": "set slurm.gpu_directive and slurm.gpus_per_node instead (one task per GPU)",
    "ntasks-per-gpu": "set slurm.gpus_per_node instead (one task per GPU)",
    "mem-per-cpu": "set slurm.mem instead",
    "mem-per-gpu": "set slurm.mem instead",
}

# Options sbatch accepts in #SBATCH lines that print something and exit instead of submitting.
NOT_JOB_OPTIONS = {
    "help": "sbatch would print its help and submit nothing; remove it",
    "usage": "sbatch would print its usage and submit nothing; remove it",
    "version": "sbatch would print its version and submit nothing; remove it",
}


def _char_name(c: str) -> str:
    return _NAMES.get(c) or f"the control character U+{ord(c):04X}"


def text_problem(value: str, limit: int = MAX_TEXT) -> str | None:
    """Why ``value`` is not one line of printable text of at most ``limit`` characters, or None."""
    if len(value) > limit:
        return f"is {len(value):,} characters long; the limit is {limit:,}"
    for i, c in enumerate(value):
        cat = unicodedata.category(c)
        if cat in ("Cc", "Zl", "Zp"):
            return f"holds {_char_name(c)} at position {i}; it must be one line of printable text"
        if cat == "Cs":
            return f"holds an unpaired surrogate (U+{ord(c):04X}) at position {i}; it is not text"
        if c in _BIDI:
            return (f"holds a bidirectional control (U+{ord(c):04X}) at position {i}, which makes "
                    "the text display differently from what it is")
    return None


def script_problem(value: str) -> str | None:
    """What the template refuses in any value it prints: anything that can end a line for bash or
    sbatch (or a NUL, which bash drops silently). Checked at render, whatever the value's source."""
    for i, c in enumerate(value):
        if unicodedata.category(c) in ("Cc", "Zl", "Zp") and c != "\t":
            return f"holds {_char_name(c)} at position {i}"
    return None


def het_job_word(value: str) -> str | None:
    low = value.lower()
    return next((w for w in HET_JOB_WORDS if w in low), None)


def path_problem(value: str) -> str | None:
    """Why a filesystem path is unusable (length, component length, NUL), or None."""
    try:
        raw = os.fsencode(value)
    except UnicodeEncodeError:
        return "is not a valid file name on this system"
    if b"\0" in raw:
        return "holds a NUL byte, which no file name can hold"
    if len(raw) >= PATH_MAX:
        return f"is {len(raw):,} bytes long; a path must be under {PATH_MAX:,}"
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            return (f"has a component {len(part):,} bytes long ({os.fsdecode(part[:24])}...); a "
                    f"file or folder name may have at most {NAME_MAX}")
    return None


def option_problem(value: str, what: str) -> str | None:
    """Why ``value`` cannot stand where a command reads a name, or None. Every value these
    checks match lands in an option's value or a command's word (``--container-image=IMAGE``,
    ``--partition=NAME``, ``module load NAME``, srun's program ``PYTHON``): one starting with
    ``-`` is read as an option there (srun would take ``--help`` as its own, enroot an image
    named ``--help`` as a flag), so no such value may start with ``-``."""
    if value.startswith("-"):
        return (f"{short(value)} starts with '-', which a command would read as an option; a "
                f"{what} may not start with '-'")
    return None


def check(pattern: re.Pattern, value, path: str, problems: Problems, what: str) -> None:
    """Add a problem when a (non-empty) string value does not match ``pattern`` as a whole, or
    starts with ``-`` (``option_problem``)."""
    if value is None or value == "":
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        problems.add(path, f"{short(value)} is not a valid {what}")
        return
    why = option_problem(value, what)
    if why:
        problems.add(path, why)


def check_path(value, path: str, problems: Problems, pattern: re.Pattern | None = None,
               what: str = "path") -> None:
    """A path: one line of text (the schema saw to that), usable as a file name, and matching
    ``pattern`` when it will be printed into the script."""
    if not isinstance(value, str) or value == "":
        return
    if pattern is not None and not pattern.fullmatch(value):
        problems.add(path, f"{short(value)} is not a valid {what} (letters, digits, spaces and "
                           "_./~+@%:=- only)")
        return
    why = option_problem(value, what) if pattern is not None else None
    if why:
        problems.add(path, f"{why} (a relative one may start with ./)")
        return
    why = path_problem(value)
    if why:
        problems.add(path, f"the {what} {why}")


def check_sbatch_value(value, path: str, problems: Problems) -> None:
    """A value printed into a #SBATCH line must not hold a word that splits the job in two."""
    if isinstance(value, str):
        word = het_job_word(value)
        if word:
            problems.add(path, f"{short(value)} contains {word!r}, which sbatch reads as the start "
                               "of another heterogeneous-job component; choose another value")


def check_directive(value: str, path: str, problems: Problems) -> None:
    """An ``extra_directives`` entry: safe characters, then read the way sbatch reads it (unique
    prefixes, short options, ``--opt=value`` and ``--opt value``, see ``sbatch_options``), so an
    option hpctrain sets is refused however it is spelled (``--no-requ``, ``--sig=``, ``-J``)."""
    from .sbatch_options import DirectiveError, resolve

    if not isinstance(value, str):
        return
    words = value.split(" ")
    if not value or not all(DIRECTIVE_WORD.fullmatch(w) for w in words) or \
            not value.startswith("-"):
        problems.add(path, f"{short(value)} is not a valid sbatch directive; write it as --name, "
                           "--name=value or --name value (letters, digits and _.,:=@%/+*[]- only, "
                           "single spaces, no quotes)")
        return
    try:
        options = resolve(words)
    except DirectiveError as e:
        problems.add(path, f"{short(value)}: {e}")
        return
    for o in options:
        why = OWNED_DIRECTIVES.get(o.name) or NOT_JOB_OPTIONS.get(o.name)
        if why:
            spelled = "" if o.written == f"--{o.name}" else f" ({o.written} is sbatch's --{o.name})"
            owner = "managed by hpctrain" if o.name in OWNED_DIRECTIVES else "not a job option"
            problems.add(path, f"--{o.name} is {owner}{spelled}: {why}")
            return
    check_sbatch_value(value, path, problems)


# What a profile's ``env`` may not set. Its exports come after the batch script's own variables
# and reach every rank (and the local executor's ranks), so each of these would let a profile
# take over what hpctrain decides: which run folder the job records into, which interpreter
# runs, what bash runs before every command.
SCRIPT_VARIABLES = frozenset({   # the batch script's own (tests check the template's are here)
    "RUN_DIR", "RUN_DIRS", "PY", "STEP_OUTPUT", "STEP_NODE_COUNT", "WATCH_STEP", "count",
    "decision", "old_flag", "r2", "rc", "srun_pid", "step_out", "t_start", "watch_pid"})
LAUNCHER_VARIABLES = frozenset({  # who a rank is: set per task by srun / the launcher
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR", "MASTER_PORT"})
SHELL_VARIABLES = frozenset({    # read by bash or the dynamic loader before any command runs
    "IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "CDPATH",
    "GLOBIGNORE", "BASH_XTRACEFD", "BASH_COMPAT", "POSIXLY_CORRECT", "LD_PRELOAD", "LD_AUDIT"})
RESERVED_PREFIXES = ("HPCTRAIN_", "SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_", "BASH_FUNC_")
# Python's variables that change only how it reports, never what it imports or runs
PYTHON_VARIABLES_ALLOWED = frozenset({
    "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONTRACEMALLOC",
    "PYTHONMALLOC", "PYTHONDEVMODE"})


def _test_variable(key: str) -> bool:
    """A registered test-only variable (``fault_injection``): the tests' profiles set them, and
    they do nothing unless ``HPCTRAIN_TEST_HOOKS=1``."""
    from .. import fault_injection
    return key == fault_injection.SWITCH or key in fault_injection.VARIABLES


def env_key_problem(key: str) -> str | None:
    """Why a profile's ``env`` may not set ``key``, or None."""
    if not ENV_KEY.fullmatch(key):
        return (f"{short(key)} is not a valid environment variable name (letters, digits and _, "
                "not starting with a digit)")
    if key in SCRIPT_VARIABLES:
        return (f"{key} is a variable of hpctrain's batch script (the run folder, the "
                "interpreter, the step's output); remove it from env")
    if key in LAUNCHER_VARIABLES:
        return f"{key} is set for each rank by srun or the launcher; remove it from env"
    if key in SHELL_VARIABLES:
        return (f"{key} changes what bash or the loader runs before every command; remove it "
                "from env (use modules or the container for the software environment)")
    if key.startswith(RESERVED_PREFIXES) and not _test_variable(key):
        prefix = next(p for p in RESERVED_PREFIXES if key.startswith(p))
        return (f"{key}: {prefix}* variables are set by hpctrain, Slurm or submitit for each "
                "job; remove it from env (Slurm options go in the profile's slurm section)")
    if key.startswith("PYTHON") and key not in PYTHON_VARIABLES_ALLOWED:
        return (f"{key} changes what Python imports or runs (the job runs with PYTHONSAFEPATH=1 "
                "in its run folder); remove it from env (install packages in the container or "
                "the node's Python)")
    return None


def check_env_value(key: str, value, path: str, problems: Problems) -> None:
    why = env_key_problem(key)
    if why:
        problems.add(path, why)


def sbatch_quote(value: str) -> str:
    """``value`` as one argument for sbatch's #SBATCH parser (not a shell: it knows double and
    single quotes and backslash escapes, and an unquoted # ends the line). Plain values stay
    bare, so the script reads as people write it."""
    if re.fullmatch(r"[A-Za-z0-9_.,:=@%/+*\[\]-]+", value, re.ASCII):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 200, 200


def short(value, limit: int = 60) -> str:
    """repr() of a value for a one-line message, cut short when long. The one way a message
    quotes a value it was given, whatever the value: an API caller's object whose ``__repr__``
    raises is named by its type, a container of millions of items is summarised
    (``reprlib``) rather than written out whole, and a ``__repr__`` that returns a line break
    or an escape code is escaped (:func:`hpctrain.file_door.show`'s characters)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        sign = "a negative" if value < 0 else "a"
        return f"{sign} number of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        if type(value) is str and len(value) > limit * 4:   # a string of gigabytes: its start
            text = repr(value[:limit * 4])
        else:
            text = repr(value) if type(value) in _PLAIN else _REPR.repr(value)
        if not isinstance(text, str):
            raise TypeError
    except Exception:   # noqa: BLE001 - a value's own __repr__ failing is the value's fault
        return f"a {_type_name(value)} object (its repr() fails)"
    if not text.isprintable():
        from ..file_door import printable
        text = printable(text[:limit * 4], keep="")
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{text[:limit - 20]}...{size}"


# types whose repr() is bounded by their size and is what a message should quote as is
_PLAIN = (str, bytes, int, float, bool, type(None))


def _type_name(value) -> str:
    try:
        return type(value).__name__
    except Exception:   # noqa: BLE001
        return "Python"
