"""Text/JSONL -> Megatron indexed dataset: ``hpctrain data prepare`` and auto-prepare on submit.

One sequence per document piece, the end-of-document id appended to each document's last
piece: the layout Megatron-LM's ``preprocess_data.py --append-eod`` writes. The token dtype
follows Megatron's rule (uint16 below 65500 ids, else int32), so Megatron reads our files
and we read its files. A sidecar ``PREFIX.meta.json`` records the tokenizer and counts
(Megatron ignores it). Nothing here imports torch: the CLI calls it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import HpcTrainError, UsageError
from ..file_door import show
from . import indexed, sources
from .files import meta_path, read_meta  # noqa: F401  (the sidecar, read through the door)
from .sources import check_inputs, read_pieces, source_problems, total_input_bytes
from .tokenizers import load_tokenizer
from .prepared import check_prepared, recorded_source, recorded_tokenizer
from .vocabulary import check_vocab

BATCH_TEXTS = 512  # pieces tokenized together (Hugging Face tokenizers are faster in batches)
BATCH_PIECES_OF_TEXT = 2   # ... and at most this many PIECE_CHARS of text at once


@dataclass
class PrepareStats:
    output: str
    tokenizer: str
    vocab_size: int
    eod: int
    dtype: str
    documents: int
    sequences: int
    tokens: int
    input_bytes: int
    seconds: float


def prepare(files: list[str | os.PathLike], output: str | os.PathLike, tokenizer: str = "byte",
            json_key: str = "text",
            progress: Callable[[int, int], None] | None = None,
            workers: int = 1) -> PrepareStats:
    """Tokenize ``files`` into ``output.bin``/``output.idx``; ``progress(done, total)`` in bytes.

    ``workers > 1`` tokenizes batches in that many processes; the output is the same bytes
    (batches are cut and written in input order whatever the count)."""
    from .. import limits
    limits.integer("workers", workers, optional=False)   # the CLI's range, for every caller
    paths = check_inputs(list(files))
    out = Path(output).expanduser()
    if out.is_dir():
        raise UsageError(f"--output {out} is a folder; give a prefix such as {out}/corpus "
                         f"(writes corpus.bin and corpus.idx)")
    from ..outputs import check_output_file
    for suffix in (".bin", ".idx", ".meta.json"):
        check_output_file(f"{out}{suffix}", "--output")
        _not_an_input(Path(f"{out}{suffix}"), paths)
    tok = load_tokenizer(tokenizer)
    started = time.time()
    total = total_input_bytes(paths)
    done_before = 0
    writer = indexed.IndexedDatasetWriter(out, indexed.token_dtype(tok.vocab_size))
    encoder = None
    try:
        encoder = _Encoder(tok, tokenizer, workers)
        for path in paths:
            report = None
            if progress:
                base = done_before
                report = lambda pos, base=base: progress(min(total, base + pos), total)  # noqa: E731
            for batch, ids in encoder.map(_batches(path, json_key, report)):
                _write(batch, ids, tok.eod, writer)
            done_before += path.stat().st_size
        if writer.num_tokens == 0:
            raise UsageError("the input holds no text: nothing to prepare")
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        if encoder is not None:
            encoder.close()
    stats = PrepareStats(output=str(out), tokenizer=tok.name, vocab_size=int(tok.vocab_size),
                         eod=int(tok.eod), dtype=writer.dtype.name,
                         documents=writer.num_documents, sequences=writer.num_sequences,
                         tokens=writer.num_tokens, input_bytes=total,
                         seconds=round(time.time() - started, 2))
    # the names a job's data.tokenizer and prepare_from are compared with (.prepared)
    record = {**asdict(stats), "tokenizer": recorded_tokenizer(tokenizer),
              "sources": [recorded_source(p) for p in paths]}
    from ..outputs import write_atomic
    write_atomic(meta_path(out), json.dumps(record, indent=1) + "\n")
    return stats


def _not_an_input(target: Path, inputs: list[Path]) -> None:
    """An output file that is one of the inputs would replace it once written: ``data prepare
    corpus.meta.json -o corpus`` (a ``.json`` input is read as JSONL) would leave the sidecar
    where the corpus was. Refused before anything is read."""
    if not os.path.lexists(target):      # a new file: nothing to replace
        return
    for source in inputs:
        try:
            same = os.path.samefile(target, source)
        except OSError:
            continue
        if same:
            raise UsageError(f"--output: {show(target)} is the input file {show(source)}, which "
                             f"writing it would replace; choose another output prefix")


def _batches(path: Path, json_key: str, report) -> Iterator[list]:
    """The pieces of ``path`` in batches, bounded by count (many short documents) and by size
    (a few long ones, or one huge line arriving in pieces): memory does not grow with the
    input. The cut depends on the input alone, never on the worker count."""
    batch: list = []
    chars = 0
    for piece in read_pieces(path, json_key, report):
        batch.append(piece)
        chars += len(piece.text)
        if len(batch) >= BATCH_TEXTS or chars >= BATCH_PIECES_OF_TEXT * sources.PIECE_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _write(batch: list, ids: list, eod: int, writer) -> None:
    for piece, arr in zip(batch, ids):
        if piece.last:
            arr = _append(arr, eod)
        if arr.size:
            writer.add_sequence(arr)
        if piece.last:
            writer.end_document()


_worker_tokenizer = None


def _init_worker(spec: str) -> None:
    global _worker_tokenizer
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the command stops them (see _Encoder)
    _worker_tokenizer = load_tokenizer(spec)


def _encode_in_worker(texts: list[str]) -> list:
    return _worker_tokenizer.encode_batch(texts)


class _Encoder:
    """Batches -> token ids, here or in ``workers`` processes, in input order. At most
    ``2 × workers`` batches are in flight, so memory stays bounded per worker (a pool's
    ``imap`` would read the whole input ahead).

    A worker that dies (killed, out of memory) takes its batch with it: the pool starts a new
    worker and never answers for that batch, so waiting on it would last for ever. The wait
    looks every ``POLL_S`` at whether the pool's workers are still the ones it started, and
    stops with an error when one was replaced. Closing the pool is bounded too
    (``CLOSE_WAIT_S``, then its workers are killed): nothing is written after an error, so
    nothing is lost by not waiting longer.

    A Ctrl-C at a terminal reaches every process of the command; the workers ignore it (from
    their start: they are spawned with SIGINT ignored, which a new Python keeps), and the
    command, interrupted, stops them: one line, not a traceback from each worker."""

    POLL_S = 1.0
    CLOSE_WAIT_S = 30.0

    def __init__(self, tok, spec: str, workers: int) -> None:
        self.tok, self.workers, self.pool = tok, workers, None
        if workers > 1:
            import multiprocessing
            # spawn: a forked child would inherit the tokenizer libraries' threads
            with _sigint_ignored():
                self.pool = multiprocessing.get_context("spawn").Pool(
                    workers, initializer=_init_worker, initargs=(spec,))
            self.started = self._worker_pids()

    def _worker_pids(self) -> set:
        return {p.pid for p in getattr(self.pool, "_pool", [])}

    def result(self, pending):
        """The token ids of one batch sent to the pool (an ``AsyncResult``)."""
        import multiprocessing
        while True:
            try:
                return pending.get(self.POLL_S)
            except multiprocessing.TimeoutError:
                if self._worker_pids() != self.started:
                    raise HpcTrainError(
                        "a tokenizer worker process died (killed, out of memory, or it could "
                        "not load the tokenizer); the output was not written; run again, with "
                        "--workers 1 to tokenize in this process and see any error it meets")

    def map(self, batches) -> Iterator[tuple[list, list]]:
        if self.pool is None:
            for batch in batches:
                yield batch, self.tok.encode_batch([p.text for p in batch])
            return
        from collections import deque
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, self.pool.apply_async(_encode_in_worker,
                                                         ([p.text for p in batch],))))
            if len(pending) >= 2 * self.workers:
                done, result = pending.popleft()
                yield done, self.result(result)
        while pending:
            done, result = pending.popleft()
            yield done, self.result(result)

    def close(self) -> None:
        if self.pool is None:
            return
        import threading
        pool, self.pool = self.pool, None
        closing = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
        closing.start()
        closing.join(self.CLOSE_WAIT_S)
        if closing.is_alive():
            for worker in getattr(pool, "_pool", []):
                worker.kill()


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while processes are started, so they start ignoring it (main thread
    only: elsewhere signals are not this code's to change)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _append(arr, value):
    import numpy as np
    out = np.empty(arr.size + 1, dtype=np.int64)
    out[:-1] = arr
    out[-1] = value
    return out


def ensure_prepared(job) -> bool:
    """Prepare every corpus the job names (``data.path`` or the blends' paths) from its
    ``prepare_from`` if it does not exist yet.

    Returns True when it prepared data, False when all of it was already there. Raises a
    UsageError naming the field when a corpus is missing and cannot be prepared (no
    ``prepare_from``, or a file of it missing: ``data.prepare_from[0]: input file ...``),
    when one that
    is there was prepared with another tokenizer or from other files (:mod:`.prepared`), or
    when the tokenizer's vocabulary does not fit ``model.vocab_size``.
    """
    from .splits import all_prefixes
    data = job.data
    prepared = False
    for field, prefix, sources in all_prefixes(data):
        if indexed.exists(prefix):
            check_prepared(job, field, prefix, sources)
            continue
        if not sources:
            hint = "data.prepare_from" if field == "data.path" else \
                field.replace(".path", ".prepare_from")
            raise UsageError(f"{field}: {prefix}.bin/.idx do not exist; prepare them with "
                             f"`hpctrain data prepare FILES --output {prefix}` or set {hint}")
        problems = source_problems(field, prefix, sources)
        if problems:
            raise UsageError(problems[0])
        tok = load_tokenizer(data.tokenizer)
        check_vocab(job, tok.vocab_size)
        prepare(sources, prefix, data.tokenizer, data.json_key)
        prepared = True
    return prepared


