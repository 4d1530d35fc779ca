"""``bucketq.store`` owns every command bucketq sends: no module outside it calls a collection's
methods. Reads the source only (``ast``): no server, no database."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (ROOT / "bucketq", ROOT / "spark" / "bucketq_spark")
# the store itself, and the drivers it runs on: the in-memory database and the Motor adapter
OWNERS = (ROOT / "bucketq" / "store", ROOT / "bucketq" / "memory", ROOT / "bucketq" / "motor_adapter.py")
COLLECTION_METHODS = frozenset({
    "aggregate", "bulk_write", "count_documents", "create_index", "create_indexes", "delete_many", "delete_one",
    "distinct", "drop_collection", "estimated_document_count", "find", "find_one", "find_one_and_delete",
    "find_one_and_replace", "find_one_and_update", "index_information", "insert_many", "insert_one",
    "list_collection_names", "list_collections", "replace_one", "update_many", "update_one", "watch",
})


def collection_calls(source: str) -> list[tuple[int, str]]:
    """(line, method) of each call of a collection method in ``source``; ``str.find("...")`` is not one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTION_METHODS):
            continue
        if node.func.attr == "find" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            continue
        found.append((node.lineno, node.func.attr))
    return found


def scanned_files() -> list[Path]:
    return sorted(path for root in SCANNED for path in root.rglob("*.py")
                  if not any(path == owner or owner in path.parents for owner in OWNERS))


def test_only_the_store_calls_collection_methods() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line}: .{method}(...)"
                 for path in scanned_files() for line, method in collection_calls(path.read_text())]
    assert not offenders, "queries outside bucketq/store (move them into a store method):\n" + "\n".join(offenders)


def test_the_scan_sees_the_shells_and_finds_a_reintroduced_call() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in scanned_files()}
    assert {"bucketq/queue.py", "bucketq/batch.py", "bucketq/cli/entries.py",
            "spark/bucketq_spark/stream.py"} <= files
    assert not any(name.startswith(("bucketq/store/", "bucketq/memory/")) for name in files)
    shell = (ROOT / "bucketq" / "queue.py").read_text()
    reintroduced = shell + "\n\nasync def peek(store):\n    return await store.buckets.find_one({})\n"
    assert [method for _, method in collection_calls(reintroduced)] == ["find_one"]
    assert collection_calls('scheme = uri.find("://")') == []
