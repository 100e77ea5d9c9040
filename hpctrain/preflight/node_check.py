"""``python -m hpctrain.preflight.node_check RUN``: preflight's node checks on the node it runs
on, for a replacement node the batch shell is about to train on (an in-job restart:
``hpctrain.scheduler.slurm.in_job_restart``). It runs in a one-task step on that node, outside
any container, and exits 1 when a check fails (each failing row printed), 0 otherwise.

Shared storage cannot be judged from one node alone: the batch shell passes its own host name
(``HPCTRAIN_BATCH_HOST``), and a node on that same host (the dev cluster) is told so, as the
gate does when every rank shares one host.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from .node import run_node_checks
from .results import FAIL


def check_this_node(run_dir: str) -> int:
    from ..record.folder import RunFolder
    run = RunFolder(Path(run_dir))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    profile = run.resolved_profile()
    one_host = os.environ.get("HPCTRAIN_BATCH_HOST") == socket.gethostname()
    result = run_node_checks(profile, node=node, nodes=profile.slurm.nodes, run_dir=str(run.path),
                             one_host=one_host)
    bad = [r for r in result["rows"] if r["status"] == FAIL]
    for r in bad:
        print(f"{node}: {r['check']} failed: {r['measured']} (expected {r['expected']}) "
              f"{r['fix']}".rstrip())
    if not bad:
        print(f"{node}: node check passed ({len(result['rows'])} checks)")
    return 1 if bad else 0


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpctrain.preflight.node_check RUN_DIR", file=sys.stderr)
        return 2
    from ..errors import HpcTrainError
    try:
        return check_this_node(args[0])
    except HpcTrainError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
