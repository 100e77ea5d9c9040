"""Checkpoint storage: writable, shared, big enough, fast enough for an emergency save.

Why: a checkpoint folder on node-local disk looks fine until the requeued job lands on another
node and resumes from nothing; a slow filesystem turns the preemption signal's lead time into
a half-written checkpoint. Filesystem types come from ``/proc/mounts`` (path configurable for
tests via the test variable ``HPCTRAIN_TEST_PROC_MOUNTS``); bandwidth is measured with real writes and fsync.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import fault_injection
from ..outputs import probe_file
from .results import FAIL, PASS, WARN, Check

LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "ramfs", "f2fs",
            "vfat", "devtmpfs", "squashfs"}
SHARED_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "wekafs", "weka", "cephfs", "ceph",
             "glusterfs", "fuse.glusterfs", "cifs", "smb3", "panfs", "pvfs2", "fuse.weka",
             "fuse.juicefs", "fuse.cephfs", "virtiofs", "9p"}


@dataclass
class Mount:
    device: str
    point: str
    fstype: str


def _unescape(field: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as octal (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_proc_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(Mount(_unescape(parts[0]), _unescape(parts[1]), parts[2]))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (longest mount point that is a prefix; later mounts win)."""
    p = os.path.abspath(path)
    best = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        if p == point or p.startswith(point + "/") or point == "/":
            if best is None or len(point) >= len(best.point.rstrip("/") or "/"):
                best = m
    return best


def fs_kind(fstype: str) -> str:
    if fstype in SHARED_FS or fstype.startswith("nfs"):
        return "shared"
    if fstype in LOCAL_FS:
        return "local"
    return "unknown"


PROBE_PREFIX = ".hpctrain-preflight-"


