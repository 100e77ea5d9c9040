"""``python -m hpctrain.preflight.gate RUN_DIR [--attempt N]``: preflight as a job step.

The training batch script runs this under ``srun`` (one task per GPU) before training. Rank 0
writes ``RUN/preflight/attempt-N.json`` (``passed``, ``bad_nodes``, ``summary``, ``report``,
``checks``), prints the table, and exits 0 when preflight passed, 4
(``exit_codes.PREFLIGHT_FAILED``) when it failed; other ranks exit 0 so the step's exit code
is rank 0's verdict. 2 is bad usage, 1 an internal error (no node is to blame then).
"""

from __future__ import annotations

import argparse
import sys

from .. import exit_codes
from ..errors import HpcTrainError


def attempt_record(report: dict) -> dict:
    return {"passed": report["passed"], "bad_nodes": report["bad_nodes"],
            "summary": report["summary"], "report": report.get("path"),
            "attempt": report.get("attempt"), "duration_s": report.get("duration_s"),
            "checks": [c for c in report["checks"] if c["status"] in ("fail", "warn")]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain.preflight.gate",
                                 description="Run preflight on every rank of this job step.")
    ap.add_argument("run_dir", help="the run folder (holds profile.yaml)")
    ap.add_argument("--attempt", type=int, default=None, help="attempt number (names the JSON)")
    args = ap.parse_args(argv)
    from pathlib import Path

    from .job import preflight_main
    from .report import format_table, write_json
    if not (Path(args.run_dir) / "profile.yaml").is_file():
        print(f"Error: {args.run_dir} is not a run folder (no profile.yaml)", file=sys.stderr)
        return exit_codes.USAGE
    try:
        report = preflight_main(args.run_dir, attempt=args.attempt)
    except HpcTrainError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    if "checks" not in report:  # not rank 0
        return exit_codes.FINISHED
    if args.attempt is not None:
        write_json(Path(args.run_dir) / "preflight" / f"attempt-{args.attempt}.json",
                   attempt_record(report))
    print(format_table(report), flush=True)
    return exit_codes.FINISHED if report["passed"] else exit_codes.PREFLIGHT_FAILED


if __name__ == "__main__":
    sys.exit(main())
