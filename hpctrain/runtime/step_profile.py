"""One training step under ``torch.profiler`` (``train.profile_step``; tools/bench_runtime's
reference loop too): is the host or the GPU the bound, and where the time goes.

Megatron-LM profiles steps with ``--profile`` (torch.profiler or nsys); this is the same
profiler around one step, summarised where a run's files are. A step whose host had issued
its forward and backward passes only about when the step ended waited on the host, not on the
GPU (on an H100 the ~1B check model with fused attention at micro-batch 2 does: 0.53 s of
kernels in a 0.82 s step); the summary then names the operators the host's time went to. Its
figures, per rank:

* ``issued_s``: from the step's start until its forward and backward passes were issued (the
  schedule does not wait for the device);
* ``step_s``: the whole step, the device synchronised at its end;
* ``gpu_kernels_s``: the time of every GPU kernel the step ran (none on the CPU);
* ``host_ops_s``, ``top_host_ops``: the operators (torch's, autograd's, megatron's autograd
  functions, compiled regions) with the most host time of their own.

Imports torch: call inside a rank."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

TOP = 25


class StepProfile:
    """Started before a step, stopped after it (``stop``): :attr:`report` is the summary."""

    def __init__(self, device: str) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda"
                                               else [])
        self.device = device
        self.report: dict | None = None
        self._prof = profile(activities=activities)
        if device == "cuda":
            torch.cuda.synchronize()
        self._prof.__enter__()

    def stop(self, issued_s: float | None, step_s: float | None) -> dict:
        import torch
        if self.device == "cuda":
            torch.cuda.synchronize()
        self._prof.__exit__(None, None, None)
        events = self._prof.key_averages()

        def device_us(e) -> float:
            return float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:TOP]
        self.report = {
            "issued_s": None if issued_s is None else round(issued_s, 4),
            "step_s": None if step_s is None else round(step_s, 4),
            "gpu_kernels_s": round(sum(device_us(e) for e in events) / 1e6, 4),
            "host_ops_s": round(sum(e.self_cpu_time_total for e in events) / 1e6, 4),
            "top_host_ops": [{"name": e.key, "calls": e.count,
                              "self_ms": round(e.self_cpu_time_total / 1e3, 3),
                              "device_ms": round(device_us(e) / 1e3, 3)} for e in top]}
        return self.report

    def write(self, folder: Path, step: int, rank: int, trace: bool) -> Path:
        """The summary as ``profile-step-N-rank-R.json`` in ``folder`` (through the output
        door); with ``trace``, beside it the whole trace, gzipped, for Perfetto or
        chrome://tracing (``...trace.json.gz``)."""
        from ..outputs import write_atomic
        path = Path(folder) / f"profile-step-{step}-rank-{rank}.json"
        write_atomic(path, json.dumps(self.report, indent=1) + "\n")
        if trace:
            # torch writes the trace to a path of its choosing: a private temporary folder,
            # then the compressed bytes through the output door like every other file
            with tempfile.TemporaryDirectory(prefix="hpctrain-trace-") as tmp:
                raw = Path(tmp) / "trace.json"
                self._prof.export_chrome_trace(str(raw))
                data = gzip.compress(raw.read_bytes())
            write_atomic(Path(folder) / f"profile-step-{step}-rank-{rank}.trace.json.gz", data,
                         durable=False)
        return path


def describe(report: dict) -> str:
    """One log line: the step, what the host issued, the kernels, the host's top operators."""
    top = ", ".join(f"{o['name']} {o['self_ms']} ms" for o in report["top_host_ops"][:5])
    issued = "" if report["issued_s"] is None else \
        f"forward and backward issued after {report['issued_s']} s, "
    return (f"{issued}step {report['step_s']} s, GPU kernels {report['gpu_kernels_s']} s; "
            f"most host time: {top}")
