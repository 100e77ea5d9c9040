"""``preflight_main``: what every rank of a preflight job (or the gate step) runs.

Order of work: all ranks meet in the rendezvous store (a rank that never connects is named);
the first rank of each node runs the node checks while the others wait; then the process
group forms and rank 0 leads the collective rounds (:mod:`.rounds`). Rank 0 gathers the
node rows, the NCCL transport each node saw and the software versions, writes
``RUN/preflight/report-<attempt|timestamp>.json`` and returns the report. Other ranks return
a small dict. Nothing here raises for a bad node: it becomes a row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..identity import LaunchError, RankEnv, rank_env
from ..record.files import now_iso
from ..record.folder import RunFolder
from . import nccl_log, software
from .bandwidth import default_sizes_mb
from .node import run_node_checks
from .report import build_report, report_name, write_json
from .results import ALL_NODES, FAIL, SKIP, Check

NODE_CHECK_BUDGET_S = 600


class Progress:
    """Rank 0's progress lines (``RUN/preflight/progress.jsonl``), read by the CLI."""

    def __init__(self, path: Path | None):
        self.path = path

    def __call__(self, msg: str) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"time": time.time(), "msg": msg}) + "\n")


def _nccl_log_path(pdir: Path, node: str, rank: int) -> Path:
    return pdir / "nccl" / f"{node}.rank{rank}.log"


