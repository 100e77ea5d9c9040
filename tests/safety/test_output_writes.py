"""Outputs a user names or hpctrain makes (``report -o``, ``data prepare``'s dataset and
metadata, ``bench kernels``' table, ``bench scaling``'s result) go through the one write door
(``hpctrain.outputs``): a symbolic link at the output is refused by name before any work, a
link planted at a temporary name the writers once used is never written through, and a
file already there is replaced whole (a reader holding the old one keeps it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.outputs import AtomicFile
from tests.conftest import REPO, hpctrain
from tests.ops.helpers import crafted_run, png_size

MINE = b"the user's own file\n"


def _plant(path: Path, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside)


def _untouched(links: list[Path], outside: Path) -> None:
    assert outside.read_bytes() == MINE
    for link in links:
        assert link.is_symlink() and os.readlink(link) == str(outside)


def _no_temporaries(folder: Path, planted: list[Path]) -> None:
    left = {p for p in folder.iterdir() if p.name.endswith(".tmp") or ".tmp" in p.name}
    assert left == set(planted), sorted(map(str, left - set(planted)))


def test_report_to_a_symbolic_link_is_one_error_line_and_its_target_is_untouched(tmp_path):
    """``report -o LINK`` (one run, and several runs compared) and a link where the default
    ``report.png`` goes: one ``Error:`` line naming the path, exit 2, the file the link points
    to keeps every byte."""
    run = crafted_run(tmp_path, ledger=[], metrics=[{"step": s, "loss": 5.0 - s / 10}
                                                     for s in range(1, 6)])
    outside = tmp_path / "precious.png"
    outside.write_bytes(MINE)
    link = tmp_path / "out.png"
    _plant(link, outside)
    _plant(run.path / "report.png", outside)
    for args, named in (([str(run.path), "-o", str(link)], link),
                        ([str(run.path)], run.path / "report.png")):
        proc = hpctrain("report", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines == [f"Error: --output {named}: is a symbolic link; give the path of a "
                         f"regular file or a new one"], proc.stderr
    _untouched([link, run.path / "report.png"], outside)


def test_links_at_the_temporary_names_writers_once_used_are_never_written_through(tmp_path):
    """``.NAME.tmp.png`` (report, scaling PNG), ``.scaling.json.tmp``, ``.NAME.PID.tmp`` (kernel
    table), ``PREFIX.bin.tmp-PID`` (dataset): a link planted there is left alone, and so is
    what it points to; each output is written whole as a regular file."""
    from matplotlib.figure import Figure

    from hpctrain.bench import kernels, scaling_report
    from hpctrain.bench.scaling import ScalingResult, plan_sizes
    from hpctrain.config import load_job, load_profile
    from hpctrain.data.prepare import prepare
    from hpctrain.ops.report import write_png
    outside = tmp_path / "outside"
    outside.write_bytes(MINE)
    out = tmp_path / "out"
    pid = os.getpid()
    planted = [out / name for name in (
        ".report.png.tmp.png", ".scaling.png.tmp.png", ".scaling.json.tmp",
        f".table.json.{pid}.tmp", f"corpus.bin.tmp-{pid}", f"corpus.idx.tmp-{pid}")]
    for p in planted:
        _plant(p, outside)

    fig = Figure(figsize=(3, 2), dpi=100)
    fig.add_subplot().plot([1, 2, 3])
    write_png(fig, out / "report.png")
    assert png_size(out / "report.png") == (300, 200)

    sizes = plan_sizes(load_job(REPO / "examples" / "llama2-7b.yaml"),
                       load_profile("h100-ib-pyxis"), [1, 2], steps=3, strong=False)
    result = ScalingResult("llama2-7b", "h100-ib-pyxis", False, 3, 1, sizes)
    scaling_report.save(result, out)
    assert json.loads((out / "scaling.json").read_text())["png"] == str(out / "scaling.png")
    assert png_size(out / "scaling.png")[0] > 0

    kernels.write_table({"format": 1}, out / "table.json")
    assert json.loads((out / "table.json").read_text()) == {"format": 1}
    with pytest.raises(FileExistsError):                 # an existing table is never replaced
        kernels.write_table({"format": 2}, out / "table.json")

    text = tmp_path / "corpus.txt"
    text.write_text("in the beginning\n\nand the earth\n")
    stats = prepare([text], out / "corpus")
    assert stats.documents == 2 and (out / "corpus.bin").stat().st_size == 2 * stats.tokens  # uint16

    _untouched(planted, outside)
    for name in ("report.png", "scaling.png", "scaling.json", "table.json", "corpus.bin", "corpus.idx", "corpus.meta.json"):
        assert (out / name).is_file() and not (out / name).is_symlink()
    _no_temporaries(out, planted)


def test_prepare_again_replaces_the_dataset_and_its_metadata_whole(tmp_path):
    """A second ``data prepare`` to the same prefix renames new files into place: a reader
    holding the first dataset (here, hard links to its files) keeps it byte for byte, never a
    truncated or mixed file, and the metadata says the new counts."""
    from hpctrain.data.prepare import meta_path, prepare, read_meta
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("one\n\ntwo\n\nthree\n")
    second.write_text("a much longer single document\n")
    prefix = tmp_path / "data" / "corpus"
    prepare([first], prefix)
    names = [Path(f"{prefix}{s}") for s in (".bin", ".idx", ".meta.json")]
    held = {p: tmp_path / f"held{p.suffix}" for p in names}
    before = {p: p.read_bytes() for p in names}
    for p, keep in held.items():
        os.link(p, keep)
    assert read_meta(prefix)["documents"] == 3
    prepare([second], prefix)
    assert read_meta(prefix)["documents"] == 1 and read_meta(prefix)["sources"] == [str(second)]
    for p, keep in held.items():
        assert keep.read_bytes() == before[p], p            # the old inode, never rewritten
        assert p.read_bytes() != before[p]
    assert meta_path(prefix).stat().st_mode & 0o777 == 0o666 & ~_umask()
    _no_temporaries(prefix.parent, [])


def test_a_failed_streamed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    """The streaming door (the dataset's ``.bin``, a PNG): an error mid-write keeps what was
    there and removes the temporary file."""
    path = tmp_path / "report.png"
    path.write_bytes(MINE)
    with pytest.raises(RuntimeError, match="drawing failed"):
        with AtomicFile(path) as f:
            f.write(b"half a picture")
            raise RuntimeError("drawing failed")
    assert path.read_bytes() == MINE
    assert os.listdir(tmp_path) == ["report.png"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
