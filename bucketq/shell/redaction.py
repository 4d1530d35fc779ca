"""Hiding credentials: every error, log line and output of bucketq that may hold a MongoDB URI passes through
``redact``. Pure functions; they never parse the URI, so an unparseable one is hidden as well as a good one.

**The rule.** The credentials of a URI are everything after its ``://`` (from its start when it has none) up to
the *last* ``@`` of the string. Not the last ``@`` before the first ``/``, as pymongo reads it: a password that
was not percent-escaped may hold ``/``, ``?``, ``#``, ``:`` and ``@`` (``mongodb://alice:S3cr/pw@h/shop``), and
no rule can tell ``u:p@h/?appName=a@b`` (an ``@`` in an option) from the password ``p@h/?appName=a``. So an ``@``
in the path or the options hides everything before it, hosts included: too much is hidden rather than too little.
Inside free text (a log line, a traceback) a URI runs from its scheme to the next whitespace.

**Echoed pieces.** pymongo's messages quote parts of a URI it misread (``Bad database name "pw@h1:1,h2:2/shop"``
for ``mongodb://alice:S3cr/pw@h1:1,h2:2/shop``; a host ``alice:1234``). Such a part runs between the URI's
delimiters, so what it holds of the credentials is whole *pieces*: the credentials cut at ``: / ? # [ ] @ & ; = ,``,
whitespace, quotes and backslashes (a quoted echo may escape those). Given the URI the user passed, ``redact`` hides
each piece (raw and percent-decoded, in any case) within URI text only: a run of the text without whitespace where
``:``, ``/`` or ``@`` joins two other characters, as in any echo of a URI's authority or path. The words of a
message are left alone, so a user named ``user`` still reads "in the user name and password". Within such a run,
a piece shorter than ``SHORT_PIECE`` is hidden only where it stands alone (not touching a letter or digit), so that
a one-letter password does not blank every host name.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

HIDDEN = "***"
SHORT_PIECE = 4
_URI_IN_TEXT = re.compile(r"mongodb(?:\+srv)?://\S*", re.IGNORECASE)
_DELIMITERS = re.compile(r"[:/?#\[\]@&;=,\s'\"`\\]+")
_URI_TEXT = re.compile(r"\S*[^\s:/@][:/@][^\s:/@]\S*")  # where echoed pieces are hidden (see above)
# options whose values are secrets, should a URI carry them
_SECRET_OPTIONS = re.compile(r"((?:password|authMechanismProperties|tlsCertificateKeyFilePassword)=)[^&\s'\"]*",
                             re.IGNORECASE)


def credentials_span(uri: str) -> tuple[int, int]:
    """Where the credentials of ``uri`` are, by the rule above: ``uri[start:end]`` (empty when it has no ``@``)."""
    scheme = uri.find("://")
    start = 0 if scheme < 0 else scheme + 3
    return start, max(start, uri.rfind("@"))


def redact(text: str, uri: str | None = None) -> str:
    """``text`` with credentials hidden as ``***``: those of every URI in it, the values of secret URI options,
    and, when ``uri`` is the string the user passed (whatever it holds), that string's credentials and each
    piece of them wherever they appear."""
    if uri:
        start, end = credentials_span(uri)
        if end > start:
            text = text.replace(uri, uri[:start] + HIDDEN + uri[end:])
            text = _hide_pieces(text, uri[start:end])
    return _SECRET_OPTIONS.sub(r"\1" + HIDDEN, _URI_IN_TEXT.sub(_redact_uri, text))


def _redact_uri(match: re.Match[str]) -> str:
    uri = match.group()
    start, end = credentials_span(uri)
    return uri if end == start else uri[:start] + HIDDEN + uri[end:]


def _hide_pieces(text: str, secret: str) -> str:
    variants = {secret, unquote_plus(secret)}
    pieces = variants | {piece for v in variants for piece in _DELIMITERS.split(v)}
    patterns = [re.compile(re.escape(piece) if len(piece) >= SHORT_PIECE else
                           rf"(?<![^\W_]){re.escape(piece)}(?![^\W_])", re.IGNORECASE)
                for piece in sorted(filter(None, pieces), key=len, reverse=True)]

    def hide_in(uri_text: re.Match[str]) -> str:
        hidden = uri_text.group()
        for pattern in patterns:
            hidden = pattern.sub(HIDDEN, hidden)
        return hidden

    return _URI_TEXT.sub(hide_in, text)
