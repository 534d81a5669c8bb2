"""Reading input files for the trace and plan readers: UTF-8 text (a leading byte-order mark
is accepted), in lines of bounded length, and excerpts of bad input cut short for messages, so
that a hostile file costs neither unbounded memory nor an unbounded error message.

>>> quote("x" * 500)[-30:]
"xxxxxxxxxxxx'... (402 more characters)"
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, Union

#: The longest line a text input may have: a trace's lines are tens of bytes.
MAX_LINE_BYTES = 1 << 20
#: The most characters of input a message quotes.
QUOTE_CHARS = 100


def quote(value: Any) -> str:
    """``repr(value)``, cut to about :data:`QUOTE_CHARS` characters."""
    text = repr(value)
    if len(text) <= QUOTE_CHARS:
        return text
    return f"{text[:QUOTE_CHARS]}... ({len(text) - QUOTE_CHARS} more characters)"


def read_text(path: Union[str, Path]) -> str:
    """The text of a UTF-8 file, without a leading byte-order mark. Raises ``ValueError``
    naming the line when a line is longer than :data:`MAX_LINE_BYTES` (before reading past it)
    or is not UTF-8."""
    chunks = []
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"line {number} is longer than {MAX_LINE_BYTES:,} bytes: not a trace or buffer list")
            chunks.append(line)
    data = b"".join(chunks)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"line {line}: byte {e.start} is not UTF-8 (expected JSON lines, CSV or a snapshot pickle)") from None
