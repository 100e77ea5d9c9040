"""`data prepare` keeps memory bounded on any input: a file that is one huge line is streamed
in pieces (text), or refused with the limit in the error (JSONL, whose records are parsed
whole). Sizes here are small with the bounds lowered to match: the suite never writes GBs."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from hpctrain.data import prepare as prepare_mod, sources
from hpctrain.data.indexed import IndexedDataset
from hpctrain.errors import UsageError

LINE_CHARS = 4 << 20      # one line of 4 MiB, no newline anywhere
PIECE = 64 << 10          # read in pieces of 64 KiB


def test_a_single_huge_line_is_streamed_in_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_CHARS", PIECE)
    text = tmp_path / "one-line.txt"
    with open(text, "w") as f:
        for _ in range(LINE_CHARS // 4096):
            f.write("abcd" * 1024)
    tracemalloc.start()
    try:
        stats = prepare_mod.prepare([text], tmp_path / "out", "byte")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.documents == 1 and stats.tokens == LINE_CHARS + 1   # + the end-of-document token
    ds = IndexedDataset(str(tmp_path / "out"))
    assert ds.num_documents == 1
    # the whole line as one str is 4 MiB (and its tokens 32 MiB as int64): the peak stays far
    # below either, whatever the machine
    assert peak < LINE_CHARS, f"peak {peak:,} bytes for a {LINE_CHARS:,}-character line"


def test_a_jsonl_line_over_the_limit_is_refused_with_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_JSON_LINE_CHARS", 10_000)
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "x" * 20_000}) + "\n")
    with pytest.raises(UsageError, match=r"big.jsonl:2: a JSON line longer than 10,000 characters"):
        prepare_mod.prepare([f], tmp_path / "out", "byte")
    assert not (tmp_path / "out.bin").exists()


def test_a_tokenizer_worker_that_dies_mid_batch_is_an_error_not_a_wait_for_ever():
    """Workers killed while they hold batches (the OOM killer, a person): the pool starts
    new workers and never answers for a batch a dead one held. The wait sees the pool's
    workers replaced and stops with one line (also when a batch had not reached a worker
    yet: its worker is gone all the same); closing the pool then returns."""
    import os
    import signal
    import time

    from hpctrain.errors import HpcTrainError
    encoder = prepare_mod._Encoder(None, "byte", 2)
    try:
        held = [encoder.pool.apply_async(time.sleep, (120,)) for _ in range(2)]   # busy both
        for pid in encoder.started:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(HpcTrainError, match="a tokenizer worker process died"):
            encoder.result(held[0])
    finally:
        encoder.close()
    assert encoder.pool is None
