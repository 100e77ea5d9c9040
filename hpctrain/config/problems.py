"""The problems found while a profile, a job or a layout is checked, collected so that every
one is reported at once (``Error: FILE has N problems:``) instead of the first alone.

Its own module because every checker fills one: the schema loader, the value rules of
:mod:`.safety`, the cross-field checks of :mod:`.job`, :mod:`.profile` and :mod:`.layout`, and
the planner's explanation of a pinned layout.
"""

from __future__ import annotations


class Problems:
    """Collects ``(field_path, message)`` pairs while a whole document is checked."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def about(self, path: str) -> bool:
        """Whether a problem of the field ``path`` itself is already recorded."""
        return any(p == path for p, _ in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)
