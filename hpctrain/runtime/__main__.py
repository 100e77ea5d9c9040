"""``python -m hpctrain.runtime RUN_DIR``: run one rank of a training run.

The ``__main__`` guard matters: megatron-core's checkpoint writer starts a ``spawn``
multiprocessing manager, which re-imports the main module; without the guard that import
would start training again.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from ..errors import HpcTrainError
    from .entry import train_main

    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print("usage: python -m hpctrain.runtime [RUN_DIR]   (or set HPCTRAIN_RUN_DIR)",
              file=sys.stderr)
        return 2
    try:
        train_main(args[0] if args else None)
    except HpcTrainError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
