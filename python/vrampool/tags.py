"""Tagged regions, paused and resumed: the figures :meth:`vrampool.DevicePool.pause` and
:func:`vrampool.torch.pause` return, and the tags they list.

A tag's memory lives in reserved address ranges with physical memory mapped in (virtual-memory
management): a pause gives the physical memory back to the device and keeps the ranges, so every
pointer, tensor and captured CUDA graph keeps its address; a resume maps new memory at the same
places (and writes back the bytes a backup kept). See ``docs/pause-resume.md``.
"""

from __future__ import annotations

from typing import List, NamedTuple, Tuple


class PauseReport(NamedTuple):
    """What a pause did."""

    #: Physical memory given back to the device.
    released: int
    #: Bytes of live buffers copied to host memory (0 without ``backup``).
    backed_up: int


class TagInfo(NamedTuple):
    """A tag's memory now."""

    name: str
    paused: bool
    #: Bytes of live buffers.
    allocated: int
    #: Bytes mapped from the device now.
    reserved: int
    #: Bytes a pause gave back, mapped again on resume.
    paused_bytes: int


def tag_infos(rows: List[Tuple[str, bool, int, int, int]]) -> List[TagInfo]:
    """The native layer's rows as :class:`TagInfo`."""
    return [TagInfo(*row) for row in rows]
