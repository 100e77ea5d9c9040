"""A rank that only sleeps: what the launcher's own tests start, in place of training."""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    time.sleep(float((argv or ["3600"])[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