def _prepare_nccl_logging(pdir: Path, node: str, rank: int) -> Path | None:
    """NCCL must log at INFO for the transport check; our own file per rank unless the user
    already chose one."""
    if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        os.environ["NCCL_DEBUG"] = "INFO"
    if os.environ.get("NCCL_DEBUG_FILE"):
        return None
    path = _nccl_log_path(pdir, node, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["NCCL_DEBUG_FILE"] = str(path)
    return path


def rank_info(env=None) -> RankEnv:
    """This rank (``hpctrain.identity``), which needs the rendezvous address: the collective
    checks meet there even on one rank."""
    info = rank_env(env)
    env = os.environ if env is None else env
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        raise LaunchError("MASTER_ADDR and MASTER_PORT must be set (the first node's address and "
                          "a free port) for the collective checks")
    return info


def preflight_main(run_dir: str, attempt: int | None = None) -> dict:
    t0 = time.monotonic()
    run = RunFolder(Path(run_dir))
    profile = run.resolved_profile()
    info = rank_info()
    pdir = run.path / "preflight"
    pdir.mkdir(parents=True, exist_ok=True)
    say = Progress(pdir / "progress.jsonl" if info.rank == 0 else None)
    mbs = profile.preflight.sizes_mb or default_sizes_mb(profile.node.device)
    sizes = [max(int(mb * 2**20) // 4 * 4, 4) for mb in mbs]
    nccl_file = _prepare_nccl_logging(pdir, info.node, info.rank) \
        if profile.node.device == "cuda" else None

    from .collective import Collective  # torch, only now
    from .rounds import CollectiveRounds

    col = Collective(info, profile, sizes, progress=say)
    rows: list[Check] = []
    facts = {"profile": profile.name, "run_dir": str(run.path), "attempt": attempt,
             "started": now_iso(), "world_size": info.world_size, "backend": col.backend,
             "sizes": sizes}
    say(f"connecting {info.world_size} ranks")
    try:
        missing = col.connect()
    except Exception as e:
        if info.rank != 0:
            return {"rank": info.rank, "node": info.node, "error": str(e)}
        missing = list(range(1, info.world_size))
        rows.append(Check(ALL_NODES, "collective.connect", FAIL, str(e), "every rank connects",
                          "check MASTER_ADDR/MASTER_PORT and that the port is free"))
    nodes = sorted(set(col.roster.values()))
    if missing:
        if info.rank == 0 and not rows:
            rows.append(Check(ALL_NODES, "collective.connect", FAIL,
                              f"ranks {', '.join(map(str, missing))} never connected within "
                              f"{profile.preflight.timeout_s} s", "every rank connects",
                              "those tasks did not start or cannot reach rank 0's node: check their "
                              "logs and MASTER_ADDR"))
        return _finish(col, run, info, rows, facts, nodes, attempt, t0, ok=False, rounds=None)

    # ---- node checks: first rank of each node ------------------------------------------------
    leader = col.node_leaders()[info.node] == info.rank
    if leader:
        say(f"node checks on {info.node}")
        try:
            result = run_node_checks(profile, node=info.node, nodes=len(nodes), run_dir=str(run.path),
                                     one_host=len(set(col.hosts.values())) == 1)
        except Exception as e:  # a bug in one check must not hide the others' results
            result = {"node": info.node, "versions": {}, "rows": [Check(
                info.node, "node_checks", FAIL, f"{type(e).__name__}: {e}", "checks run",
                "report this as a hpctrain bug; the collective checks still ran").to_dict()]}
        col.store.put(f"node/{info.node}", result)
    else:
        col.store.get(f"node/{info.node}", NODE_CHECK_BUDGET_S)

    # ---- collective rounds ---------------------------------------------------------------------
    say("forming the process group")
    rounds = CollectiveRounds(profile, col.roster, sizes) if info.rank == 0 else None
    try:
        col.init_process_group()
    except Exception as e:
        col.broken = True
        if info.rank == 0:
            rows.append(Check(ALL_NODES, "collective.init", FAIL, str(e).splitlines()[0][:200],
                              f"{col.backend} process group forms",
                              "a rank could not join: check the network between nodes "
                              "(NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) and the ranks' logs"))
        return _finish(col, run, info, rows, facts, nodes, attempt, t0, ok=False, rounds=rounds)

    round_id, plan = 0, rounds.first() if rounds else None
    while True:
        if info.rank == 0:
            col.publish_plan(round_id, plan or {"done": True})
            if plan is None:
                break
            say(f"round {round_id + 1}: {plan['label']} all-reduce over "
                f"{len(plan['groups'])} group(s)")
        else:
            plan = col.await_plan(round_id)
            if plan.get("done") or plan.get("abort"):
                break
        started = time.monotonic()
        col.take_part(round_id, plan)
        if round_id == 0 and leader and nccl_file is not None:
            col.store.put(f"transport/{info.node}",
                          nccl_log.parse_nccl_transport(_read(nccl_file)))
        if info.rank == 0:
            results = col.collect(round_id, sorted(r for g in plan["groups"] for r in g), started)
            plan = rounds.after(plan, results)
        round_id += 1
    return _finish(col, run, info, rows, facts, nodes, attempt, t0,
                   ok=not (rounds and rounds.failed) and not col.broken, rounds=rounds)


def _read(path: Path) -> str:
    from .. import limits
    from ..record import reader
    try:
        return reader.read_text(path, limits.RUN_LOG_BYTES, strict=False) or ""
    except reader.DamagedFile:
        return ""


def _finish(col, run: RunFolder, info, rows: list[Check], facts: dict, nodes: list[str],
            attempt: int | None, t0: float, *, ok: bool, rounds) -> dict:
    if info.rank != 0:
        if col.store is not None:
            col.finish(ok)
        return {"rank": info.rank, "node": info.node}
    node_results = {}
    if col.store is not None:
        for n in nodes:
            v = col.store.get(f"node/{n}", 5)
            node_results[n] = v
        if rounds is not None:
            rows += rounds.rows
        rows += _transport_rows(col, nodes)
    for n, v in node_results.items():
        if v is None:
            rows.append(Check(n, "node_checks", FAIL, "no node check results", "results",
                              "the node's first rank did not report: check its log"))
        else:
            rows += [Check.from_dict(d) for d in v["rows"]]
    rows += software.compare_versions({n: v["versions"] for n, v in node_results.items() if v})
    report = build_report(rows, **facts, nodes=nodes, finished=now_iso(),
                          duration_s=round(time.monotonic() - t0, 2),
                          sweep=rounds.sweep if rounds else [])
    path = run.path / "preflight" / report_name(attempt)
    report["path"] = str(path)
    write_json(path, report)
    if col.store is not None:
        col.finish(ok and report["passed"])
    return report


def _transport_rows(col, nodes: list[str]) -> list[Check]:
    from .nccl_log import check_transport
    if not col.cuda:
        return [Check(ALL_NODES, "nccl.transport", SKIP, "gloo (cpu profile)")]
    out = []
    for n in nodes:
        summary = col.store.get(f"transport/{n}", 5)
        out.append(check_transport(summary, col.profile, n, len(nodes)))
    return out
