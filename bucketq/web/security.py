"""Who may do what on the dashboard: the loopback rule for binding, the token, sessions and CSRF.

Read-only by default. Write actions (requeue, purge, pause, resume, reset) need ``allow_actions`` *and* a token.
With a token every page asks for it (``/login`` sets a session cookie; scripts and KEDA send
``Authorization: Bearer <token>``). Every POST is checked in full: actions allowed, the token (the session
cookie is an HMAC of it, so a changed token ends every session), and for a browser session the form's CSRF field
(an HMAC of the session, which a page of another site cannot read) and, when the browser sends one, an
``Origin`` of this host. The cookie is ``HttpOnly`` and ``SameSite=Strict``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bucketq.errors import InvalidOption

if TYPE_CHECKING:  # the command line imports this module for check_bind, with or without the web extra
    from starlette.requests import Request

SESSION_COOKIE = "bucketq_session"
TOKEN_ENV = "BUCKETQ_WEB_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (what the server binds to) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve on an address other machines reach without a token."""
    if not token and not is_loopback(host):
        raise InvalidOption(f"refusing to serve the dashboard on {host!r} without a token: other machines could "
                            f"reach it. Bind to 127.0.0.1, or set a token (--token or ${TOKEN_ENV})")


@dataclass(frozen=True)
class Guard:
    token: str | None
    allow_actions: bool

    def __post_init__(self) -> None:
        if self.allow_actions and not self.token:
            raise InvalidOption(f"write actions need a token (--token or ${TOKEN_ENV}) as well as --allow-actions")
        if self.token is not None and not self.token.strip():
            raise InvalidOption("the token is empty")

    @property
    def actions(self) -> bool:
        """Whether the write actions are offered at all."""
        return self.allow_actions and self.token is not None

    def _sign(self, purpose: str, value: str) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> str:
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign('session', nonce)}"

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def _session_nonce(self, request: Request) -> str | None:
        """The nonce of a valid session cookie, else None."""
        if self.token is None:
            return None
        nonce, _, signature = request.cookies.get(SESSION_COOKIE, "").partition(".")
        if nonce and hmac.compare_digest(signature.encode(), self._sign("session", nonce).encode()):
            return nonce
        return None

    def _bearer(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given.strip())

    def may_read(self, request: Request) -> bool:
        return self.token is None or self._bearer(request) or self._session_nonce(request) is not None

    def csrf(self, request: Request) -> str:
        """The CSRF field of this session's forms ("" without a session)."""
        nonce = self._session_nonce(request)
        return self._sign("csrf", nonce) if nonce else ""

    def refuse_post(self, request: Request, form: dict[str, str], *, action: bool = True) -> tuple[int, str] | None:
        """Why this POST must be refused (status, reason), or None when it may go on. ``action=False`` for the
        session's own forms (log out), which need a session but not ``allow_actions``."""
        if action and not self.actions:
            return 403, "the dashboard is read-only: start it with --allow-actions and a token to act"
        if self.token is None:
            return 403, "this form needs a token"
        if self._bearer(request):
            return None  # a header no other site's page can make a browser send
        nonce = self._session_nonce(request)
        if nonce is None:
            return 401, "log in with the token first"
        if not hmac.compare_digest(form.get("csrf", "").encode(), self._sign("csrf", nonce).encode()):
            return 403, "the form's CSRF field is missing or wrong: reload the page and try again"
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            return 403, f"the request comes from another site ({origin})"
        return None
