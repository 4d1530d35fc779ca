"""The web dashboard (``bucketq web``; ``pip install bucketq[web]``): queues and streams of one database, their
counts and charts, dead letters and quarantine (paged, filtered by error text), each message's page, who holds
what, reader groups, and, when allowed, the operator actions.

``app`` (the Starlette app and its pages), ``dashboard`` (reads, sampling, actions: through ``Queue`` and
``Stream``), ``messages`` (one message: where it is, retry, delete), ``security`` (token, sessions, CSRF, the
loopback rule), ``history`` (the charts' last hour, in memory), ``charts`` (inline SVG, a colour per series).
docs/operations/dashboard.md.
"""

from typing import Any

from bucketq.web.security import check_bind

__all__ = ["check_bind", "create_app"]


def __getattr__(name: str) -> Any:
    """``create_app`` is imported on first use: ``bucketq web --help`` and ``check_bind`` need no Starlette."""
    if name == "create_app":
        from bucketq.web.app import create_app

        return create_app
    raise AttributeError(f"module 'bucketq.web' has no attribute {name!r}")