def measure_write_bandwidth(folder: Path, size_mb: int, block_mb: int = 4) -> float:
    """Write ``size_mb`` MB in one probe file with fsync, then delete it; returns MB/s (MB of
    2**20 bytes, of what the file holds when synced)."""
    block = os.urandom(block_mb << 20)
    t0 = time.perf_counter()
    with probe_file(folder, PROBE_PREFIX) as (f, _):
        for _ in range(max(1, size_mb // block_mb)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        written = f.tell()
        dt = time.perf_counter() - t0
    return written / 2**20 / max(dt, 1e-9)


def probe_fault(folder: Path, e: OSError) -> str:
    """One line for a probe write that failed: the folder and what the storage said."""
    import errno
    what = e.strerror or str(e)
    name = errno.errorcode.get(e.errno or 0)
    return f"{folder}: {what}" + (f" ({name})" if name else "")


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_storage(folder: str, profile, nodes: int, node: str, *, probe_mb: int,
                  checkpoint_bytes: int | None, one_host: bool = False, strict: bool = True,
                  mounts_text: str | None = None) -> list[Check]:
    path = Path(folder).expanduser()
    out = []
    # Never create the folder here: a missing mount must show up as missing, not be papered over.
    base = _existing_ancestor(path)
    if base != path and base == Path(path.anchor):
        return [Check(node, "storage.writable", FAIL, f"{path} does not exist (nothing of it is "
                      "mounted here)", "an existing shared folder",
                      "mount the shared filesystem on this node or fix storage.checkpoint_root")]
    try:
        with probe_file(base, PROBE_PREFIX) as (f, _):
            f.write(b"ok")
            f.flush()
        note = "" if base == path else f" (not created yet; {base} is writable)"
        out.append(Check(node, "storage.writable", PASS, f"{path}{note}", "writable"))
    except OSError as e:
        return [Check(node, "storage.writable", FAIL, probe_fault(base, e), "writable",
                      "fix permissions or point storage.checkpoint_root at a writable shared folder")]
    if mounts_text is None:
        try:
            mounts_text = Path(fault_injection.value("HPCTRAIN_TEST_PROC_MOUNTS")
                               or "/proc/mounts").read_text()
        except OSError:
            mounts_text = ""
    m = mount_for(str(base.resolve()), parse_proc_mounts(mounts_text))
    out.append(_shared(m, path, nodes, node, one_host, strict))
    st = os.statvfs(base)
    free_gb = st.f_bavail * st.f_frsize / 1e9
    need = profile.storage.min_free_gb
    ck_gb = checkpoint_bytes / 1e9 if checkpoint_bytes else None
    if free_gb < need:
        out.append(Check(node, "storage.free", FAIL, f"{free_gb:.1f} GB free", f">= {need:g} GB "
                         "(storage.min_free_gb)", "free space or move storage.checkpoint_root"))
    elif ck_gb and free_gb < 2 * ck_gb:
        out.append(Check(node, "storage.free", WARN, f"{free_gb:.1f} GB free", f">= {2 * ck_gb:.1f} GB "
                         "(two checkpoints)", "a new checkpoint is written before the old one is "
                         "removed: free space"))
    else:
        out.append(Check(node, "storage.free", PASS, f"{free_gb:.1f} GB free", f">= {need:g} GB"))
    out += _bandwidth(path, profile, nodes, node, probe_mb, checkpoint_bytes)
    return out


def _shared(m: Mount | None, path: Path, nodes: int, node: str, one_host: bool,
            strict: bool) -> Check:
    if m is None:
        return Check(node, "storage.shared", WARN, f"{path}: filesystem unknown", "shared filesystem",
                     "check /proc/mounts")
    kind = fs_kind(m.fstype)
    measured = f"{m.fstype} at {m.point}"
    if kind == "shared":
        return Check(node, "storage.shared", PASS, measured, "shared filesystem")
    if kind == "unknown":
        return Check(node, "storage.shared", WARN, measured, "shared filesystem",
                     "make sure every node sees this folder at the same path")
    if nodes <= 1 or one_host:
        return Check(node, "storage.shared", PASS, measured + (" (all nodes on one host)" if one_host
                     else " (single node)"), "shared filesystem")
    return Check(node, "storage.shared", FAIL if strict else WARN, measured + " is node-local",
                 f"shared filesystem ({nodes} nodes)", "a requeued job on another node will not find "
                 "these checkpoints: set storage.checkpoint_root to NFS/Lustre/GPFS/BeeGFS/Weka")


def _bandwidth(path: Path, profile, nodes: int, node: str, probe_mb: int,
               checkpoint_bytes: int | None) -> list[Check]:
    if probe_mb <= 0:
        return []
    try:
        mbs = measure_write_bandwidth(_existing_ancestor(path), probe_mb)
    except OSError as e:
        return [Check(node, "storage.write_bw", FAIL,
                      f"write failed: {probe_fault(_existing_ancestor(path), e)}",
                      f"{probe_mb} MB written", "free space or fix the filesystem")]
    return [Check(node, "storage.write_bw", PASS, f"{mbs:.0f} MB/s ({probe_mb} MB, fsync)",
                  "measured", detail={"mb_per_s": mbs}),
            emergency_checkpoint_row(node, mbs, checkpoint_bytes, nodes,
                                     profile.preemption.lead_time_s)]


def emergency_checkpoint_row(node: str, mbs: float, checkpoint_bytes: int | None, nodes: int,
                             lead: float) -> Check:
    """Whether each node's share of a checkpoint is written within the preemption lead time
    at ``mbs`` MB/s (every node writing at once); more than half of it warns."""
    if not checkpoint_bytes:
        return Check(node, "storage.emergency_ckpt", WARN, "checkpoint size unknown",
                     f"fits in {lead} s", "run preflight from a run folder (job.yaml or an "
                     "existing checkpoint gives the size)")
    share_mb = checkpoint_bytes / 1e6 / max(nodes, 1)
    secs = share_mb / mbs
    level = FAIL if secs > lead else WARN if secs > 0.5 * lead else PASS
    return Check(node, "storage.emergency_ckpt", level,
                 f"~{secs:.0f} s for {share_mb / 1e3:.1f} GB per node at {mbs:.0f} MB/s",
                 f"< {lead} s (preemption.lead_time_s)",
                 "" if level == PASS else "raise preemption.lead_time_s or use faster "
                 "storage; the estimate assumes every node writes at this rate at once",
                 detail={"seconds": secs, "checkpoint_bytes": checkpoint_bytes})


def estimate_checkpoint_bytes(run_dir: str | None) -> int | None:
    """Size of the newest checkpoint in the run, else an estimate from its job (Adam state)."""
    if not run_dir:
        return None
    from ..record.folder import RunFolder
    run = RunFolder(Path(run_dir))
    ck = run.checkpoint_dir()
    if ck.is_dir():
        sizes = []
        for d in ck.iterdir():
            if d.is_dir():
                sizes.append(sum(f.stat().st_size for f in d.rglob("*") if f.is_file()))
        if sizes and max(sizes) > 0:
            return max(sizes)
    if not run.job_file.is_file():
        return None
    try:
        job = run.resolved_job()
    except Exception:  # a broken job file is reported elsewhere
        return None
    return params_estimate(job.model) * (12 if job.train.precision == "fp32" else 14)


def params_estimate(m) -> int:
    h, L = m.hidden_size, m.num_layers
    kv = (m.num_query_groups or m.num_attention_heads) * (m.kv_channels or h // m.num_attention_heads)
    ffn = m.ffn_hidden_size or 4 * h
    per_layer = h * h + 2 * h * kv + h * h + (3 if m.activation == "swiglu" else 2) * h * ffn + 4 * h
    emb = m.vocab_size * h * (2 if m.untie_embeddings_and_output_weights else 1)
    pos = (m.max_position_embeddings or m.seq_length) * h \
        if m.position_embedding_type == "learned_absolute" else 0
    return L * per_layer + emb + pos
