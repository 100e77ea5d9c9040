"""Storage faults during a checkpoint save, made for real on this machine (a file where the
folder should be, a folder removed under the writer, a file-size limit), and a peer lost inside
the save's collectives, said in one line: the path, the fault, the newest complete checkpoint,
the command that continues. Errors that are neither keep their own message. (A full, read-only
or unwritable file system: ``test_save_faults_on_real_storage.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from torch.distributed.checkpoint.api import CheckpointException

from hpctrain.runtime.checkpoint.save_faults import fault_of, save_fault
from hpctrain.view.follow import TRACEBACK_HEADER, Rank0Progress


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as e:   # noqa: BLE001 - the fault under test
        return e
    raise AssertionError("no fault")


def _line(e, root, newest="/ck/step-00000003") -> str:
    fault = save_fault(e, step=6, path=root, newest=newest, run_id="tiny-20260101-000000-ab12")
    assert fault is not None, e
    text = str(fault)
    assert "\n" not in text and text.startswith(f"checkpoint save of step 6 to {root} failed: ")
    assert text.endswith("then `hpctrain resume tiny-20260101-000000-ab12`")
    return text


def test_a_file_where_the_checkpoint_folder_should_be(tmp_path):
    (tmp_path / "checkpoints").write_text("not a folder")
    e = _raised(lambda: (tmp_path / "checkpoints" / ".partial-step-00000006").mkdir())
    text = _line(e, tmp_path / "checkpoints")
    assert "a part of the path is not a folder (ENOTDIR:" in text
    assert "the newest complete checkpoint, /ck/step-00000003, is intact" in text


def test_the_folder_removed_under_every_ranks_writer(tmp_path):
    """As megatron-core reports a failed write: torch's CheckpointException holding each
    rank's (exception, traceback); the fault is said once."""
    partial = tmp_path / ".partial-step-00000006"
    partial.mkdir()
    partial.rmdir()
    errors = {r: (_raised(lambda: open(partial / f"__{r}_0.distcp", "wb")), None) for r in (0, 1)}
    e = _raised(lambda: (_ for _ in ()).throw(CheckpointException("write", errors)))
    text = _line(e, tmp_path, newest=None)
    assert "vanished under the save" in text and "(ENOENT:" in text
    assert "no complete checkpoint was saved before it" in text
    assert text.count("ENOENT") == 1


PAST_THE_LIMIT = r"""
import os, resource, signal, sys
from hpctrain.runtime.checkpoint.save_faults import fault_of
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
try:
    with open(sys.argv[1], "wb") as f:
        f.write(bytes(1 << 17))
except BaseException as e:
    print(fault_of(e))
"""


def test_a_write_past_the_file_size_limit(tmp_path):
    """EFBIG; torch's zip writer loses the errno (``inline_container.cc: unexpected pos``): the
    runtime test of a real save under the same limit checks that path."""
    out = subprocess.run([sys.executable, "-c", PAST_THE_LIMIT, str(tmp_path / "shard")],
                         capture_output=True, text=True, timeout=120)
    assert "a file grew past the size this process may write" in out.stdout, out
    assert "(EFBIG)" in out.stdout, out


def test_the_zip_writers_words_are_understood():
    e = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert fault_of(e) == "a write failed part-way (the file system is full or failing?)"


def test_a_rank_told_only_that_the_write_failed_elsewhere(tmp_path):
    from hpctrain.record.culprit import peer_vanished
    e = _raised(lambda: (_ for _ in ()).throw(CheckpointException("write", {})))
    text = str(save_fault(e, step=6, path=tmp_path, newest=None, run_id="r"))
    assert text.startswith(f"checkpoint save of step 6 to {tmp_path} aborted: a write failed "
                           "on another rank")
    assert peer_vanished(text)          # the ledger names the rank that saw the fault


def test_other_failures_keep_their_own_message():
    assert fault_of(_raised(lambda: int("x"))) is None
    assert fault_of(_raised(lambda: os.kill(os.getpid(), 99999))) is None   # EINVAL


