"""The checkpoint folder on disk: publish only complete checkpoints, verify, quarantine, prune.

::

    CHECKPOINTS/
      step-00000050/        complete: manifest.json is inside, written last
      step-00000100/
      latest                "step-00000100" (replaced atomically; for people and tools)
      owner.json            the run this folder belongs to (written when the run first uses it)
      .partial-step-00000150-a3/   being written by attempt 3 (or left by a killed one)
      quarantine/           partial or corrupt checkpoints moved aside, never deleted

A checkpoint is written into a ``.partial-*`` folder by every rank, then (after a barrier)
rank 0 writes the manifest (every file with its size and CRC32C, per item too, the step, the layout, the
versions), renames the folder to ``step-N`` and replaces ``latest``. A crash at any point
leaves either the previous state or a ``.partial-*`` folder, never a ``step-N`` folder
without a verified manifest. Resuming picks the newest ``step-N`` whose manifest verifies;
anything else found on the way is moved to ``quarantine/`` with a note saying why.

A checkpoint folder belongs to one run: ``owner.json`` names it and every manifest names the
run that saved it. A run never loads, sets aside or prunes another run's checkpoints: it
refuses to start in a folder that holds them (``claim``), and ``train.init_from`` is how a new
run starts from them.

Pure file operations (no torch), shared by the runtime and ``hpctrain status``-like tools.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
import zlib
from pathlib import Path
from typing import Callable

from .. import file_door
from ..errors import HpcTrainError, UsageError, from_os_error
from ..outputs import fsync_folder as fsync_dir, write_atomic
from .reader import CHECKPOINT_FORMAT


class CheckpointError(HpcTrainError):
    """A checkpoint that cannot be saved or loaded as asked (the message says why and the fix)."""

MANIFEST = "manifest.json"
LATEST = "latest"
QUARANTINE = "quarantine"
OWNER = "owner.json"
QUARANTINE_NOTE = "QUARANTINED.txt"
OWNER_FORMAT = "hpctrain-checkpoint-owner"
FORMAT = CHECKPOINT_FORMAT       # defined beside the manifest's checks (reader.manifest_problem)
FORMAT_VERSION = 2     # 2: CRC32C per file and per item (1: zlib CRC32 per file)
STEP_RE = re.compile(r"^step-(\d+)$")
PARTIAL_PREFIX = ".partial-"
CHUNK = 8 << 20


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_dir(root: Path, step: int, attempt: int) -> Path:
    return root / f"{PARTIAL_PREFIX}{step_name(step)}-a{attempt}"


CHECKSUMS = ("crc32c", "crc32")   # manifests of format 2 use CRC32C; format 1's zlib CRC32


def _crc_function(algorithm: str):
    if algorithm == "crc32":
        return zlib.crc32
    import crc32c
    return crc32c.crc32c


def file_checksum(path: Path, algorithm: str = "crc32c", *,
                  durable: bool = False) -> tuple[int, str]:
    """(size, checksum as 8 hex digits) of a file, read in large chunks; ``durable``: and on
    stable storage (``fsync``) once read, for a file its writer did not sync (megatron-core's
    ``common.pt`` and ``metadata.json`` are plain writes) before a manifest vouches for it."""
    from . import reader
    update = _crc_function(algorithm)
    crc = 0
    size = 0
    with reader.open_regular(path) as fd:   # a FIFO or a link left there is damage, not a hang
        if fd is None:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        while True:
            block = os.read(fd, CHUNK)
            if not block:
                break
            crc = update(block, crc)
            size += len(block)
        if durable:
            os.fsync(fd)
    return size, f"{crc & 0xFFFFFFFF:08x}"


def recorded_checksum(info: dict) -> tuple[str, str] | None:
    """(algorithm, hex) of a manifest's file entry; None when it records none."""
    for algorithm in CHECKSUMS:
        if info.get(algorithm):
            return algorithm, info[algorithm]
    return None


