"""The megatron-core version hpctrain was validated against, and the check that enforces it.

hpctrain depends on megatron-core internals (distributed-optimizer checkpoint metadata, the
schedules' in-place loss division, the CPU shim's coverage). A different version may train
silently wrong, so the runtime refuses it with a message naming the pinned version.
"""

from __future__ import annotations

from importlib import metadata

from ..errors import HpcTrainError

MEGATRON_CORE_VERSION = "0.16.1"


class UnsupportedVersionError(HpcTrainError):
    pass


def installed_megatron_core() -> str | None:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def check_megatron_core(found: str | None = None) -> str:
    """Return the installed version or raise with the fix. Reads package metadata only (no import)."""
    found = installed_megatron_core() if found is None else found
    if found is None:
        raise UnsupportedVersionError(
            f"megatron-core is not installed; install the validated version: "
            f"pip install megatron-core=={MEGATRON_CORE_VERSION}")
    if found != MEGATRON_CORE_VERSION:
        raise UnsupportedVersionError(
            f"megatron-core {found} is installed but hpctrain is validated against "
            f"{MEGATRON_CORE_VERSION} only (it relies on its internals); "
            f"pip install megatron-core=={MEGATRON_CORE_VERSION}")
    return found


def import_megatron_core() -> None:
    """Import megatron-core once, before any runtime module does, without Weights & Biases.

    ``megatron.core``'s package import pulls in its inference engine, which imports ``wandb``
    whenever it is installed (to log inference metrics a training run never produces): about
    0.7 s of CPU and several hundred files per rank, paid by every rank of every attempt on a
    machine where the W&B tracker is installed. It is hidden while megatron-core imports (its
    inference code then sees W&B as absent), and visible again afterwards, so the W&B tracker
    (rank 0, when the job asks for it) imports the real library. When W&B is already imported
    nothing is hidden."""
    import sys
    if "megatron.core" in sys.modules:
        return
    hide = "wandb" not in sys.modules
    if hide:
        sys.modules["wandb"] = None      # `import wandb` raises ImportError meanwhile
    try:
        import megatron.core  # noqa: F401
    finally:
        if hide and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]