def test_following_a_run_shows_the_line_and_not_the_traceback():
    log = ["12:00:01 rank 0: step 5 loss 4.1",
           "12:00:02 rank 0: checkpoint: checkpoint save of step 6 to /ck failed: ...",
           f"12:00:02 rank 0: {TRACEBACK_HEADER}",
           "    Traceback (most recent call last):",
           '      File "x.py", line 1, in <module>',
           "    OSError: [Errno 27] File too large",
           "12:00:03 rank 0: attempt 1 failed: checkpoint save of step 6 ..."]
    keep = Rank0Progress()
    assert [line for line in log if keep(line)] == [log[0], log[1], log[6]]


def test_a_peer_that_stops_answering_in_a_background_saves_completion(tmp_path):
    """Real ranks, megatron-core's own completion agreement (``AsyncCallsQueue``), a real
    gloo timeout: rank 1 is stopped (alive, silent) when rank 0 finishes the save; what
    comes out of the door is the one line, naming the save and the lost peer
    (``async_peer_probe.py``)."""
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    out = tmp_path / "outcome.json"
    res = Launch(tmp_path, 2, module="tests.runtime.async_peer_probe",
                 args=[str(tmp_path / "ck"), str(out)], kill_on_failure=False).wait(600)
    assert res.codes[0] == 0 and res.codes[1] == -9, _explain(res)
    got = json.loads(out.read_text())
    line = got.get("fault")
    assert line, got           # not "escaped": gloo's error went through the door
    assert line.startswith(f"checkpoint save of step 6 to {tmp_path / 'ck'} aborted: another "
                           "rank died or stopped answering inside the save's collectives ("), line
    assert "\n" not in line and ".cc:" not in line, line     # gloo's source location dropped
    assert f"the newest complete checkpoint, {tmp_path}/ck/step-00000003, is intact" in line
    assert line.endswith("then `hpctrain resume tiny-20260101-000000-ab12`")
    assert "Traceback" in got["logged"]                  # for the rank log, under the line
    from hpctrain.record.culprit import peer_vanished
    assert peer_vanished(line)


# ---------------------------------------------------------------- the door, property-based
# what gloo, NCCL and torch say when a peer is lost (real messages, as torch 2.x and gloo print
# them), dropped into arbitrary text
PEER_WORDS = ["[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
              "[127.0.0.1]:41231",
              "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
              "10000ms for recv operation to complete",
              "Connection reset by peer", "Broken pipe",
              "NCCL communicator was aborted on rank 3.",
              "remote process exited or there was a network error"]


def _exceptions():
    from hypothesis import strategies as st
    from torch.distributed import DistBackendError
    text = st.text(max_size=60)
    peer_text = st.builds(lambda a, w, b: a + w + b, text, st.sampled_from(PEER_WORDS), text)
    leaf = st.one_of(
        st.builds(lambda code, name: OSError(code, os.strerror(code), name),
                  st.sampled_from(sorted(__import__("errno").errorcode)),
                  st.one_of(st.none(), text)),
        st.builds(RuntimeError, st.one_of(text, peer_text)),
        st.builds(DistBackendError, st.one_of(text, peer_text)),
        st.builds(ValueError, text))

    def wrap(inner):
        def chained(outer, cause, how):
            setattr(outer, how, cause)
            return outer
        return st.one_of(
            st.builds(chained, leaf, inner, st.sampled_from(["__cause__", "__context__"])),
            st.builds(lambda failures: CheckpointException("write", failures),
                      st.dictionaries(st.integers(0, 7), st.tuples(inner, st.none()),
                                      max_size=3)))
    return st.recursive(leaf, wrap, max_leaves=6)


def _all(exc, seen=None):
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return []
    seen.add(id(exc))
    inner = [v[0] for v in (getattr(exc, "failures", None) or {}).values()]
    return [exc] + [e for x in [exc.__cause__, exc.__context__, *inner] for e in _all(x, seen)]


