"""A bounded read's positions per split (a batch read from a start to an end), checked the same for every
source: a split whose start is past its end could only ever read nothing, which is a mistake in the options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluice._errors import OptionError


def forward_bounds(found: Mapping[str, Sequence[int]], backwards: str, advice: str) -> dict[str, tuple[int, int]]:
    """`found` (split id -> [start, end]) as (start, end) pairs when no start is after its end; else refuses,
    `backwards` formatting the splits that are (e.g. "the start is after the end in partition(s) {}"), then
    `advice`."""
    wrong = sorted(f"{sid} ({start} > {end})" for sid, (start, end) in found.items() if start > end)
    if wrong:
        raise OptionError(f"{backwards.format(', '.join(wrong))}: the read would return nothing. {advice}")
    return {sid: (start, end) for sid, (start, end) in found.items()}
