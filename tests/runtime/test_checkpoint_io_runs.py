"""The save and resume paths in real megatron-core runs (CPU/gloo): a background save whose
staged sizes are taken and filled while its writer runs still gives back, at the resume,
exactly the weights of the digest taken at the save; a checkpoint whose weights are not
those of its digest is set aside; the parallel, verify-as-you-read resume loads bit for bit
what one thread and megatron-core's own reader load. Shares the session's corpus and initial
weights (conftest.py)."""

from __future__ import annotations

import pytest

from hpctrain.record import checkpoint_store as store
from tests.launch import launch
from tests.runtime.conftest import _explain
from tests.runtime.helpers import losses, result
from tests.runtime.test_megatron_training import _copy_checkpoint

pytestmark = pytest.mark.megatron
FILL = {"HPCTRAIN_TEST_FILL_AFTER_SAVE": "1"}


@pytest.fixture(scope="module")
def filled(ws):
    """A run whose background save of step 6 had memory of its staged sizes taken and filled
    with 0xA5 while the writer ran (and training went on, changing every weight)."""
    run, res = ws.train("fill-after-save", "dp2_zero1", steps=8, env=FILL,
                        checkpoint={"interval_steps": 6, "async_save": True,
                                    "save_at_end": False})
    return run, res


def test_weights_loaded_equal_the_digest_taken_at_the_save(ws, filled):
    source, res = filled
    assert "while the writer runs; the staging memory refused them" in res.output(0)
    manifest = store.read_manifest(source.path / "checkpoints" / "step-00000006")
    assert manifest["checksum"] == "crc32c" and len(manifest["weights_digest"]) == 64
    assert manifest["format_version"] == 2
    r = _resumes_to_its_digest(ws, source, 6, "resume-after-fill", steps=8)
    assert r["resume_read"]["verified"] == r["resume_read"]["items"] > 0


def _resumes_to_its_digest(ws, source, step: int, name: str, steps: int,
                           env: dict | None = None) -> dict:
    """A new run resumed from ``source``'s checkpoint of ``step``: its weights equal the digest
    taken at the save and it trains on with ``source``'s losses. Returns its result.json."""
    run = ws.new_run(name, "dp2_zero1", steps=steps)
    _copy_checkpoint(source, step, run)
    out = launch(run.path, 2, env=env)
    assert out.codes == [0, 0], _explain(out)
    r = result(run, 1)
    assert r["start_step"] == step and r["resume_read"]["digest_checked"] is True
    assert "weights equal to the digest taken at the save" in out.output(0)
    after = range(step + 1, steps + 1)
    assert [losses(run)[s] for s in after] == [losses(source)[s] for s in after]
    return r


def test_a_checkpoint_whose_weights_differ_from_its_digest_is_set_aside(ws, filled):
    source, _ = filled
    run = ws.new_run("digest-mismatch", "dp2_zero1", steps=8)
    folder = _copy_checkpoint(source, 6, run)
    manifest = store.read_manifest(folder)
    store.write_json_atomic(folder / store.MANIFEST, {**manifest, "weights_digest": "0" * 64})
    out = launch(run.path, 2)
    # the only checkpoint was loaded over the model and failed: no training from that state
    assert out.codes != [0, 0]
    assert "are not the weights saved" in out.output(0)
    (aside,) = (run.path / "checkpoints" / store.QUARANTINE).iterdir()
    assert aside.name.startswith("step-00000006")


@pytest.mark.parametrize("threads", ["1", "0"])
def test_parallel_resume_equals_serial_resume_bit_for_bit(ws, threads):
    """8 reader threads (the default) against one, and against megatron-core's own reader:
    the same losses and the same final weights, bit for bit."""
    ref = ws.reference("dp2_zero1")          # a background save at step 6, finished at 12
    runs = {}
    for name, env in (("parallel", {}), (f"threads-{threads}",
                                         {"HPCTRAIN_TEST_READ_THREADS": threads})):
        key = f"resume-{name}"
        if name == "parallel" and key in ws.runs:
            runs[name] = ws.runs[key]
            continue
        run = ws.new_run(key, "dp2_zero1")
        _copy_checkpoint(ref, 6, run)
        out = launch(run.path, 2, env=env)
        assert out.codes == [0, 0], _explain(out)
        runs[name] = ws.runs[key] = run
    parallel, other = runs["parallel"], runs[f"threads-{threads}"]
    read = result(parallel, 1)["resume_read"]
    assert read["threads"] >= 2 and read["verified"] == read["items"] > 0
    if threads == "1":
        assert result(other, 1)["resume_read"]["threads"] == 1
    else:
        assert result(other, 1)["resume_read"]["items"] == 0        # megatron-core's reader
    assert losses(parallel) == losses(other)
    assert result(parallel, 1)["weights_digest"] == result(other, 1)["weights_digest"] == \
        result(ref, 1)["weights_digest"]


def test_a_save_that_comes_while_the_previous_writer_still_reads_waits_for_it(ws):
    """Background saves every 2 steps whose writers wait 3 s before writing: the save of step 4
    comes while step 2's writer still needs the staged bytes. It must wait for that writer
    instead of staging step 4's state over them, so step 2's checkpoint gives back, at a
    resume, exactly the weights of step 2's digest and the losses that followed it.

    Both runs page-lock their staging memory as a GPU rank does (a stand-in taking 0.5 s per
    segment): after the attempt's first step, never during the resume, and every save waits
    for it."""
    lock = {"HPCTRAIN_TEST_PAGE_LOCK_S": "0.5"}
    source, res = ws.train("slow-writer", "dp2_zero1", steps=6,
                           env={"HPCTRAIN_TEST_SLOW_WRITER_S": "3", **lock},
                           checkpoint={"interval_steps": 2, "async_save": True})
    saved = sorted(p.name for p in (source.path / "checkpoints").glob("step-*"))
    assert saved == [store.step_name(s) for s in (2, 4, 6)]
    locked = result(source, 1)["host_staging_locked"]
    assert locked["after_step"] == 1 and locked["bytes"] > 0
    r = _resumes_to_its_digest(ws, source, 2, "resume-after-slow-writer", steps=6, env=lock)
    assert r["host_staging_locked"]["after_step"] == 3            # the resume's first step
    assert r["resume_read"]["host_memory_wait_s"] == 0.0          # nothing was locking yet
