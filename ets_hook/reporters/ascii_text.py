"""ASCII stand-ins for ets-hook's few non-ASCII characters, where a stream cannot encode them.

ets-hook's text uses ``±``, ``·``, ``—``, ``×``, ``µ``, ``≤``, ``→``, ``…`` and the like. On a
stream whose encoding lacks them (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``) they come out as
readable ASCII instead (``+/-``, ``|``, ``--``, ``x``, ``u``, ``<=``, ``->``, ``...``; ``?`` for
any other character), never as a ``UnicodeEncodeError`` nor as Python's ``\\xb1`` escapes.
Characters the encoding has are kept (latin-1 keeps ``±``, replaces ``—``); a UTF-8 stream is
never touched.

Importing the module registers the codecs error handler ``ERRORS``: the command line
reconfigures its standard streams with it (``cli.common.ascii_substitutes``), and
``ConsoleHandler`` passes its lines through ``for_stream`` (the application's own streams are
never reconfigured). Imports nothing of the package.
"""

from __future__ import annotations

import codecs
from typing import Any

#: The codecs error handler's name: ``stream.reconfigure(errors=ERRORS)``, ``text.encode(enc,
#: ERRORS)``.
ERRORS = "ets_hook_ascii"

#: What each character becomes where it cannot be encoded; any other character: ``?``.
SUBSTITUTES: dict[str, str] = {
    "±": "+/-",
    "·": "|",
    "—": "--",
    "–": "-",
    "×": "x",
    "µ": "u",  # micro sign
    "μ": "u",  # Greek mu
    "≤": "<=",
    "≥": ">=",
    "→": "->",
    "←": "<-",
    "…": "...",
    "∞": "inf",
    "\u00a0": " ",
}

#: Every character with a substitute: an encoding that has them all needs none.
_ALL = "".join(SUBSTITUTES)


def _substitute(exc: UnicodeError) -> tuple[str, int]:
    """The codecs error handler: the ASCII substitutes of the characters that failed."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    failed = exc.object[exc.start : exc.end]
    return "".join(SUBSTITUTES.get(char, "?") for char in failed), exc.end


codecs.register_error(ERRORS, _substitute)


def can_encode(text: str, encoding: str | None) -> bool:
    """Whether ``encoding`` has every character of ``text``.

    Args:
        text: the text.
        encoding: a codec name; None (a stream that takes ``str`` as it is, ``io.StringIO``)
            or a name Python does not know: True (nothing to substitute for).

    Returns:
        False only when encoding ``text`` strictly would fail.
    """
    if encoding is None or text.isascii():
        return True
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    except (LookupError, TypeError):
        return True
    return True


def needs_substitutes(stream: Any) -> bool:
    """Whether ``stream``'s encoding lacks some of ets-hook's characters (``SUBSTITUTES``).

    Args:
        stream: a text stream; one without an ``encoding`` attribute needs none.

    Returns:
        True for an ASCII or latin-1 stream, False for UTF-8 (or unknown).
    """
    return not can_encode(_ALL, getattr(stream, "encoding", None))


def for_stream(text: str, stream: Any) -> str:
    """``text`` as ``stream`` can encode it: the characters its encoding lacks replaced by
    their ASCII substitutes (``?`` when there is none), the others kept.

    Args:
        text: the text to write.
        stream: the text stream it goes to (its ``encoding``; none: ``text`` unchanged).

    Returns:
        ``text`` itself when the encoding has all of it.
    """
    encoding = getattr(stream, "encoding", None)
    if can_encode(text, encoding):
        return text
    assert encoding is not None
    return text.encode(encoding, ERRORS).decode(encoding, "replace")
