"""Software versions per node, whether they fit together, and whether the nodes agree.

Why: one node with another NCCL, CUDA or driver build can hang or corrupt collectives; a
megatron-core other than the validated one trains silently wrong; a torch older than
megatron-core's minimum, or a Transformer Engine outside the range megatron-core declares,
fails at import or at the first forward, after the allocation started. Versions come from
installed package metadata (``InstalledPackages``: no import of torch or TE; tests point it
at constructed ``.dist-info`` folders) and ``nvidia-smi``, unless the caller already has torch
loaded. ``python -m hpctrain.preflight.software`` runs the version checks alone, e.g. as the
last step of a container build (examples/container/Dockerfile).
"""

from __future__ import annotations

import platform
import re
import sys
from collections import Counter
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import __version__
from .results import ALL_NODES, FAIL, PASS, WARN, Check
from .tools import run_tool

# megatron-core 0.16.1's own Requires-Dist, used when its metadata cannot be read: torch for
# the package, transformer-engine for its GPU extra ("dev").
MEGATRON_TORCH_SPEC = ">=2.6.0"
MEGATRON_TE_SPEC = ">=2.9.0a0,<2.12.0"
TE_EXTRA = "dev"
TE_PACKAGES = ("transformer-engine", "transformer-engine-torch")
IMAGE_FIX = ("build the image of examples/container/Dockerfile (NGC PyTorch 25.11 with "
             "megatron-core 0.16.1 installed --no-deps)")

# what must match across nodes, and how badly a mismatch hurts
MUST_MATCH = {"torch": FAIL, "nccl": FAIL, "cuda": FAIL, "megatron-core": FAIL, "hpctrain": FAIL,
              "transformer-engine": FAIL, "python": WARN, "driver": WARN}


class InstalledPackages:
    """Installed package metadata, from ``sys.path`` or from the folders in ``path``.

    ``default()`` honours the test variable ``HPCTRAIN_TEST_SITE_PACKAGES`` (folders of
    ``.dist-info``, ``os.pathsep``-separated): the tests' stand-in for a GPU node's software, as fake
    ``nvidia-smi``/``ibstat`` on PATH stand in for its hardware."""

    def __init__(self, path: list[str] | None = None) -> None:
        self.path = path

    @classmethod
    def default(cls) -> "InstalledPackages":
        import os

        from ..fault_injection import value
        override = value("HPCTRAIN_TEST_SITE_PACKAGES")
        return cls(override.split(os.pathsep) if override else None)

    def _dist(self, name: str):
        kwargs = {"name": name} if self.path is None else {"name": name, "path": self.path}
        return next(iter(metadata.distributions(**kwargs)), None)

    def version(self, name: str) -> str | None:
        dist = self._dist(name)
        return dist.version if dist is not None else None

    def requires(self, name: str) -> list[str]:
        dist = self._dist(name)
        return list(dist.requires or []) if dist is not None else []


def _pkg(name: str, packages: InstalledPackages | None = None) -> str | None:
    return (packages or InstalledPackages.default()).version(name)


def _spec_text(spec: SpecifierSet | str) -> str:
    """Lower bound first: ``>=2.9.0a0,<2.12.0``."""
    parts = sorted(str(x) for x in SpecifierSet(str(spec)))
    return ",".join(sorted(parts, key=lambda p: not p.startswith(">")))


def megatron_requirements(packages: InstalledPackages | None = None) -> dict[str, str]:
    """``{"torch": spec, "transformer-engine": spec}`` as the installed megatron-core declares
    them (its package requirement on torch, its GPU extra's on TE), else 0.16.1's."""
    found = {"torch": MEGATRON_TORCH_SPEC, "transformer-engine": MEGATRON_TE_SPEC}
    for line in (packages or InstalledPackages.default()).requires("megatron-core"):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        name = req.name.lower().replace("_", "-")
        if name == "torch" and not req.marker:
            found["torch"] = _spec_text(req.specifier)
        elif name == "transformer-engine" and req.marker is not None \
                and req.marker.evaluate({"extra": TE_EXTRA}):
            found["transformer-engine"] = _spec_text(req.specifier)
    return found


def _satisfies(version: str, spec: str) -> bool | None:
    """Whether ``version`` meets ``spec``; pre-releases count (NGC images ship torch
    2.x.0a0+hash builds). None when the version cannot be parsed."""
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return None


def parse_smi_banner(text: str) -> dict:
    """Driver and CUDA versions from the ``nvidia-smi`` banner."""
    out = {}
    m = re.search(r"Driver Version:\s*([\d.]+)", text)
    if m:
        out["driver"] = m.group(1)
    m = re.search(r"CUDA Version:\s*([\d.]+)", text)
    if m:
        out["driver_cuda"] = m.group(1)
    return out


def local_versions(with_torch: bool = False, packages: InstalledPackages | None = None,
                   run_smi: bool = True) -> dict:
    packages = packages or InstalledPackages.default()
    v = {"python": platform.python_version(), "hpctrain": __version__,
         "torch": _pkg("torch", packages), "megatron-core": _pkg("megatron-core", packages),
         "transformer-engine": next((ver for ver in (_pkg(p, packages) for p in TE_PACKAGES)
                                     if ver), None)}
    nccl_pkg = next((p for p in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
                     if _pkg(p, packages)), None)
    if nccl_pkg:
        v["nccl"] = _pkg(nccl_pkg, packages)
    if packages.path is None and (with_torch or "torch" in sys.modules):
        import torch
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            try:
                v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # torch built without NCCL
                pass
    res = run_tool(["nvidia-smi"], timeout=20) if run_smi else None
    if res is not None and res.ok:
        v.update(parse_smi_banner(res.stdout))
    return {k: val for k, val in v.items() if val}


