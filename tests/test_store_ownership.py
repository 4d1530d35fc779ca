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


# -- the store's vocabulary: the shells pass domain values, the store builds the commands ------------------------

STORE_NAMES = frozenset({"store", "_store"})  # how the shells hold a store: ``store``, ``self._store``, ``self.store``
# The parameter names of a filter, an update or a sort built outside the store.
RAW_PARAMETERS = frozenset({"query", "update", "mine", "spec", "sort", "tombstone", "writes", "proofs", "finishes"})
_CLAIM_STEP = "the claim step (core.claim_step) hands its claim's filter to the consumer and BatchQueue that carry it"
_PLANS = ("the fenced writes of a flush or finish, planned per bucket (core.held, core.batch_attempt) and sent by "
          "the consumer and BatchQueue")
_GROUP_TURN = "the turn of an ordered group (core.group_turn) carries its commands in its steps"
_STREAM_READ = "a stream reader's conversation (core.stream_read) carries its commands in its steps"
# Store methods that still take a raw filter or update, as (store module, method): each with why it is left.
TAKE_RAW: dict[tuple[str, str], str] = {
    ("queue_store", "claim"): _CLAIM_STEP,
    ("queue_store", "update_fenced"): _PLANS,
    ("queue_store", "finish_fenced"): _PLANS,
    ("queue_store", "fenced_many"): _PLANS,
    ("queue_store", "finish_many"): _PLANS,
    ("queue_store", "lock_group"): _GROUP_TURN,
    ("queue_store", "extend_group"): _GROUP_TURN,
    ("queue_store", "unlock_group"): _GROUP_TURN,
    ("queue_store", "first_bucket"): _GROUP_TURN,
    ("queue_store", "wake"): _GROUP_TURN,
    ("stream_store", "upsert_group"): _STREAM_READ,
    ("stream_store", "move_group"): _STREAM_READ,
    ("stream_store", "update_claim"): _STREAM_READ,
}


def store_collections() -> frozenset[str]:
    """The collection attributes of the stores: the targets of ``... = collections(...)`` in ``bucketq/store/aio``."""
    names = set()
    for path in (ROOT / "bucketq" / "store" / "aio").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and isinstance(node.value.func, ast.Name) and node.value.func.id == "collections":
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    names.update(e.attr for e in elts if isinstance(e, ast.Attribute))
    return frozenset(names)


def _is_store(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in STORE_NAMES) or \
        (isinstance(node, ast.Attribute) and node.attr in STORE_NAMES)


def raw_store_calls(source: str, collections: frozenset[str]) -> list[tuple[int, str, str]]:
    """(line, store method, what is wrong) of each call in ``source`` that hands a store one of its own collections
    (``store.dead``), a dict literal (a filter or update built by the caller), or picks a store attribute by name
    (``getattr(store, ...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args and _is_store(node.args[0]):
            found.append((node.lineno, "getattr", "a store attribute picked by name"))
            continue
        if not (isinstance(node.func, ast.Attribute) and _is_store(node.func.value)):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            if isinstance(arg, ast.Attribute) and arg.attr in collections and _is_store(arg.value):
                found.append((node.lineno, node.func.attr, f"the collection store.{arg.attr}"))
            elif isinstance(arg, ast.Dict):
                found.append((node.lineno, node.func.attr, "a dict literal"))
    return found


def test_the_shells_speak_to_the_store_in_domain_values() -> None:
    collections = store_collections()
    offenders = [f"{path.relative_to(ROOT)}:{line}: store.{method}(...) is given {what}"
                 for path in scanned_files() for line, method, what in raw_store_calls(path.read_text(), collections)]
    assert not offenders, ("give the store domain values (ids, tokens, times, kinds) and let a store method build the "
                           "command from bucketq.core:\n" + "\n".join(offenders))


def raw_parameters(source: str, module: str) -> set[tuple[str, str]]:
    """(module, method) of each public method in ``source`` with a parameter in ``RAW_PARAMETERS``."""
    return {(module, node.name) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
            and any(a.arg in RAW_PARAMETERS for a in [*node.args.args, *node.args.kwonlyargs])}


def test_the_store_methods_that_take_raw_commands_are_the_listed_ones() -> None:
    """A new store method names its intent (``remove_slots``, ``purge_entries``) and builds its own command."""
    found = {m for path in (ROOT / "bucketq" / "store" / "aio").glob("*.py") for m in raw_parameters(
        path.read_text(), path.stem)}
    assert found - set(TAKE_RAW) == set(), "store methods given a caller's filter or update (build it in the store)"
    assert set(TAKE_RAW) - found == set(), "listed in TAKE_RAW but gone (drop them from the list)"


def test_the_vocabulary_check_finds_a_planted_violation() -> None:
    collections = store_collections()
    assert {"buckets", "dead", "quarantine", "inbox", "control", "positions"} <= collections
    planted = ("async def stats(queue, store):\n"
               "    await queue._store.count_entries(queue._store.dead, {})\n"
               "    await store.update_fenced({'_id': 1}, update)\n"
               "    await getattr(store, 'dead').find({})\n"
               "    await store.holders(message_id)\n")
    assert raw_store_calls(planted, collections) == [
        (2, "count_entries", "the collection store.dead"), (2, "count_entries", "a dict literal"),
        (3, "update_fenced", "a dict literal"), (4, "getattr", "a store attribute picked by name")]
    planted = "class S:\n    async def drop(self, query: dict) -> None: ...\n    async def _own(self, query): ...\n"
    assert raw_parameters(planted, "queue_store") == {("queue_store", "drop")}
