"""Each bad file or value that once got a traceback, a hang or a runaway: now one line
``Error: ...`` naming the file or the field, exit code 2. Run through the real command line
(a subprocess each), so the exit code and stderr are what a user sees."""

from __future__ import annotations

import os
import threading

import pytest
import yaml

from tests.conftest import REPO, hpctrain
from tests.safety import corpus

TINY = REPO / "examples" / "tiny.yaml"


def job_with(tmp_path, path: tuple, value) -> str:
    data = corpus.load_yaml(TINY)
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(corpus.with_value(data, path, value)))
    return str(f)


def profile_with(tmp_path, path: tuple, value, name: str = "dev-slurm") -> str:
    data = corpus.load_yaml(REPO / "cluster_profiles" / f"{name}.yaml")
    f = tmp_path / "profile.yaml"
    f.write_text(yaml.safe_dump(corpus.with_value(data, path, value)))
    return str(f)


def refused(proc, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("Error: ") or "\nError: " in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr[-2000:])


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe\x00n\x00a\x00m\x00e\x00", ["not UTF-8 text", "byte 0xff at offset 0"]),
    (bytes(range(256)) * 8, ["not UTF-8 text"]),
    (b"name: " + b"[" * 20000 + b"]" * 20000, ["nested too deeply"]),
    (b"name: " + b"[" * 500000 + b"]" * 500000, ["nested too deeply"]),
    (b"a: " + b"9" * 5000, ["invalid YAML"]),
    (b"x" * (2 << 20), ["at most 1,048,576"]),
], ids=["utf16", "binary", "nested-20000", "nested-500000", "5000-digit-int", "2MiB"])
def test_unreadable_job_files(tmp_path, content, words):
    f = tmp_path / "job.yaml"
    f.write_bytes(content)
    refused(hpctrain("validate", str(f), timeout=120), *words)


def test_job_file_at_dev_zero_and_a_folder():
    refused(hpctrain("validate", "/dev/zero", timeout=60), "not a regular file",
            "a character device")
    refused(hpctrain("plan", "/dev/zero", "--profile", "/dev/zero", timeout=60),
            "not a regular file")


def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    proc = hpctrain("validate", str(fifo), timeout=60)   # a hang would time out here
    refused(proc, "not a regular file", "a FIFO")
    prof = tmp_path / "p.yaml"
    os.mkfifo(prof)
    refused(hpctrain("profiles", "validate", str(prof), timeout=60), "a FIFO")
    refused(hpctrain("render", str(TINY), "--profile", str(prof), timeout=60), "a FIFO")


def test_a_fifo_with_a_writer_is_refused_too(tmp_path):
    """With a writer attached, a blocking read would wait for the writer; this one does not."""
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer():
        fd = os.open(fifo, os.O_RDWR)  # keeps a writer open without blocking
        stop.wait(60)
        os.close(fd)
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        refused(hpctrain("validate", str(fifo), timeout=60), "a FIFO")
    finally:
        stop.set()
        t.join()


@pytest.mark.parametrize("path, value, words", [
    (("data", "path"), "a" * 10_000, ["data.path", "10,000 characters"]),
    (("data", "path"), "d/" + "a" * 300, ["data.path", "at most 255"]),
    (("train", "lr"), float("nan"), ["train.lr", "finite number"]),
    (("train", "lr"), "nan", ["train.lr", "finite number"]),
    (("train", "lr"), float("inf"), ["train.lr", "finite number"]),
    (("model", "num_layers"), 10**30, ["model.num_layers", "at most 512"]),
    (("name",), "tiny-gpt\n", ["name", "line feed"]),
    (("name",), "my-hetjob", ["name", "heterogeneous-job"]),
])
def test_bad_job_values(tmp_path, path, value, words):
    job = job_with(tmp_path, path, value)
    for cmd in (["validate", job], ["plan", job], ["render", job, "-p", "dev-slurm"],
                ["submit", job, "-p", "dev-slurm", "--dry-run", "--runs-dir", str(tmp_path / "r")]):
        refused(hpctrain(*cmd, timeout=120), *words)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("path, value, words", [
    (("node", "gpu_memory_gb"), "nan", ["node.gpu_memory_gb", "finite number"]),
    (("node", "peak_tflops"), -5, ["node.peak_tflops", "at least 0.001"]),
    (("interconnect", "inter_node_busbw_gbs"), -1, ["interconnect.inter_node_busbw_gbs"]),
    (("interconnect", "intra_node_busbw_gbs"), 0, ["interconnect.intra_node_busbw_gbs"]),
    (("slurm", "nodes"), 10**30, ["slurm.nodes", "at most 16384"]),
    (("slurm", "gpus_per_node"), 10**6, ["slurm.gpus_per_node", "at most 64"]),
    (("name",), "h100\ntouch /tmp/x #", ["name", "line feed"]),
    (("slurm", "partition"), "batch\n", ["slurm.partition", "line feed"]),
    (("slurm", "constraint"), "a|b", ["slurm.constraint"]),
    (("env",), {"FOO\n": "1"}, ["env", "line feed"]),
])
def test_bad_profile_values(tmp_path, path, value, words):
    prof = profile_with(tmp_path, path, value)
    for cmd in (["profiles", "validate", prof], ["validate", str(TINY), "-p", prof],
                ["plan", str(TINY), "-p", prof], ["render", str(TINY), "-p", prof]):
        refused(hpctrain(*cmd, timeout=120), *words)


def test_absurd_node_counts_on_the_command_line_are_refused_fast():
    refused(hpctrain("plan", str(TINY), "-p", "dev-slurm", "--nodes", str(10**30), timeout=60),
            "--nodes")
    refused(hpctrain("plan", str(TINY), "--gpus", str(10**12), timeout=60), "--gpus")
    refused(hpctrain("submit", str(TINY), "-p", "dev-slurm", "--chain", str(10**9), "--dry-run",
                     timeout=60), "--chain")
