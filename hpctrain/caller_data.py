"""The Python API's door for data a caller hands in as objects: a job mapping, ``overrides``
and a ``sweep``.

A caller's mapping may be any ``Mapping``: a dict subclass whose ``items()`` raises, a
generator of sweep values that raises half way, a dict that holds itself. Every later check
(the job schema, ``--set``, ``--sweep``) reads these objects again and again, and each read
could raise something other than an ``HpcTrainError``. So the data is read once, here, into
plain ``dict``s, ``list``s and ``str``s; whatever the caller's objects raise while being read
is one ``UsageError`` naming the argument. Scalars (numbers, numpy numbers, objects of any
other type) are passed on as they are: the schema's door words them."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from .errors import HpcTrainError, UsageError
from .limits import MAX_SWEEP_POINTS

MAX_DEPTH = 32     # no job file nests deeper than a few levels; a dict that holds itself stops here


def plain(name: str, value, *, sweep: bool = False):
    """``value`` (the argument ``name``) as plain data. With ``sweep``, each value of the
    top-level mapping may be any iterable (a ``range``, a numpy array, a generator): it is read
    as a list of at most ``MAX_SWEEP_POINTS + 1`` items, so that the sweep's own bound can
    still refuse an endless one without it being read for ever."""
    try:
        if sweep and isinstance(value, Mapping):
            return {_plain(key, 1): _sweep_values(values) for key, values in value.items()}
        return _plain(value, 0)
    except HpcTrainError as e:
        raise UsageError(f"{name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever a caller's object raises while read
        raise UsageError(f"{name}: reading it raised {type(e).__name__}; pass plain dicts, "
                         "lists, strings and numbers") from None


def _sweep_values(values):
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        return _plain(values, 1)
    return [_plain(v, 2) for v in itertools.islice(iter(values), MAX_SWEEP_POINTS + 1)]


def _plain(value, depth: int):
    if depth > MAX_DEPTH:
        raise UsageError(f"nested more than {MAX_DEPTH} levels deep (a mapping or list that "
                         "holds itself?); a job file nests a few levels")
    if isinstance(value, str):
        return str.__str__(value)           # a str subclass's own methods are not asked again
    if isinstance(value, Mapping):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return value