def check_versions_local(versions: dict, node: str, device: str = "cuda",
                         requirements: dict[str, str] | None = None) -> list[Check]:
    """megatron-core is the validated one; torch meets its minimum (and is a CUDA build on a
    CUDA profile); Transformer Engine is installed on a CUDA profile and inside the range
    megatron-core declares. ``requirements``: ``megatron_requirements()`` of the node."""
    from ..runtime.versions import MEGATRON_CORE_VERSION
    req = requirements or megatron_requirements()
    rows = []
    mc = versions.get("megatron-core")
    if mc == MEGATRON_CORE_VERSION:
        rows.append(Check(node, "software.megatron", PASS, mc, MEGATRON_CORE_VERSION))
    else:
        rows.append(Check(node, "software.megatron", FAIL, mc or "not installed",
                          MEGATRON_CORE_VERSION,
                          f"pip install --no-deps megatron-core=={MEGATRON_CORE_VERSION} (hpctrain "
                          f"relies on its internals; --no-deps keeps the installed torch), or "
                          f"{IMAGE_FIX}"))
    rows.append(_torch_row(versions.get("torch"), node, device, req["torch"]))
    te_row = _te_row(versions.get("transformer-engine"), node, device, req["transformer-engine"])
    if te_row is not None:
        rows.append(te_row)
    return rows


def _torch_row(torch: str | None, node: str, device: str, spec: str) -> Check:
    expected = f"torch{spec} (megatron-core's requirement)" + \
        (", a CUDA build" if device == "cuda" else "")
    if torch is None:
        return Check(node, "software.torch", FAIL, "not installed", expected,
                     f"install torch{spec}, or {IMAGE_FIX}")
    ok = _satisfies(torch, spec)
    if not ok:
        why = "unreadable version" if ok is None else "below megatron-core's minimum"
        return Check(node, "software.torch", FAIL, f"{torch} ({why})", expected,
                     f"megatron-core needs torch{spec}: {IMAGE_FIX}; installing megatron-core "
                     "with its dependencies into an older image would make pip replace the "
                     "image's torch (and break TE, built against it)")
    if device == "cuda" and "+cpu" in torch:
        return Check(node, "software.torch", FAIL, f"{torch} (a CPU-only build)", expected,
                     f"install a CUDA build of torch, or {IMAGE_FIX}")
    return Check(node, "software.torch", PASS, torch, expected)


def _te_row(te: str | None, node: str, device: str, spec: str) -> Check | None:
    expected = f"transformer-engine{spec} (megatron-core 0.16.1's GPU extra)"
    if te is None:
        if device != "cuda":
            return None   # the CPU rehearsal runs megatron's local layer spec
        return Check(node, "software.transformer_engine", FAIL, "not installed", expected,
                     f"{IMAGE_FIX}, or pip install --no-build-isolation "
                     f"'transformer-engine[pytorch]{spec}' against the installed torch")
    ok = _satisfies(te, spec)
    if not ok:
        why = "unreadable version" if ok is None else "outside megatron-core's range"
        return Check(node, "software.transformer_engine", FAIL if device == "cuda" else WARN,
                     f"{te} ({why})", expected,
                     f"{IMAGE_FIX} (its TE is in range), or install "
                     f"'transformer-engine[pytorch]{spec}' built against the installed torch")
    return Check(node, "software.transformer_engine", PASS, te, expected)


def compare_versions(per_node: dict[str, dict]) -> list[Check]:
    """One row per component; nodes that differ from the majority are named and blamed."""
    rows = []
    if len(per_node) < 2:
        return rows
    for name, level in MUST_MATCH.items():
        seen = {node: v.get(name) for node, v in per_node.items() if v.get(name)}
        if not seen:
            continue
        common, _ = Counter(seen.values()).most_common(1)[0]
        odd = sorted(n for n, v in seen.items() if v != common)
        if not odd:
            rows.append(Check(ALL_NODES, f"software.{name}", PASS, common, "same on every node"))
            continue
        rows.append(Check(ALL_NODES, f"software.{name}", level,
                          "; ".join(f"{n}: {seen[n]}" for n in odd), f"{common} (most nodes)",
                          f"install {name} {common} on {', '.join(odd)} (or rebuild the container)",
                          detail={"culprits": odd if level == FAIL else []}))
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m hpctrain.preflight.software [--device cuda|cpu]``: the version rows of this
    environment, exit 1 when one fails (a container build's last step)."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m hpctrain.preflight.software",
                                     description="Check torch / Transformer Engine / "
                                                 "megatron-core versions against each other.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)
    rows = check_versions_local(local_versions(run_smi=False), platform.node() or "here",
                                args.device)
    for r in rows:
        print(f"{r.status.upper():<5} {r.check:<28} {r.measured}   (expected {r.expected})")
        if r.status == FAIL and r.fix:
            print(f"      fix: {r.fix}")
    return 1 if any(r.status == FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
