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
from .index_header import FIXED, parse_header
from .splits import corpora

FORMAT = 1
CLOSE = 1e-9          # weights and split shares this close are equal (float noise of a scaling)
FIX = ("resume with the saved data settings, or start a new run from its weights with "
       "train.init_from")


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


def _close(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= CLOSE
    return a == b


def _shown_weights(weights: list) -> str:
    return "/".join(f"{w:.3g}" if isinstance(w, (int, float)) else str(w) for w in weights)


def _shown_shape(c) -> str:
    if not isinstance(c, dict):
        return str(c)
    return f"{c.get('documents')} documents, {c.get('tokens')} tokens"


def _same_shape(a, b) -> bool:
    """Equal shapes; a shape unknown on either side (the data not readable here) counts as equal
    (the runtime, which reads the data, compares it)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return a == b
    return all(a.get(k) is None or b.get(k) is None or a.get(k) == b.get(k)
               for k in ("documents", "tokens"))


def _corpora_change(saved: list, now: list, what: str) -> str | None:
    """How the corpora of one stream differ (None: they do not)."""
    saved, now = list(saved or []), list(now or [])
    if len(saved) != len(now):
        return f"{what}{len(saved)} -> {len(now)} corpora"
    for i, (a, b) in enumerate(zip(saved, now)):
        if not _same_shape(a, b):
            return f"{what}corpus {i}: {_shown_shape(a)} -> {_shown_shape(b)}"
    ws = [c.get("weight") if isinstance(c, dict) else c for c in saved]
    wn = [c.get("weight") if isinstance(c, dict) else c for c in now]
    if not all(_close(a, b) for a, b in zip(ws, wn)):
        return f"{what}weights {_shown_weights(ws)} -> {_shown_weights(wn)}"
    return None


def _shown_split(shares) -> str:
    if shares is None:
        return "none"
    return ",".join(f"{s:.3g}" if isinstance(s, (int, float)) else str(s) for s in shares)


def _same_split(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def data_changes(saved: dict, now: dict) -> list[tuple[str, str]]:
    """``(field, how it changed)`` for every setting of ``now`` that gives a position of
    ``saved`` another meaning; empty when none does. Keys missing on either side (a later
    fingerprint's additions) are not compared."""
    out = []
    corpora_change = _corpora_change(saved.get("corpora"), now.get("corpora"), "")
    if corpora_change:
        out.append((now.get("corpora_field") or "data.blend", corpora_change))
    a, b = saved.get("split"), now.get("split")
    if "split" in saved and "split" in now and not _same_split(a, b):
        out.append(("data.split", f"split {_shown_split(a)} -> {_shown_split(b)}"))
    for key, field in (("seed", "train.seed"), ("seq_length", "model.seq_length"),
                       ("order", "sample order")):
        if key in saved and key in now and saved[key] != now[key]:
            out.append((field, f"{key.replace('_', ' ')} {saved[key]} -> {now[key]}"))
    for key in ("valid_blend", "test_blend"):
        if key not in saved or key not in now:
            continue
        if (saved[key] is None) != (now[key] is None):
            shown = {True: "from the split", False: "its own corpora"}
            out.append((f"data.{key}", f"{key.split('_')[0]} set {shown[saved[key] is None]} "
                                       f"-> {shown[now[key] is None]}"))
            continue
        change = _corpora_change(saved[key], now[key], f"{key.split('_')[0]} ")
        if change:
            out.append((f"data.{key}", change))
    return out


def resume_problem(saved, job, checkpoint: str, position) -> str | None:
    """The one line refusing to resume ``job`` from ``checkpoint`` (its fingerprint ``saved``,
    its position ``position``), naming each changed field and the fix; None when the position
    keeps its meaning. A checkpoint saved before fingerprints were recorded has none (``saved``
    is None): there is nothing to compare, it is accepted as before."""
    if not isinstance(saved, dict):
        return None
    order = saved.get("order")
    changes = data_changes(saved, data_fingerprint(job, order if isinstance(order, str) else None))
    if not changes:
        return None
    fields = ", ".join(dict.fromkeys(f for f, _ in changes))
    how = "; ".join(h for _, h in changes)
    training = [f for f, _ in changes if f not in ("data.valid_blend", "data.test_blend")]
    at = f"position {position}" if isinstance(position, int) else "its data position"
    why = (f"{at} would skip or repeat samples" if training else
           "the evaluation losses would not continue the run's")
    if "data.split" in training:
        why += " and documents would move between training and evaluation"
    return f"{fields}: changed since checkpoint {checkpoint} ({how}): {why}; {FIX}"