def list_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative, sorted), the manifest excluded."""
    out = []
    for dirpath, _, names in os.walk(folder):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), folder)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def share(names: list[str], rank: int, world: int) -> list[str]:
    """The files rank ``rank`` of ``world`` checksums or verifies (round robin)."""
    return names[rank::world]


def checksum_files(folder: Path, names: list[str], algorithm: str = "crc32c", *,
                   durable: bool = False) -> dict[str, dict]:
    out = {}
    for n in names:
        size, crc = file_checksum(folder / n, algorithm, durable=durable)
        out[n] = {"size": size, algorithm: crc}
    return out


def build_manifest(step: int, files: dict[str, dict], **info) -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info,
            "total_bytes": sum(f["size"] for f in files.values()), "files": files}


def write_json_atomic(path: Path, data: dict, *, durable: bool = True) -> None:
    """``data`` as JSON through the write door (``outputs.write_atomic``)."""
    write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n", durable=durable)


def read_manifest(folder: Path) -> dict | None:
    """The manifest of a checkpoint folder, checked by the run-folder reader's
    ``manifest_problem`` (sizes are counts, file names stay inside the folder: a name with
    ``..`` would make verification read, and a resume load, a file elsewhere); None when it is
    missing or fails a check (the checkpoint is then incomplete and set aside)."""
    from . import reader
    try:
        data = reader.read_json(folder / MANIFEST, check=reader.manifest_problem)
    except reader.DamagedFile:
        return None
    return data


def manifest_problems(folder: Path, manifest: dict | None) -> list[str]:
    """Cheap checks: the manifest is there and every listed file exists with its size."""
    if manifest is None:
        return [f"{MANIFEST} is missing or unreadable"]
    problems = []
    m = STEP_RE.match(folder.name)
    if m and int(m.group(1)) != manifest.get("step"):
        problems.append(f"folder says step {int(m.group(1))} but the manifest says "
                        f"{manifest.get('step')}")
    for name, info in manifest["files"].items():
        p = folder / name
        try:
            size = p.stat().st_size
        except OSError:
            problems.append(f"{name} is missing")
            continue
        if size != info.get("size"):
            problems.append(f"{name} has {size} bytes, the manifest says {info.get('size')}")
    return problems


def checksum_problems(folder: Path, manifest: dict, names: list[str]) -> list[str]:
    """Full check of ``names`` (a share of the manifest's files): checksum of the contents."""
    problems = []
    for name in names:
        recorded = recorded_checksum(manifest["files"][name])
        if recorded is None:
            continue
        algorithm, expected = recorded
        try:
            _, crc = file_checksum(folder / name, algorithm)
        except OSError as e:
            problems.append(f"{name}: {e.strerror}")
            continue
        except UsageError as e:       # reader.DamagedFile: a FIFO, a device, a link
            problems.append(f"{name}: {getattr(e, 'why', e)}")
            continue
        if crc != expected:
            problems.append(f"{name}: {algorithm.upper()} {crc} != {expected} in the manifest")
    return problems


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``step-N`` folders, newest first (not verified: see ``manifest_problems``)."""
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_RE.match(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d))
    return sorted(found, reverse=True)


def partial_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.name.startswith(PARTIAL_PREFIX) and d.is_dir())


def quarantine(root: Path, folder: Path, reason: str) -> Path:
    """Move ``folder`` to ``root/quarantine/`` with a note; return where it went."""
    qdir = root / QUARANTINE
    qdir.mkdir(parents=True, exist_ok=True)
    # one time for the name and its numbered tries: a second that ticked over between two
    # tries numbered a copy as a second one of a second it came first in
    base = f"{folder.name.lstrip('.')}-{time.strftime('%Y%m%d-%H%M%S')}"
    target = qdir / base
    n = 1
    while target.exists():
        n += 1
        target = qdir / f"{base}-{n}"
    os.rename(folder, target)
    write_atomic(target / QUARANTINE_NOTE,
                 f"moved here {time.strftime('%Y-%m-%d %H:%M:%S')}: {reason}\n")
    fsync_dir(root)
    return target


def publish(partial: Path, root: Path, step: int, manifest: dict) -> Path:
    """Write the manifest last, rename into place, update ``latest``. Rank 0 only."""
    write_json_atomic(partial / MANIFEST, manifest)
    fsync_dir(partial)
    final = root / step_name(step)
    if final.exists():
        # Same step saved again (an emergency save right after a periodic one): keep the old
        # one aside rather than overwrite it.
        quarantine(root, final, f"replaced by a newer save of step {step}")
    os.rename(partial, final)
    fsync_dir(root)
    set_latest(root, final.name)
    return final


def set_latest(root: Path, name: str) -> None:
    write_atomic(root / LATEST, name + "\n")


def read_latest(root: Path) -> str | None:
    from . import reader
    try:
        text = reader.read_text(root / LATEST, 4096)
    except reader.DamagedFile:
        return None
    return (text or "").strip() or None


def verified_checkpoints(root: Path, run_id: str | None = None) -> list[tuple[int, Path]]:
    """``step-N`` folders that pass the cheap check (manifest present, every file at its size),
    saved by ``run_id`` when given; newest first."""
    out = []
    for step, d in complete_checkpoints(root):
        manifest = read_manifest(d)
        if manifest is None or manifest_problems(d, manifest):
            continue
        if run_id is not None and manifest.get("run") != run_id:
            continue
        out.append((step, d))
    return out


def prune(root: Path, keep_last: int, log: Callable[[str], None] = print,
          run_id: str | None = None) -> list[Path]:
    """Delete ``run_id``'s verified checkpoints older than its newest ``keep_last`` verified
    ones (at least one is kept).

    Only checkpoints that pass the cheap check are counted and deleted: a damaged newer one
    never pushes the newest good one out, and anything unverifiable is left for the resume
    logic to quarantine. Another run's checkpoints are neither counted nor deleted.
    """
    keep_last = max(1, keep_last)
    removed = []
    for _, d in verified_checkpoints(root, run_id)[keep_last:]:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
        log(f"checkpoint: removed {d.name} (checkpoint.keep_last={keep_last})")
    if removed:
        fsync_dir(root)
    return removed


# ---- ownership: one folder, one run ------------------------------------------------------------


class ForeignCheckpointsError(UsageError):
    """A checkpoint folder holds another run's checkpoints (or ones whose run is unknown)."""


def read_owner(root: Path) -> dict | None:
    """``owner.json`` of ``root``: None when there is none; raises when it cannot be read."""
    path = root / OWNER
    from . import reader
    if not os.path.lexists(path):
        return None
    try:
        data = reader.read_json(path)
    except reader.DamagedFile as e:
        raise ForeignCheckpointsError(
            f"checkpoint folder {root}: {OWNER} cannot be read ({e.why}); it names the run that owns "
            f"the folder, so nothing there is used: fix or remove it by hand, or choose another "
            f"checkpoint.dir") from None
    if not isinstance(data, dict) or data.get("format") != OWNER_FORMAT or \
            not isinstance(data.get("run"), str):
        raise ForeignCheckpointsError(
            f"checkpoint folder {root}: {OWNER} is not an hpctrain owner record; choose another "
            f"checkpoint.dir")
    return data


def foreign_checkpoints(root: Path, run_id: str) -> tuple[str | None, str] | None:
    """Why ``root`` is not ``run_id``'s to use: ``(other run id or None if unknown, what was
    found)``; None when the folder is free or already ``run_id``'s.

    The owner record decides; every manifest must also name ``run_id``. A folder without an
    owner record (made before it, or by hand) is this run's only if every checkpoint in it
    says so: a save in progress (``.partial-*``) or a manifest that cannot be read has no
    known run, so it is not touched either.
    """
    if not root.is_dir():
        return None
    owner = read_owner(root)
    if owner is not None and owner["run"] != run_id:
        return owner["run"], f"{OWNER} names run {owner['run']}"
    for _, d in complete_checkpoints(root):
        manifest = read_manifest(d)
        saved_by = manifest.get("run") if manifest else None
        if saved_by == run_id:
            continue
        if saved_by:
            return saved_by, f"{d.name} was saved by run {saved_by}"
        if owner is None:
            return None, f"{d.name} has no readable manifest naming its run"
    if owner is None:
        partial = partial_checkpoints(root)
        if len(partial) == 1:
            return None, f"{partial[0].name} (a save in progress or left by a killed job) " \
                         f"belongs to no known run"
        if partial:         # every one of them: the operator checks each before moving it
            return None, f"{', '.join(p.name for p in partial)} (saves in progress or left " \
                         f"by killed jobs) belong to no known run"
    return None


def foreign_message(root: Path, who: str, found: tuple[str | None, str]) -> str:
    """The refusal, with the fix: resume that run, or start from its weights elsewhere."""
    other, what = found
    fixes = []
    if other:
        fixes.append(f"continue that run: `hpctrain resume {other}`")
    fixes.append(f"start from its weights: train.init_from: {root} with another checkpoint.dir "
                 f"(or none: each run then gets a folder of its own)")
    return (f"checkpoint.dir: {root} holds another run's checkpoints ({what}), which {who} "
            f"must not load, set aside or delete. To " + "; to ".join(fixes)
            + "; or point checkpoint.dir at an empty folder")


def location_problem(root: Path, run_dir: str | os.PathLike | None,
                     runs_root: Path | None = None) -> str | None:
    """Why ``root`` cannot be a run's checkpoint folder because of where it is, or None.

    Not inside another run's folder: this run would write into it, and removing that run
    (``hpctrain runs rm``) would delete these checkpoints. Not a folder that holds run folders
    (the runs root, a folder above this run's own): the checkpoints would sit among runs, and
    pruning or a resume's quarantine would work in a folder of runs. ``run_dir``: this run's
    folder (its own ``checkpoints`` folder is where checkpoints go by default); ``runs_root``:
    where its folder will be, for a run not created yet."""
    from .files import is_run_folder
    real = Path(os.path.realpath(root))
    own = Path(os.path.realpath(run_dir)) if run_dir is not None else None
    for above in (real, *real.parents):
        if above != own and is_run_folder(above):
            where = "is another run's folder" if above == real else \
                f"is inside {above}, another run's folder"
            return f"{root} {where} (removing that run would delete these checkpoints)"
    for holder, what in ((own, "this run's folder"),
                         (Path(os.path.realpath(runs_root)) if runs_root is not None else None,
                          "the folder of run folders")):
        if holder is not None and holder == real:
            return f"{root} is {what}"
        if holder is not None and real in holder.parents:
            return f"{root} holds run folders ({holder} is inside it)"
    # A file (a link to one, a FIFO, a device) where the folder is to be, or as a part of its
    # path: the claim's mkdir cannot make it, and the ranks would find out at their first save,
    # after the queue and the steps before it. A link that realpath left as it is (a symlink
    # loop) is there but leads nowhere: no mkdir makes it a folder either.
    for above in (real, *real.parents):
        if os.path.islink(above) and not os.path.exists(above):
            where = "is" if above == real else f"is inside {above}, which is"
            return f"{root} {where} a symlink loop, not a folder"
        if os.path.exists(above):            # the nearest part of the path that is there
            if not above.is_dir():
                mode = os.stat(above).st_mode
                what = "a file" if stat.S_ISREG(mode) else file_door.kind_of(mode)
                where = "is" if above == real else f"is inside {above}, which is"
                return f"{root} {where} {what}, not a folder"
            break
    try:
        inside = next((d for d in real.iterdir() if is_run_folder(d)), None) \
            if real.is_dir() else None
    except OSError:
        inside = None
    if inside is not None:
        if inside.is_symlink():     # pruning or a quarantine there would act through it
            return f"{root} holds a link to a run folder ({inside.name} -> " \
                   f"{file_door.show(os.path.realpath(inside))})"
        return f"{root} holds run folders ({inside.name})"
    return None


def check_location(root: Path, run_dir: str | os.PathLike | None,
                   runs_root: Path | None = None, field: str = "checkpoint.dir") -> None:
    """Raise ForeignCheckpointsError when ``root`` is where no run's checkpoints may go
    (:func:`location_problem`), naming ``field``: the job's ``checkpoint.dir``, or the
    profile's ``storage.checkpoint_root`` (under which each run keeps ``<root>/<run id>``)."""
    why = location_problem(root, run_dir, runs_root)
    if why:
        unset = "leave it unset" if field == "checkpoint.dir" else "set it to null"
        raise ForeignCheckpointsError(
            f"{field}: {why}; point it at a folder of its own (or {unset}: each "
            f"run keeps its checkpoints in its own folder)")


def check_entries(root: Path) -> None:
    """A UsageError when ``latest`` in ``root``, which every save rewrites, is a FIFO, device,
    folder or link: the write door refuses it (never writes through), and the ranks would find
    out at their first save, after the queue and the steps before it. (``owner.json`` is read,
    and so checked, by :func:`check_owner`.)"""
    try:
        mode = os.lstat(root / LATEST).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        raise UsageError(f"checkpoint folder {root}: {LATEST} is {file_door.kind_of(mode)}, not a "
                         f"regular file; move it away (every save rewrites it)")


def check_owner(root: Path, run_id: str, who: str | None = None) -> None:
    """Raise ForeignCheckpointsError when ``root`` is not free or ``run_id``'s (reads only).
    ``run_id`` "" stands for a run not created yet (every checkpoint is another run's)."""
    found = foreign_checkpoints(root, run_id)
    if found:
        raise ForeignCheckpointsError(foreign_message(
            root, who or (f"run {run_id}" if run_id else "a new run"), found))


def make_folder(path: Path, mode: int = 0o700) -> bool:
    """Create ``path`` (and missing parents) with ``mode`` exactly; True when it was created."""
    if path.is_dir():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return False
    os.chmod(path, mode)  # mkdir's mode is masked by the umask
    return True


def claim(root: Path, run_id: str, run_dir: str | os.PathLike | None = None,
          mode: int = 0o700) -> bool:
    """Make ``root`` ``run_id``'s checkpoint folder: check it holds no other run's checkpoints,
    create it (``mode``) if missing, write ``owner.json`` if missing. True when this call
    wrote the owner record. Two runs claiming one folder at once: one wins (``link`` is atomic),
    the other is refused."""
    check_owner(root, run_id)      # another run's checkpoints: refused with how to continue it
    if run_dir is not None:
        check_location(root, run_dir)
    with _worded_as_claim(root):
        make_folder(root, mode)
    if read_owner(root) is not None:
        check_owner(root, run_id)   # another run may have claimed it since the first check
        return False
    record = {"format": OWNER_FORMAT, "run": run_id,
              "run_dir": str(run_dir) if run_dir is not None else None,
              "claimed": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        with _worded_as_claim(root):
            write_atomic(root / OWNER, json.dumps(record, indent=1) + "\n", exclusive=True)
        created = True
    except FileExistsError:
        created = False
    check_owner(root, run_id)   # lost a race: the other run's record is there now
    return created


@contextlib.contextmanager
def _worded_as_claim(root: Path):
    """A folder that cannot be made or written (``/proc/self``, a read-only mount) refused in
    one line that says what was being done and which setting chooses the folder, not only the
    file system's words for the file. ``FileExistsError`` passes: a lost claim race is read
    back by the caller."""
    try:
        yield
    except FileExistsError:
        raise
    except OSError as e:
        raise from_os_error(e, fix=(       # a full disk stays a failure (exit 1)
            f"{root} cannot be made this run's checkpoint folder: point checkpoint.dir (or "
            f"the profile's storage.checkpoint_root) at a folder this user can create and "
            f"write")) from None


def release(root: Path, run_id: str) -> None:
    """Undo a ``claim`` whose submission failed: remove ``run_id``'s owner record from a folder
    that holds no checkpoint yet (the folder itself stays)."""
    try:
        owner = read_owner(root)
    except ForeignCheckpointsError:
        return
    if owner is None or owner["run"] != run_id or complete_checkpoints(root) or \
            partial_checkpoints(root):
        return
    (root / OWNER).unlink(missing_ok=True)
    fsync_dir(root)
