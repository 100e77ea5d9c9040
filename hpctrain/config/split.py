"""Megatron-LM's ``--split`` text (``"969,30,1"``) read into three shares: a value the job
checks need (``config.job``) and the data layer cuts documents by (``data.splits``)."""

from __future__ import annotations

from .safety import number_from_text


def parse_split(text: str) -> tuple[float, float, float]:
    """``"969,30,1"`` -> the normalised shares (a ValueError saying what is wrong)."""
    parts = [p.strip() for p in str(text).replace("/", ",").split(",")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"{text!r}: expected up to three numbers train,valid,test such as "
                         f"\"969,30,1\"")
    numbers = [number_from_text(p) for p in parts]   # ASCII notation only, not float()'s
    if None in numbers:
        raise ValueError(f"{text!r}: expected numbers such as \"969,30,1\"")
    numbers += [0.0] * (3 - len(numbers))
    if any(not (n >= 0) or n == float("inf") for n in numbers):
        raise ValueError(f"{text!r}: the shares must be finite and not negative")
    total = sum(numbers)
    if numbers[0] <= 0:
        raise ValueError(f"{text!r}: the training share must be above 0")
    return tuple(n / total for n in numbers)
