"""What a checkpoint's data position means: the data-stream fingerprint, and the one comparison
that refuses a resume under settings that would give that position another meaning.

A checkpoint keeps the training stream's position as one integer (``consumed_samples``): the
blend (:mod:`.blend`) and each corpus's order (:mod:`.order`) turn it into samples. The same
integer names the same samples only under the same corpora (in the same order, each with the
same documents and tokens), the same normalised weights, the same ``data.split``, ``train.seed``,
``model.seq_length`` and sample order; change one and a resumed run silently skips samples of one
corpus and re-reads those of another, or reads validation documents as training ones. The
validation and test sets (``valid_blend``/``test_blend``) are recorded too: losses measured on
another set do not continue the run's curve.

What does not change the position's meaning stays free: the batch sizes, the parallel layout,
``train.steps``, the learning rate, and a corpus moved to another directory. A corpus is known by
its shape (documents and tokens: the ``.idx`` header and the ``.bin``'s size, neither read
whole), not by its path. Pure Python (no numpy): ``hpctrain resume`` compares before submitting,
the runtime compares again when it loads the checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import file_door
from ..config.split import parse_split
from ..errors import UsageError
from ..file_door import show
from .index_header import FIXED, parse_header
from .splits import corpora

FORMAT = 1
CLOSE = 1e-9          # weights and split shares this close are equal (float noise of a scaling)
EVALUATION_FIELDS = ("data.valid_blend", "data.test_blend")
ACCEPT_OPTION = "--accept-data-change"
ACCEPTED_EVENT = "data_change_accepted"


def change_accepted(events, checkpoint: str) -> bool:
    """Whether the run's ``events`` hold an acceptance of changed data settings for
    ``checkpoint`` (``hpctrain resume RUN --accept-data-change`` records one, naming the
    checkpoint it resumes from: a later checkpoint is compared again, under the new settings
    it records)."""
    return any(isinstance(e, dict) and e.get("event") == ACCEPTED_EVENT
               and e.get("checkpoint") == checkpoint for e in events)


def fix(run: str) -> str:
    """What to do about a refused resume of ``run``."""
    return (f"resume with the saved data settings, or accept the change with `hpctrain resume "
            f"{run} {ACCEPT_OPTION}`")


def corpus_shape(prefix: str | os.PathLike) -> dict | None:
    """``{"documents": D, "tokens": T}`` of an indexed dataset, from its ``.idx`` header and its
    ``.bin``'s size; None when this machine cannot read it (a login node without the data: the
    runtime, which reads it, compares it)."""
    ip, bp = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    try:
        with file_door.open_regular(ip, follow_links=True) as fd:    # a FIFO never blocks
            if fd is None:
                return None
            raw = file_door.read_fd(fd, FIXED - 1)
        size = bp.stat().st_size
        head = parse_header(raw, ip)
    except (OSError, file_door.Refused, UsageError):
        return None
    return {"documents": head.documents, "tokens": size // head.itemsize}


def _corpora(entries) -> list[dict]:
    """Each corpus's shape and normalised weight, in the order given (the order seeds each
    corpus's stream, so it is part of the meaning)."""
    return [{**(corpus_shape(c.path) or {"documents": None, "tokens": None}),
             "weight": round(c.weight, 12)} for c in entries]


def data_fingerprint(job, order: str | None) -> dict:
    """The JSON-able fingerprint of ``job``'s data streams; ``order``: the sample order the
    training stream is read in (:data:`.order.KINDS`, a checkpoint says which)."""
    data = job.data
    split = None if data.split is None else [round(s, 12) for s in parse_split(data.split)]
    separate = {}
    for name, part in (("valid_blend", "valid"), ("test_blend", "test")):
        separate[name] = _corpora(corpora(data, part)) if getattr(data, name) else None
    return {"format": FORMAT, "corpora_field": "data.blend" if data.blend else "data.path",
            "corpora": _corpora(corpora(data, "train")), "split": split,
            "seed": job.train.seed, "seq_length": job.model.seq_length, "order": order,
            **separate}


# ---- the comparison ------------------------------------------------------------------------


def _number(v) -> bool:
    return type(v) in (int, float) and v == v and abs(v) != float("inf")


def _count(v) -> bool:
    return v is None or (type(v) is int and v >= 0)


def _corpora_ok(entries) -> bool:
    return isinstance(entries, list) and all(
        isinstance(c, dict) and "documents" in c and "tokens" in c and _count(c["documents"])
        and _count(c["tokens"]) and _number(c.get("weight")) for c in entries)


def well_formed(record) -> bool:
    """Whether ``record`` is a fingerprint as :func:`data_fingerprint` writes them: a
    checkpoint's record is compared only then (one edited by hand is refused as damaged).
    Keys a later format adds are not required."""
    if not isinstance(record, dict) or not _corpora_ok(record.get("corpora")):
        return False
    split = record.get("split")
    return ((split is None or (isinstance(split, list) and all(_number(x) for x in split)))
            and type(record.get("seed", 0)) is int
            and type(record.get("seq_length", 1)) is int
            and isinstance(record.get("order") or "", str)
            and all(record.get(k) is None or _corpora_ok(record.get(k))
                    for k in ("valid_blend", "test_blend")))


