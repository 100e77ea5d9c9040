"""The fake-tools fixture: `nvidia-smi`/`ibstat` on PATH that print real captured output, and
a GPU node's installed package metadata (HPCTRAIN_TEST_SITE_PACKAGES)."""

from __future__ import annotations

import os
import shlex

import pytest

from tests.preflight.helpers import FIXTURES, write_executable


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """``install(query=..., topo=..., ibstat=...)`` puts the fakes on PATH (None: tool absent)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def install(*, query: str | None = None, topo: str | None = None, ibstat: str | None = None,
                reject_field: str | None = None):
        for f in bindir.iterdir():
            f.unlink()
        if query or topo:
            lines = ["#!/bin/sh"]
            if reject_field:  # nvidia-smi's own words for a field an older driver lacks
                lines.append(f'case "$*" in *{reject_field}*) echo \'Field "{reject_field}" is not '
                             f'a valid field to query.\'; exit 2;; esac')
            lines.append('case "$1" in')
            if topo:
                lines.append(f"  topo) cat {shlex.quote(str(FIXTURES / topo))};;")
            if query:
                lines.append(f"  --query-gpu=*) cat {shlex.quote(str(FIXTURES / query))};;")
            lines += ["  *) echo 'NVIDIA-SMI has failed' >&2; exit 9;;", "esac"]
            write_executable(bindir / "nvidia-smi", "\n".join(lines))
        if ibstat:
            write_executable(bindir / "ibstat", f"#!/bin/sh\ncat {shlex.quote(str(FIXTURES / ibstat))}")
        return bindir

    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("HPCTRAIN_TEST_SYSFS_IB", str(tmp_path / "no-sysfs"))
    # the software of a GPU node (a CUDA torch, Transformer Engine): metadata, as for the tools
    monkeypatch.setenv("HPCTRAIN_TEST_SITE_PACKAGES", str(FIXTURES / "site_packages" / "gpu-node"))
    return install
