"""The README's quick-start sample: found, free of machine paths, and compared in a way that
catches a changed line. Its comparison with a real run is in the main job's test
(tests/integration/test_training_jobs.py), which trains once for both."""

from __future__ import annotations

from tests.docs.quick_start import PATH, problems, readme_quick_start, shape


def test_the_sample_is_a_whole_run_without_machine_paths():
    lines = readme_quick_start()
    assert lines[0].startswith("Submitted ") and lines[-1].startswith("Run ")
    paths = [m[0] for line in lines for m in PATH.finditer(line)]
    assert paths and all(p.startswith(".../") for p in paths), paths


def test_a_reworded_missing_or_extra_line_is_a_problem():
    lines = readme_quick_start()
    printed = "\n".join(line.replace(".../", "/somewhere/else/") for line in lines)
    assert problems(lines, printed) == []
    step = next(i for i, line in enumerate(lines) if "| loss " in line)
    reworded = lines[:step] + [lines[step].replace("| loss ", "| loss: ")] + lines[step + 1:]
    assert any("does not print" in p for p in problems(reworded, printed))
    without_steps = [line for line in lines if "| loss " not in line]
    assert any("does not show" in p and "| loss " in p for p in problems(without_steps, printed))
    swapped = [lines[1], lines[0], *lines[2:]]
    assert problems(swapped, printed) and "where the job first prints" in problems(swapped, printed)[0]


def test_run_names_paths_times_and_numbers_are_masked():
    a = "14:16:31 rank 0: step 10/60 | loss 3.3079 -> /x/runs/tiny-gpt-20261126-141503-afa1"
    b = "09:01:02 rank 0: step 2/16 | loss 5.1 -> .../runs/tiny-gpt-20251231-235959-00ff"
    assert shape(a) == shape(b)
    assert shape(a) != shape(a.replace("loss", "los"))


def test_an_eta_or_save_time_of_any_length_has_one_shape():
    """A slow machine prints ``ETA 1m47s`` where the README shows ``ETA 38s``."""
    line = "19:16:46 rank 0: step 10/60 | 0.762 s/step | MFU n/a | ETA {}"
    shapes = {shape(line.format(d)) for d in ("0s", "38s", "1m47s", "2h03m", "1d04h")}
    assert len(shapes) == 1, shapes
    assert shape(line.format("38s")) != shape(line.format("38 s"))
    saved = "checkpoint: saved step 8 (periodic, background 10.9 MB in {})"
    assert shape(saved.format("7.70s")) == shape(saved.format("1m02s"))
