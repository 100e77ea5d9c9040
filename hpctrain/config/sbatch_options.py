"""sbatch's own option table, and an entry of ``slurm.extra_directives`` read the way sbatch
reads it.

sbatch parses ``#SBATCH`` lines with glibc's ``getopt_long``: a long option may be abbreviated
to any unique prefix (``--no-requ`` is ``--no-requeue``, ``--sig=`` is ``--signal=``), an exact
name wins over longer ones (``--mem`` is not ambiguous with ``--mem-bind``), a value follows
``=`` or comes as the next word, and short options take their value attached (``-Jname``) or
as the next word. Comparing the text of an entry with the names hpctrain sets is therefore not
enough: ``resolve`` runs the same algorithm over the same table and returns the options sbatch
would see, so a directive hpctrain owns is refused however it is spelled.

The table is sbatch 22.05's, frozen here from the installed sbatch (``tests/fixtures/
sbatch-22.05``: ``--help``, ``--usage``, and probes of every one-letter prefix, whose
"ambiguous; possibilities" lines list the parser's real table, hidden options included, and of
each option with and without a value); ``tests/config/test_extra_directives.py`` checks the table
against that capture, and against a live ``sbatch --test-only`` on the dev cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

NONE, REQUIRED, OPTIONAL = "none", "required", "optional"

_NO_VALUE = ("contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet "
             "reboot requeue spread-job test-only usage use-min-nodes verbose version wait")
_OPTIONAL_VALUE = "exclusive get-user-env nice no-kill propagate"
_REQUIRED_VALUE = (
    "account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters "
    "comment constraint container context core-spec cores-per-socket cpu-freq cpus-per-gpu "
    "cpus-per-task deadline delay-boot dependency distribution error exclude export export-file "
    "extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres "
    "gres-flags hint input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem "
    "mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes ntasks "
    "ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode "
    "output partition power prefer priority profile qos reservation signal sockets-per-node "
    "switches tasks-per-node thread-spec threads-per-core time time-min tmp uid wait-all-nodes "
    "wckey wrap")

LONG_OPTIONS: dict[str, str] = {
    **{n: NONE for n in _NO_VALUE.split()},
    **{n: OPTIONAL for n in _OPTIONAL_VALUE.split()},
    **{n: REQUIRED for n in _REQUIRED_VALUE.split()},
}

# Two spellings, one option (sbatch's messages name the second).
ALIASES = {"tasks-per-node": "ntasks-per-node", "cluster": "clusters"}

# sbatch 22.05's short options and the long option each one is.
SHORT_OPTIONS: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
    "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile",
    "G": "gpus", "h": "help", "H": "hold", "i": "input", "J": "job-name", "k": "no-kill",
    "L": "licenses", "m": "distribution", "M": "clusters", "n": "ntasks", "N": "nodes",
    "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version",
    "w": "nodelist", "W": "wait", "x": "exclude",
}


class DirectiveError(ValueError):
    """An entry sbatch would refuse, or read otherwise than it looks; the message says which."""


@dataclass(frozen=True)
class Option:
    name: str            # the long name sbatch resolves the word to (aliases followed)
    written: str         # the option as written, e.g. "--no-requ" or "-J" (without its value)
    value: str | None


def resolve(words: list[str]) -> list[Option]:
    """The options sbatch's getopt_long would see in ``words`` (one #SBATCH line's words).

    Raises DirectiveError for what sbatch would refuse (unknown or ambiguous option, a missing
    value, a value given to an option that takes none) and for a bare word (sbatch would take it
    as the end of the options)."""
    out: list[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name_part, eq, value = word[2:].partition("=")
            name = long_name(name_part)
            has_arg = LONG_OPTIONS[name]
            if eq and has_arg == NONE:
                raise DirectiveError(f"--{name} takes no value (sbatch refuses {word!r})")
            if not eq and has_arg == REQUIRED:
                if i == len(words):
                    raise DirectiveError(f"--{name} needs a value: write --{name}=VALUE")
                value, i = words[i], i + 1
            out.append(Option(ALIASES.get(name, name), f"--{name_part}",
                              value if (eq or has_arg == REQUIRED) else None))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            j = 1
            while j < len(word):
                letter = word[j]
                if letter not in SHORT_OPTIONS:
                    raise DirectiveError(f"-{letter} is not an sbatch option")
                name = SHORT_OPTIONS[letter]
                has_arg = LONG_OPTIONS[name]
                rest = word[j + 1:]
                if has_arg == NONE:
                    out.append(Option(name, f"-{letter}", None))
                    j += 1
                    continue
                if rest:
                    value = rest
                elif has_arg == REQUIRED:
                    if i == len(words):
                        raise DirectiveError(f"-{letter} (--{name}) needs a value")
                    value, i = words[i], i + 1
                else:
                    value = None
                out.append(Option(name, f"-{letter}", value))
                break
        else:
            raise DirectiveError(f"{word!r} is not an option (an #SBATCH line holds options only)")
    return out


def long_name(prefix: str) -> str:
    """The long option ``--prefix`` means to getopt_long: an exact name, else the only name it
    starts. DirectiveError when no name or several names start with it."""
    if prefix in LONG_OPTIONS:
        return prefix
    matches = sorted(n for n in LONG_OPTIONS if n.startswith(prefix))
    if not matches:
        raise DirectiveError(f"--{prefix} is not an sbatch option")
    if len({ALIASES.get(m, m) for m in matches}) > 1:
        listed = ", ".join(f"--{m}" for m in matches[:8]) + (", ..." if len(matches) > 8 else "")
        raise DirectiveError(f"--{prefix} is ambiguous to sbatch ({listed}); write the option "
                             "in full")
    return matches[0]
