"""``devtools/unasync.py``: the synchronous store is generated from the async one, and is current."""

from __future__ import annotations

from devtools import unasync

ASYNC = '''import asyncio  # async-only
from collections.abc import Awaitable, Callable

# async-only: begin
async def watch(collection):
    return await collection.watch([])


# async-only: end
async def first(store: AsyncQueueStore, op: Callable[[], Awaitable[int]]) -> int:
    async with store.lock:
        async for doc in store.buckets.find({}):
            await asyncio.sleep(0.1)
            return await op()
    # sync: import threading
'''

SYNC = '''from collections.abc import Callable

def first(store: QueueStore, op: Callable[[], int]) -> int:
    with store.lock:
        for doc in store.buckets.find({}):
            time.sleep(0.1)
            return op()
    import threading
'''


def test_the_rewriting_rules() -> None:
    assert unasync.unasync(ASYNC) == SYNC


def test_strings_and_comments_are_copied_as_written_and_f_strings_rewritten() -> None:
    source = ('"""``AsyncQueueStore``: ``bucketq.store.aio`` is the source; await nothing."""\n'
              'async def f(store: AsyncQueueStore) -> str:  # async def, AsyncQueueStore\n'
              '    return f"{await store.name()} of AsyncX" + "asyncio.sleep"\n')
    assert unasync.unasync(source) == (
        '"""``AsyncQueueStore``: ``bucketq.store.aio`` is the source; await nothing."""\n'
        'def f(store: QueueStore) -> str:  # async def, AsyncQueueStore\n'
        '    return f"{store.name()} of X" + "asyncio.sleep"\n')


def test_the_generated_docstrings_say_where_they_come_from() -> None:
    """The generated package's docstring names the async source as the source, not itself."""
    text = unasync.generated()[unasync.TARGET / "__init__.py"]
    assert "``bucketq.store.aio`` is their source" in text and "``bucketq.store.sync`` is their source" not in text


def test_the_generated_sync_store_is_current() -> None:
    expected = unasync.generated()
    assert {path.name for path in expected} == {"__init__.py", "base.py", "queue_store.py", "stream_store.py"}
    for path, text in expected.items():
        assert path.read_text() == text, f"{path} is stale: run `python -m devtools.unasync`"
        assert text.startswith("# Generated from bucketq/store/aio/")
    assert unasync.main(["--check"]) == 0
