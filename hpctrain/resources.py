"""Where the packaged cluster profiles and sbatch templates are.

They live at the top of the repository (``cluster_profiles/``, ``sbatch_templates/``) as the
user asked. A source checkout or editable install finds them next to the package; a wheel
installs them under ``<prefix>/share/hpctrain/`` (setup.cfg ``data_files``).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _find(name: str) -> Path:
    candidates = [_REPO / name, Path(sys.prefix) / "share" / "hpctrain" / name,
                  Path(sysconfig.get_path("data")) / "share" / "hpctrain" / name]
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[0]


def profiles_dir() -> Path:
    return _find("cluster_profiles")


def templates_dir() -> Path:
    return _find("sbatch_templates")