def test_the_door_gives_one_line_or_passes_the_error_on():
    """Any chain of errors (OSErrors of every errno and file name, collective errors, peers'
    words in any text, torch's CheckpointException with any ranks' failures): the door says
    one line, of the right kind (a storage fault first, then a write failed elsewhere, then a
    lost peer), or passes the error on unchanged."""
    from hypothesis import given

    from hpctrain.runtime.checkpoint.save_faults import FAULTS, PEER_LOST, SaveFault

    @given(_exceptions())     # the suite's budget and seed (tests/conftest.py)
    def check(exc):
        fault = save_fault(exc, step=6, path="/ck", newest=None, run_id="r")
        chain = _all(exc)
        storage = any(isinstance(e, OSError) and e.errno in FAULTS for e in chain)
        elsewhere = any(isinstance(e, CheckpointException) and not e.failures for e in chain)
        peer = any(not isinstance(e, OSError) and PEER_LOST.search(str(e)) for e in chain) or \
            any(type(e).__name__ == "DistBackendError" and str(e).strip() for e in chain)
        hinted = any(not isinstance(e, OSError) and h in str(e)
                     for e in chain for h, _ in __import__(
                         "hpctrain.runtime.checkpoint.save_faults",
                         fromlist=["TEXT_HINTS"]).TEXT_HINTS)
        if not (storage or elsewhere or peer or hinted):
            assert fault is None
            return
        assert isinstance(fault, SaveFault)
        line = str(fault)
        assert "\n" not in line and line.isprintable() and len(line) < 1200, line
        assert line.startswith("checkpoint save of step 6 to /ck ")
        assert line.endswith(", then `hpctrain resume r`")
        if storage or hinted:
            assert line.startswith("checkpoint save of step 6 to /ck failed: "), line
        elif elsewhere:
            assert "a write failed on another rank" in line
        else:
            assert "another rank died or stopped answering" in line
    check()


def test_a_peers_error_is_said_without_its_source_location():
    from hpctrain.runtime.checkpoint.save_faults import peer_lost
    e = RuntimeError(PEER_WORDS[1] + "\nException raised from ...\nframe #0: ...")
    assert peer_lost(e) == "Timed out waiting 10000ms for recv operation to complete"


def test_a_collectives_long_error_is_cut_to_its_gist_and_said_on_one_line():
    """A peer's error as gloo words it can run to kilobytes on one line (every rank's
    address): the line keeps its first ``DETAIL_CHARS`` characters, the cut marked; a file
    name holding control characters is written with their escapes, so the line stays one
    line and says which file it was."""
    from hpctrain.runtime.checkpoint.save_faults import DETAIL_CHARS, first_line, one_line
    long = "Connection closed by peer " + "[10.0.0.7]:29500 " * 40
    cut = first_line("[../gloo/pair.cc:534] " + long + "\nframe #0 ...")
    assert len(cut) == DETAIL_CHARS and cut == long[:DETAIL_CHARS - 3] + "..."
    assert first_line(long[:DETAIL_CHARS]) == long[:DETAIL_CHARS]        # fits: kept whole
    assert one_line("/ck/step\n1\x1b[2J\tx") == "/ck/step\\n1\\x1b[2J\\tx"


def test_a_storage_fault_kept_as_an_exception_and_its_traceback_is_found():
    """torch keeps a rank's failure as an ``(exception, traceback)`` pair, sometimes inside
    another exception's arguments: the storage fault inside is found and named."""
    import errno as _errno
    inner = OSError(_errno.ENOSPC, "No space left on device", "/ck/.partial/__0_0.distcp")
    wrapped = RuntimeError("save failed", (inner, "Traceback (most recent call last): ..."))
    assert fault_of(wrapped) == ("no space left on the device (ENOSPC: "
                                 "/ck/.partial/__0_0.distcp)")
