"""The collective checks: real all-reduces across the allocation, with a deadline on each.

Why this shape: a stuck peer must never hang the checker. Every rank talks to rank 0 through
the rendezvous TCPStore, which stays usable when the process group does not: ranks mark their
arrival at each collective (``arr/``), bump a heartbeat after every op (``beat/``) and post
their timings (``res/``). Every collective is issued asynchronously and waited on with
``preflight.timeout_s``; a rank that times out reports which ranks never arrived. Rank 0
plans each round (the whole allocation, each node alone, then pairs of nodes to locate a slow
one), waits for results only while the ranks it waits for still beat, and gives up on the
silent ones by name. Imports torch (only this module does).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from ..fault_injection import preflight_delay
from ..identity import RankEnv

P = "pf/"


class Store:
    """JSON over the TCPStore, with deadlines everywhere."""

    def __init__(self, info: RankEnv, timeout_s: float):
        self.store = dist.TCPStore(info.master_addr, info.master_port, info.world_size,
                                   is_master=info.rank == 0,
                                   timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_for_workers=False)

    def put(self, key: str, value) -> None:
        self.store.set(P + key, json.dumps(value))

    def has(self, key: str) -> bool:
        return self.store.check([P + key])

    def get(self, key: str, timeout_s: float):
        """The value, or None when it does not appear in time (or the store is gone).

        Polls with ``check`` rather than ``wait``: short waits make c10d log a warning each."""
        deadline = time.monotonic() + timeout_s
        try:
            while not self.store.check([P + key]):
                if time.monotonic() >= deadline:
                    return None
                time.sleep(min(0.05 if timeout_s < 5 else 0.2, max(deadline - time.monotonic(), 0)))
            return json.loads(self.store.get(P + key))
        except Exception:  # rank 0 (the store's host) has gone
            return None

    def beat(self, rank: int) -> int:
        return self.store.add(f"{P}beat/{rank}", 1)

    def beats(self, rank: int) -> int:
        return self.store.add(f"{P}beat/{rank}", 0)


class Collective:
    """One rank's side of the collective checks; rank 0 also plans and collects."""

    def __init__(self, info: RankEnv, profile, sizes: list[int], progress=None):
        self.info = info
        self.profile = profile
        self.cuda = profile.node.device == "cuda"
        self.backend = "nccl" if self.cuda else "gloo"
        self.timeout = profile.preflight.timeout_s
        self.sizes = sizes
        self.warmup, self.iters = (5, 20) if self.cuda else (2, 5)
        self.delay = preflight_delay(info.rank, info.node)
        self.say = progress or (lambda msg: None)
        self.store: Store | None = None
        self.roster: dict[int, str] = {}
        self.hosts: dict[int, str] = {}
        self.broken = False
        self._groups: dict[tuple, object] = {}

    # ---- connection ------------------------------------------------------------------------
    def connect(self) -> list[int]:
        """Meet every rank in the store; returns the ranks that never showed up (rank 0)."""
        self.store = Store(self.info, self.timeout)
        self.store.put(f"hello/{self.info.rank}", {"node": self.info.node, "host": socket.gethostname(),
                                                    "pid": os.getpid()})
        if self.info.rank == 0:
            deadline = time.monotonic() + self.timeout
            seen = {}
            for r in range(self.info.world_size):
                v = self.store.get(f"hello/{r}", deadline - time.monotonic())
                if v is not None:
                    seen[r] = v
            roster = {"nodes": {r: v["node"] for r, v in seen.items()},
                      "hosts": {r: v["host"] for r, v in seen.items()},
                      "missing": [r for r in range(self.info.world_size) if r not in seen]}
            self.store.put("roster", roster)
        else:
            roster = self.store.get("roster", 2 * self.timeout + 30)
            if roster is None:
                raise RuntimeError("rank 0 never published the roster (is it alive?)")
        self.roster = {int(r): n for r, n in roster["nodes"].items()}
        self.hosts = {int(r): h for r, h in roster["hosts"].items()}
        return roster["missing"]

    def node_leaders(self) -> dict[str, int]:
        leaders: dict[str, int] = {}
        for r in sorted(self.roster):
            leaders.setdefault(self.roster[r], r)
        return leaders

    def init_process_group(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.info.local_rank)
        dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self.store.store),
                                rank=self.info.rank, world_size=self.info.world_size,
                                timeout=self._pg_timeout())

    def _pg_timeout(self) -> datetime.timedelta:
        """NCCL's watchdog aborts the process when its timeout fires; it must fire after ours,
        so rank 0 has written the report naming the silent ranks by then. Gloo's timeout is
        what frees its stuck worker threads, so it stays at ours."""
        seconds = 2 * self.timeout + 60 if self.cuda else self.timeout
        return datetime.timedelta(seconds=seconds)

    # ---- one round ---------------------------------------------------------------------------
    def _group(self, ranks: list[int]):
        if len(ranks) == self.info.world_size:
            return None  # the default group
        key = tuple(ranks)
        if key not in self._groups:
            self._groups[key] = dist.new_group(ranks, timeout=self._pg_timeout())
        return self._groups[key]

    def _sleep(self, seconds: float) -> None:
        """The injected delay; cut short once rank 0 has given up (so tests end promptly)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if seconds > 1 and self.store.has("abort"):
                return
            time.sleep(min(0.2, max(end - time.monotonic(), 0)))

    def measure(self, round_id: int, ranks: list[int], sizes: list[int], group) -> dict:
        """Seconds per all-reduce for each size (the median on GPUs, the fastest on the CPU),
        or which ranks never arrived."""
        device = torch.device("cuda", self.info.local_rank) if self.cuda else torch.device("cpu")
        times_per_size = []
        wait = datetime.timedelta(seconds=self.timeout)
        for si, size in enumerate(sizes):
            buf = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
            times = []
            try:
                for it in range(self.warmup + self.iters):
                    t0 = time.perf_counter()
                    if self.delay:  # inside the timed window: this rank is slow, not late
                        self._sleep(self.delay)
                    if it == 0:
                        self.store.put(f"arr/{round_id}/{si}/{self.info.rank}", 1)
                    work = dist.all_reduce(buf, group=group, async_op=True)
                    work.wait(wait)
                    if self.cuda:
                        torch.cuda.synchronize()
                    dt = time.perf_counter() - t0
                    self.store.beat(self.info.rank)
                    if it >= self.warmup:
                        times.append(dt)
            except Exception as e:  # timeout, or a peer closed the connection
                missing = [r for r in ranks if not self.store.has(f"arr/{round_id}/{si}/{r}")]
                self.broken = True
                return {"status": "timeout" if "timed out" in str(e).lower() else "error",
                        "size_index": si, "missing": missing, "error": str(e).splitlines()[0][:200]}
            # GPUs: the median, as nccl-tests reports a typical iteration. CPU (gloo): the
            # fastest, because on a shared host other processes only ever add time, and a
            # slow node or link (or an injected delay) slows every iteration alike
            times_per_size.append(statistics.median(times) if self.cuda else min(times))
        return {"status": "ok", "times": times_per_size}

    def take_part(self, round_id: int, plan: dict) -> None:
        groups = plan["groups"]
        mine = next((g for g in groups if self.info.rank in g), None)
        pg_handles = {tuple(g): self._group(g) for g in groups}  # every rank creates every group
        if mine is None:
            return
        result = self.measure(round_id, mine, plan["sizes"], pg_handles[tuple(mine)])
        self.store.put(f"res/{round_id}/{self.info.rank}", result)

    # ---- rank 0 ---------------------------------------------------------------------------------
    def collect(self, round_id: int, ranks: list[int], since: float) -> dict[int, dict]:
        """Results of ``ranks``; waits while they keep beating, gives up on a rank silent for
        longer than a collective may take (counted from ``since``, the round's start)."""
        results: dict[int, dict] = {}
        pending = set(ranks)
        last = {r: (self.store.beats(r), since) for r in pending}
        while pending:
            for r in sorted(pending):
                if self.store.has(f"res/{round_id}/{r}"):
                    results[r] = self.store.get(f"res/{round_id}/{r}", 1)
                    pending.discard(r)
                    continue
                beats = self.store.beats(r)
                if beats != last[r][0]:
                    last[r] = (beats, time.monotonic())
                elif time.monotonic() - last[r][1] > self.timeout + 2:
                    pending.discard(r)  # silent for longer than a collective may take
            if pending:
                time.sleep(0.1)
        return {r: v for r, v in results.items() if v is not None}

    def publish_plan(self, round_id: int, plan: dict) -> None:
        self.store.put(f"plan/{round_id}", plan)

    def await_plan(self, round_id: int) -> dict:
        budget = self.timeout * (len(self.sizes) * (self.warmup + self.iters) + 4) + 60
        plan = self.store.get(f"plan/{round_id}", budget)
        return plan if plan is not None else {"abort": True}

    def finish(self, ok: bool) -> None:
        if not ok:
            self.store.put("abort", 1)
        if self.info.rank == 0:
            deadline = time.monotonic() + 10
            for r in range(1, self.info.world_size):
                self.store.get(f"bye/{r}", max(deadline - time.monotonic(), 0.01))
        else:
            self.store.put(f"bye/{self.info.rank}", 1)
        if not self.broken and dist.is_initialized():
            dist.destroy_process_group()
