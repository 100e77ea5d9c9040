"""A checkpoint save by rank 0's own steps, on whatever storage the test made faulty (a full
tmpfs, a read-only mount, a folder this user may not write), through the save-fault door.

``ROOT COMMAND...``; ``save STEP BYTES``: what a rank-0 save does on the storage, with the runtime's own code:
make the partial folder, write a shard through the checksumming writer, publish (manifest
last, rename, ``latest``), all inside :func:`save_faults_in_one_line`. Prints one JSON line:
``{"saved": path}`` or ``{"fault": the one line, "logged": what went to the rank log}``.

``state``: the checkpoint folder as resume would see it, and a SHA-256 of every file.

Run by ``tests/runtime/test_save_faults_on_real_storage.py`` in a separate process, often as
another user or in a user and mount namespace; no torch.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from hpctrain.record import checkpoint_store as store
from hpctrain.runtime.checkpoint.save_faults import SaveFault, save_faults_in_one_line
from hpctrain.runtime.checkpoint.writer import CHECKSUM, ChecksumStream

RUN_ID = "tiny-20260101-000000-ab12"
CHUNK = 1 << 16


def newest(root: Path) -> str | None:
    name = store.read_latest(root)
    return str(root / name) if name else None


def save(root: Path, step: int, size: int) -> dict:
    logged: list[str] = []
    try:
        with save_faults_in_one_line(step=step, path=root, newest=lambda: newest(root),
                                     run_id=RUN_ID, log=logged.append):
            root.mkdir(parents=True, exist_ok=True)
            partial = store.partial_dir(root, step, 1)
            partial.mkdir()
            stream = ChecksumStream(str(partial / "__0_0.distcp"))
            try:
                for _ in range(size // CHUNK):
                    stream.write(bytes([step]) * CHUNK)
            except BaseException:
                stream.file.close()
                raise
            files = {"__0_0.distcp": stream.finish()}
            manifest = store.build_manifest(step, files, kind="full", checksum=CHECKSUM,
                                            run=RUN_ID)
            return {"saved": str(store.publish(partial, root, step, manifest))}
    except SaveFault as e:
        return {"fault": str(e), "logged": "\n".join(logged)}


def state(root: Path) -> dict:
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}
    return {"complete": [s for s, _ in store.complete_checkpoints(root)],
            "latest": store.read_latest(root),
            "partials": [p.name for p in store.partial_checkpoints(root)], "files": files}


def main(root: Path, commands: list[str]) -> None:
    """Run each command in turn: ``save STEP BYTES``, ``state``, ``remount-ro`` (the mount
    holding ``root``, in the test's mount namespace)."""
    while commands:
        command = commands.pop(0)
        if command == "save":
            out = save(root, int(commands.pop(0)), int(commands.pop(0)))
        elif command == "state":
            out = state(root)
        elif command == "remount-ro":
            subprocess.run(["mount", "-o", "remount,ro", str(root.parent)], check=True)
            continue
        else:
            raise SystemExit(f"unknown command {command!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
