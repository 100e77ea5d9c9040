"""The README's quick-start output against what the main job prints.

The README shows the real output of `hpctrain submit examples/tiny.yaml`; the suite's main-job
test (tests/integration/test_training_jobs.py) runs the same job, shortened, and compares what
it printed with the README through :func:`problems`. Lines are compared by their shape: run
names, paths, clock times, durations (an ETA of ``38s`` on one machine is ``1m47s`` on a slower
one) and every number are masked (the test's run is shorter, so its steps, losses and timings
differ), the words and the fields are not. The README must show every kind
of line the job prints, only lines it prints, and in the order it prints them.
"""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.docs.markdown_check import FENCE

QUICK_START_HEADING = "### What the main job does"

PATH = re.compile(r"(?<!\S)(?:\.\.\./|/)\S*")
RUN_ID = re.compile(r"[A-Za-z0-9_.+-]+-\d{8}-\d{6}-[0-9a-f]{4}")
CLOCK = re.compile(r"\b\d{2}:\d{2}:\d{2}\b")
# format_duration's shapes (42s, 3m05s, 2h03m, 1d04h, 0.83s): one token, however long it is
DURATION = re.compile(r"\b(?:\d+d\d{2}h|\d+h\d{2}m|\d+m\d{2}s|\d+(?:\.\d+)?s)\b")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def readme_quick_start(text: str | None = None) -> list[str]:
    """The lines of the first code block after the README's "What the main job does"."""
    text = (REPO / "README.md").read_text() if text is None else text
    assert QUICK_START_HEADING in text, f"README.md lacks the heading {QUICK_START_HEADING!r}"
    after = text.split(QUICK_START_HEADING, 1)[1].splitlines()
    start = next(i for i, line in enumerate(after) if FENCE.match(line))
    end = next(i for i in range(start + 1, len(after)) if FENCE.match(after[i]))
    return after[start + 1:end]


def shape(line: str) -> str:
    """A printed line with what differs from run to run masked."""
    line = PATH.sub("<path>", line.strip())
    line = RUN_ID.sub("<run>", line)
    line = CLOCK.sub("<time>", line)
    line = DURATION.sub("<duration>", line)
    return NUMBER.sub("N", line)


def _first_shapes(lines: list[str]) -> dict[str, str]:
    """Each distinct shape (in order of first appearance) with the first line that has it."""
    out: dict[str, str] = {}
    for line in lines:
        if line.strip() and line.strip() != "...":
            out.setdefault(shape(line), line.strip())
    return out


def problems(readme_lines: list[str], printed: str) -> list[str]:
    """Why the README's sample is not what the job printed; empty when it is."""
    shown = _first_shapes(readme_lines)
    real = _first_shapes(printed.splitlines())
    out = [f"the README shows a line the main job does not print: {line}"
           for s, line in shown.items() if s not in real]
    out += [f"the main job prints a line the README does not show: {line}"
            for s, line in real.items() if s not in shown]
    common_shown = [s for s in shown if s in real]
    common_real = [s for s in real if s in shown]
    if not out and common_shown != common_real:
        first = next(i for i, (a, b) in enumerate(zip(common_shown, common_real)) if a != b)
        out.append(f"the README shows {shown[common_shown[first]]!r} where the job first prints "
                   f"{real[common_real[first]]!r}")
    return out
