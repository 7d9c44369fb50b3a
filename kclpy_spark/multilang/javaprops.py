"""``java.util.Properties.load``'s syntax, for the MultiLangDaemon's .properties files.

``#``/``!`` comment lines, ``key=value``, ``key: value`` and ``key value``, lines continued with a
trailing backslash (an odd run of backslashes), and the escapes ``\\t \\n \\r \\f \\uXXXX`` (any
other escaped character stands for itself). Values keep their trailing blanks, as in Java. A file
is read as UTF-8, falling back to ISO-8859-1 (Java's encoding for ``Properties.load``) when it is
not valid UTF-8.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

from checkpoint.base.errors import ConfigError

_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "f": "\f"}


def _trailing_backslashes(text: str) -> int:
    return len(text) - len(text.rstrip("\\"))


def _unescape(text: str, where: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        i += 1
        if char != "\\":
            out.append(char)
            continue
        if i >= n:
            break  # a lone backslash at the very end of the file: dropped, as Java does
        char = text[i]
        i += 1
        if char == "u":
            digits = text[i : i + 4]
            if len(digits) < 4 or any(d not in string.hexdigits for d in digits):
                raise ConfigError(f"{where}: malformed \\uxxxx escape {text[i - 2 : i + 4]!r}")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(char, char))
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """The raw key and value of one logical line (``Properties.load0``'s separator rule)."""
    n = len(line)
    end = value_start = n
    has_separator = backslash = False
    for i, char in enumerate(line):
        if not backslash and char in "=:":
            end, value_start, has_separator = i, i + 1, True
            break
        if not backslash and char in _BLANKS:
            end, value_start = i, i + 1
            break
        backslash = (not backslash) if char == "\\" else False
    j = value_start
    while j < n:
        char = line[j]
        if char not in _BLANKS:
            if has_separator or char not in "=:":
                break
            has_separator = True
        j += 1
    return line[:end], line[j:]


def parse_properties(text: str, *, source: str = "properties") -> dict[str, str]:
    """Keys and values exactly as ``java.util.Properties.load`` reads them (the last duplicate
    wins). Raises ConfigError for a malformed ``\\uxxxx`` escape, naming the line."""
    lines = re.split(r"\r\n|\r|\n", text)
    props: dict[str, str] = {}
    i = 0
    while i < len(lines):
        number = i + 1
        logical = lines[i].lstrip(_BLANKS)
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _trailing_backslashes(logical) % 2 == 1:
            logical = logical[:-1]
            if i >= len(lines):
                break
            logical += lines[i].lstrip(_BLANKS)
            i += 1
        key, value = _split_key_value(logical)
        where = f"{source}: line {number}"
        props[_unescape(key, where)] = _unescape(value, where)
    return props


def read_properties_file(path: Path) -> dict[str, str]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"properties file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"properties file {str(path)!r} cannot be read: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text, source=str(path))
