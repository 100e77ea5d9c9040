"""The checkpoint folder on disk: publish only complete checkpoints, verify, quarantine, prune.

::

    CHECKPOINTS/
      step-00000050/        complete: manifest.json is inside, written last
      step-00000100/
      latest                "step-00000100" (replaced atomically; for people and tools)
      .partial-step-00000150-a3/   being written by attempt 3 (or left by a killed one)
      quarantine/           partial or corrupt checkpoints moved aside, never deleted

A checkpoint is written into a ``.partial-*`` folder by every rank, then (after a barrier)
rank 0 writes the manifest (every file with its size and CRC32, the step, the layout, the
versions), renames the folder to ``step-N`` and replaces ``latest``. A crash at any point
leaves either the previous state or a ``.partial-*`` folder, never a ``step-N`` folder
without a verified manifest. Resuming picks the newest ``step-N`` whose manifest verifies;
anything else found on the way is moved to ``quarantine/`` with a note saying why.

Pure file operations (no torch), shared by the runtime and ``hpctrain status``-like tools.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import Callable

MANIFEST = "manifest.json"
LATEST = "latest"
QUARANTINE = "quarantine"
FORMAT = "hpctrain-checkpoint"
FORMAT_VERSION = 1
STEP_RE = re.compile(r"^step-(\d+)$")
PARTIAL_PREFIX = ".partial-"
CHUNK = 8 << 20


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_dir(root: Path, step: int, attempt: int) -> Path:
    return root / f"{PARTIAL_PREFIX}{step_name(step)}-a{attempt}"


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_checksum(path: Path) -> tuple[int, str]:
    """(size, CRC32 as 8 hex digits) of a file, read in large chunks."""
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            crc = zlib.crc32(block, crc)
            size += len(block)
    return size, f"{crc & 0xFFFFFFFF:08x}"


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


def checksum_files(folder: Path, names: list[str]) -> dict[str, dict]:
    out = {}
    for n in names:
        size, crc = file_checksum(folder / n)
        out[n] = {"size": size, "crc32": crc}
    return out


def build_manifest(step: int, files: dict[str, dict], **info) -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info,
            "total_bytes": sum(f["size"] for f in files.values()), "files": files}


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
            data.get("files"), dict):
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
    """Full check of ``names`` (a share of the manifest's files): CRC32 of the contents."""
    problems = []
    for name in names:
        info = manifest["files"][name]
        try:
            _, crc = file_checksum(folder / name)
        except OSError as e:
            problems.append(f"{name}: {e.strerror}")
            continue
        if info.get("crc32") and crc != info["crc32"]:
            problems.append(f"{name}: CRC32 {crc} != {info['crc32']} in the manifest")
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
    base = folder.name.lstrip(".")
    target = qdir / f"{base}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while target.exists():
        n += 1
        target = qdir / f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    os.rename(folder, target)
    (target / "QUARANTINED.txt").write_text(f"moved here {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                                            f"{reason}\n")
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
    tmp = root / f".{LATEST}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def read_latest(root: Path) -> str | None:
    try:
        return (root / LATEST).read_text().strip() or None
    except OSError:
        return None


def prune(root: Path, keep_last: int, log: Callable[[str], None] = print) -> list[Path]:
    """Delete complete checkpoints older than the newest ``keep_last`` (at least one is kept).

    Only folders whose manifest reads are counted and deleted; anything unverifiable is left
    for the resume logic to quarantine.
    """
    keep_last = max(1, keep_last)
    complete = [(s, d) for s, d in complete_checkpoints(root) if read_manifest(d) is not None]
    removed = []
    for _, d in complete[keep_last:]:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
        log(f"checkpoint: removed {d.name} (checkpoint.keep_last={keep_last})")
    return removed
