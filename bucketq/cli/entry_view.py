"""Dead letters and quarantine entries as plain dicts (for JSON) and as a table."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bucketq.cli.output import preview, relative, table
from bucketq.codecs import codec_named


def entry_view(entry: dict[str, Any]) -> dict[str, Any]:
    """A dead letter (``error``) or quarantine entry (``reason``, ``kind``) with its payload decoded."""
    view: dict[str, Any] = {"id": entry["_id"]}
    for field in ("kind", "at", "tries", "error", "reason", "enqueued_at"):
        if field in entry:
            view[field] = entry[field]
    for field, name in (("h", "headers"), ("k", "key")):
        if entry.get(field) is not None:
            view[name] = entry[field]
    if entry.get("kind") == "bucket":
        doc = entry.get("doc") or {}
        view["messages"] = len(doc.get("p") or [])
    elif "p" in entry:
        try:
            view["payload"] = codec_named(entry.get("enc", "json")).load(entry["p"])
        except Exception as exc:
            view["undecodable"] = f"{type(exc).__name__}: {exc}"
    return view


def entry_table(views: list[dict[str, Any]], reason: str) -> Any:
    from rich.markup import escape
    now = dt.datetime.now(dt.timezone.utc)
    quarantine = reason == "reason"
    grid = table()
    for column in ("id", "at", "kind" if quarantine else "tries", reason, "payload"):
        grid.add_column(column, no_wrap=column in ("id", "at"))
    for v in views:
        if "payload" in v:
            payload = escape(preview(v["payload"], 120))
        elif "messages" in v:
            payload = f"(whole bucket, {v['messages']} messages)"
        else:
            payload = f"[red]{escape(v.get('undecodable', '-'))}[/]"
        grid.add_row(str(v["id"]), relative(v.get("at"), now), str(v.get("kind" if quarantine else "tries", "-")),
                      escape(str(v.get(reason, ""))), payload)
    return grid
