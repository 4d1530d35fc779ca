"""The field tables of docs/FORMAT.md, parsed, and checks of a stored document against them: the format's tests
(tests/test_format.py) and those of features that store documents of their own kinds."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from bson import ObjectId

from bucketq.core.format import FORMAT_VERSION, GROUP_FORMAT_VERSION

FORMAT_MD = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"
TYPES = {"objectId": ObjectId, "int": int, "string": str, "date": dt.datetime, "binData": bytes, "object": dict,
         "null": type(None), "bool": bool, "double": float}


def table(name: str) -> dict[str, tuple[str, bool]]:
    """{field: (type expression, required)} from the table between <!-- name --> markers."""
    text = FORMAT_MD.read_text()
    body = re.search(rf"<!-- {name} -->(.*?)<!-- /{name} -->", text, re.S)
    assert body, f"docs/FORMAT.md has no table {name}"
    rows = [line for line in body.group(1).strip().splitlines()[2:] if line.startswith("|")]
    fields = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        fields[cells[0].strip("`")] = (cells[1], cells[2] == "yes")
    return fields


def matches(value: object, expression: str) -> bool:
    """Whether ``value`` is of the table's type ``expression`` ("int", "int or null", "array of string or null"...)."""
    if expression.startswith("array of "):
        return isinstance(value, list) and all(matches(v, expression[len("array of "):]) for v in value)
    for alternative in expression.split(" or "):
        kind = TYPES[alternative.strip()]
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return True
    return False


def check(doc: dict, table_name: str, *overrides: str) -> None:
    """``doc`` against a table, with the rows of ``overrides`` (tables of what a later version changes) in place
    of the table's."""
    fields = table(table_name)
    for override in overrides:
        fields.update(table(override))
    unknown = set(doc) - set(fields)
    assert not unknown, f"{table_name}: fields not in docs/FORMAT.md: {unknown}"
    for field, (expression, required) in fields.items():
        if field not in doc:
            assert not required, f"{table_name}: required field {field} missing"
            continue
        assert matches(doc[field], expression), f"{table_name}: {field}={doc[field]!r} is not {expression}"


def check_bucket(doc: dict) -> None:
    """A bucket document against its table and the invariants between its fields (per-slot arrays, lease)."""
    check(doc, "bucket-fields")
    assert doc["v"] == (GROUP_FORMAT_VERSION if "g" in doc else FORMAT_VERSION)
    if "g" in doc:
        assert "s" in doc and len(doc["t"]) == doc["n"], "a group bucket has its place and per-slot tries"
    assert doc["n"] == len(doc["p"]) >= 1
    for per_slot in "hktoe":
        if per_slot in doc:
            assert len(doc[per_slot]) == doc["n"], f"per-slot array {per_slot} has the wrong length"
    if doc["lease"] is not None:
        check(doc["lease"], "lease-fields")
        assert doc["lease"]["until"] == doc["due"]


def check_tombstone(doc: dict) -> None:
    """A finished bucket's tombstone against its tables."""
    check(doc, "tombstone-fields")
    check(doc["fin"], "fin-fields")
    assert doc["due"].year == 9999 and doc["lease"] is None