def _same_shape(a: dict, b: dict) -> bool:
    """Equal shapes; a count unknown on either side (the data not readable here) counts as
    equal (the runtime, which reads the data, compares it)."""
    return all(a[k] is None or b[k] is None or a[k] == b[k] for k in ("documents", "tokens"))


def _corpora_change(saved: list, now: list, what: str) -> str | None:
    """How the corpora of one stream differ (None: they do not)."""
    if len(saved) != len(now):
        return f"{what}{len(saved)} -> {len(now)} corpora"
    for i, (a, b) in enumerate(zip(saved, now)):
        if not _same_shape(a, b):
            return (f"{what}corpus {i}: {a['documents']} documents, {a['tokens']} tokens -> "
                    f"{b['documents']} documents, {b['tokens']} tokens")
    ws, wn = [c["weight"] for c in saved], [c["weight"] for c in now]
    if any(abs(a - b) > CLOSE for a, b in zip(ws, wn)):
        return f"{what}weights {'/'.join(f'{w:.3g}' for w in ws)} -> " \
               f"{'/'.join(f'{w:.3g}' for w in wn)}"
    return None


def _shown_split(shares) -> str:
    return "none" if shares is None else ",".join(f"{s:.3g}" for s in shares)


def _same_split(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(abs(x - y) <= CLOSE for x, y in zip(a, b))


def data_changes(saved: dict, now: dict) -> list[tuple[str, str]]:
    """``(field, how it changed)`` for every setting of ``now`` that gives a position of
    ``saved`` (both :func:`well_formed`) another meaning; empty when none does. Keys missing
    on either side (a later fingerprint's additions) are not compared."""
    out = []
    corpora_change = _corpora_change(saved["corpora"], now["corpora"], "")
    if corpora_change:
        out.append((now.get("corpora_field") or "data.blend", corpora_change))
    if "split" in saved and "split" in now and not _same_split(saved["split"], now["split"]):
        out.append(("data.split",
                    f"split {_shown_split(saved['split'])} -> {_shown_split(now['split'])}"))
    for key, field in (("seed", "train.seed"), ("seq_length", "model.seq_length"),
                       ("order", "sample order")):
        if key in saved and key in now and saved[key] != now[key]:
            out.append((field, f"{key.replace('_', ' ')} {show(str(saved[key]), 40)} -> "
                               f"{show(str(now[key]), 40)}"))
    for key in ("valid_blend", "test_blend"):
        if key not in saved or key not in now:
            continue
        kind = key.split("_")[0]
        if (saved[key] is None) != (now[key] is None):
            shown = {True: "from the split", False: "its own corpora"}
            out.append((f"data.{key}", f"{kind} set {shown[saved[key] is None]} -> "
                                       f"{shown[now[key] is None]}"))
            continue
        change = None if saved[key] is None else \
            _corpora_change(saved[key], now[key], f"{kind} ")
        if change:
            out.append((f"data.{key}", change))
    return out


def resume_problem(saved, job, checkpoint: str, position, run: str) -> str | None:
    """The one line refusing to resume ``job`` from ``checkpoint`` (its fingerprint ``saved``,
    its position ``position``) of ``run``, naming each changed field of the training stream and
    the fix; None when the position keeps its meaning. A checkpoint saved before fingerprints
    were recorded has none (``saved`` is None): there is nothing to compare, it is accepted as
    before. A record that is not a fingerprint (edited by hand) is refused as damaged: what it
    would allow cannot be told. Changes of the evaluation sets alone are not refused
    (:func:`evaluation_note`)."""
    if saved is None:
        return None
    try:
        changes = [c for c in _changes_with(saved, job) if c[0] not in EVALUATION_FIELDS]
    except ValueError as e:
        return f"checkpoint {checkpoint}: its manifest's data record is damaged ({e}); {fix(run)}"
    if not changes:
        return None
    fields = ", ".join(dict.fromkeys(f for f, _ in changes))
    how = "; ".join(h for _, h in changes)
    at = f"position {position}" if isinstance(position, int) else "its data position"
    why = f"{at} would skip or repeat samples"
    if "data.split" in fields:
        why += " and documents would move between training and evaluation"
    return f"{fields}: changed since checkpoint {checkpoint} ({how}): {why}; {fix(run)}"


def evaluation_note(saved, job, checkpoint: str) -> str | None:
    """A note when the validation or test corpora changed since ``checkpoint``: allowed (the
    training position keeps its meaning, as when ``eval_iters`` or the global batch size
    change the evaluated samples), but the evaluation losses then do not continue the run's."""
    if saved is None:
        return None
    try:
        changes = [c for c in _changes_with(saved, job) if c[0] in EVALUATION_FIELDS]
    except ValueError:
        return None             # resume_problem names it
    if not changes:
        return None
    return (f"{', '.join(f for f, _ in changes)}: changed since checkpoint {checkpoint} "
            f"({'; '.join(h for _, h in changes)}): the evaluation losses from here on do not "
            f"continue the run's curve")


def _changes_with(saved, job) -> list[tuple[str, str]]:
    """:func:`data_changes` of ``saved`` against ``job``'s fingerprint (read in the saved
    order); a ``saved`` that is not a fingerprint is a ValueError."""
    if not well_formed(saved):
        raise ValueError(f"not a data fingerprint: {show(repr(saved), 60)}")
    order = saved.get("order")
    return data_changes(saved, data_fingerprint(job, order if isinstance(order, str) else None))
