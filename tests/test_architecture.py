"""The layering of the code, read from the source (``ast``: nothing is imported, so no import runs):

- ``bucketq/core`` is sans-I/O: it imports the standard library (not ``asyncio``), itself, ``bucketq.errors``,
  ``bson`` (BSON types and encoding), ``cronsim`` (pure-Python cron expressions, for schedules) and, of pymongo,
  only what does no I/O: ``pymongo.errors`` (the exceptions it classifies) and the write models of
  ``pymongo.operations`` (``UpdateOne``, ... that a plan hands its shell).
- ``bucketq/web`` imports nothing of ``bucketq/cli`` (both take their text views from ``bucketq.shell``).
- No folders import each other, directly or round a longer loop: each subpackage of ``bucketq``, ``bench``,
  ``devtools``, ``tests``, ``spark``, ``examples``. ``bucketq``'s top-level modules, the public face, are no
  folder: its subpackages serve them and use some (``bucketq.errors``, ``bucketq.codecs``).
- No module of ``bucketq`` imports itself back through others (a file-level loop).
- The machinery (``bucketq``'s subpackages but the CLI and the dashboard, which are built on the public face)
  imports of the public face only its vocabulary: the top-level modules that import nothing of the machinery but
  the sans-I/O core (``bucketq.errors``, ``bucketq.codecs``, ``bucketq.options``, ...), never ``bucketq.queue`` or
  another module built on the machinery.
- A feature goes by one name: a shell module with a core twin (``bucketq/shell/<stem>.py`` beside
  ``bucketq/core/<stem>.py``) has its tests in ``tests/test_<stem>.py``, but for the twins listed with a reason.

An import counts wherever it is written (in a function too) except under ``if TYPE_CHECKING:``, which never
runs. Each rule is checked on a synthetic violation too, so that it can fail.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("bucketq", "bench", "devtools", "tests", "spark", "examples")
SKIPPED = ("bench/.node", "spark/jars")  # installed or fetched files, not the project's code

CORE_PROJECT = ("bucketq.core", "bucketq.errors")
CORE_THIRD_PARTY = ("bson", "cronsim", "pymongo.errors", "pymongo.operations")
PYMONGO_WRITE_MODELS = frozenset({"InsertOne", "DeleteOne", "DeleteMany", "ReplaceOne", "UpdateOne", "UpdateMany"})
CORE_FORBIDDEN_STDLIB = frozenset({"asyncio"})
FACE_CLIENTS = ("bucketq.cli", "bucketq.web")  # subpackages built on the public face, as a user's code is
# shell/core twins whose tests are not in tests/test_<stem>.py, and why
TWINS_TESTED_ELSEWHERE = {
    "housekeeping": "a consumer's background round, tested with the consumers that share it (tests/test_idle.py, "
                    "test_consumer.py, test_guarantees.py)",
}


# -- reading imports -------------------------------------------------------------------------------------------

def module_name(path: Path, root: Path = ROOT) -> str:
    """``bucketq/core/format.py`` -> ``bucketq.core.format``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] == "spark":  # spark/ holds packages of its own (bucketq_spark, jobs), importable from there
        parts.pop(0)
    return ".".join(parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere but in the body of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _type_checking_only(node):
            for orelse in node.orelse:
                yield from _import_nodes(ast.Module(body=[orelse], type_ignores=[]))
            continue
        yield from _import_nodes(node)


@functools.cache  # each file is parsed once for all the rules
def imports(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of each import in ``source`` (of ``module``): ``import a.b`` gives ``("a.b", None)``,
    ``from a import b`` gives ``("a", "b")`` (``b`` may be a module or a name in ``a``). Relative imports are
    resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str, str | None]] = []
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        found += [(node.lineno, base, alias.name) for alias in node.names]
    return found


def source_files() -> dict[str, Path]:
    """Every Python module of the project by its dotted name."""
    files = {}
    for folder in TOP_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(SKIPPED):
                files[module_name(path)] = path
    return files


def read(path: Path, module: str) -> tuple[str, str, bool]:
    """``(source, module, is_package)``: what ``imports`` takes of a file."""
    return path.read_text(), module, path.name == "__init__.py"


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Which of the project's modules each one imports: ``from a import b`` is ``a.b`` when that is a module,
    else ``a``. The packages above a module are left out: importing one of their modules finds them started."""
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = set()
        source, _, is_package = read(path, module)
        for _, imported, name in imports(source, module, is_package=is_package):
            target = f"{imported}.{name}" if name and f"{imported}.{name}" in files else imported
            while target and target not in files:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target:
                targets.add(target)
        graph[module] = targets - {module}
    return graph


# -- the rules -------------------------------------------------------------------------------------------------

def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def core_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """What ``source`` (a module of ``bucketq.core``) imports that the sans-I/O core may not."""
    out = []
    for line, imported, name in imports(source, module, is_package=is_package):
        top = imported.split(".")[0]
        if top in CORE_FORBIDDEN_STDLIB:
            out.append(f"{module}:{line}: {imported} (no event loop in the core)")
        elif top in sys.stdlib_module_names or _within(imported, CORE_PROJECT + CORE_THIRD_PARTY):
            continue
        elif imported == "pymongo" and name in PYMONGO_WRITE_MODELS:
            continue
        else:
            out.append(f"{module}:{line}: {imported}{'.' + name if name else ''}")
    return out


def web_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """What ``source`` (a module of ``bucketq.web``) imports of the CLI."""
    found = [f"{module}:{line}: {imported}" for line, imported, name in imports(source, module, is_package=is_package)
             if _within(imported, ["bucketq.cli"]) or (imported == "bucketq" and name == "cli")]
    return list(dict.fromkeys(found))  # one line per statement, however many names it imports


def folder_of(module: str, root: Path = ROOT) -> str | None:
    """The folder a module lives in, as the layering counts them: a subpackage of ``bucketq``, else its top-level
    folder. None for ``bucketq``'s top-level modules: the public face, which its subpackages serve and use (the
    errors, the clock), belongs to no folder; the loops it could close are the module loops, checked apart."""
    parts = module.split(".")
    if parts[0] == "bucketq":
        return ".".join(parts[:2]) if len(parts) > 2 or (root / "bucketq" / parts[-1]).is_dir() else None
    if parts[0] in ("bucketq_spark", "jobs"):
        return "spark"
    return parts[0]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan): each holds an import loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def folder_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """Which folders (``folder_of``) the modules of each folder import."""
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folder = folder_of(module)
        if folder is not None:
            folders.setdefault(folder, set()).update(t for t in map(folder_of, targets) if t is not None)
    return {folder: targets - {folder} for folder, targets in folders.items()}


def upward_imports(graph: Mapping[str, Iterable[str]], root: Path = ROOT) -> list[str]:
    """``module -> face`` for each module of the machinery that imports a top-level module (the public face) which
    itself imports machinery with I/O (anything but ``bucketq.core``): the machinery reaching back up to what is
    built on it."""
    def machinery(module: str) -> bool:
        return module.startswith("bucketq.") and folder_of(module, root) not in (None, *FACE_CLIENTS)

    def face(module: str) -> bool:
        return module.startswith("bucketq.") and folder_of(module, root) is None

    built_on_machinery = {m for m, targets in graph.items()
                          if face(m) and any(machinery(t) and not _within(t, ["bucketq.core"]) for t in targets)}
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if machinery(m)
                  for t in set(targets) & built_on_machinery)


def twins_without_tests(package: Path, tests: Path) -> list[str]:
    """The stems of ``package/shell/<stem>.py`` that have a ``package/core/<stem>.py`` twin but no
    ``tests/test_<stem>.py``."""
    stems = {p.stem for p in (package / "shell").glob("*.py")} & {p.stem for p in (package / "core").glob("*.py")}
    return sorted(stem for stem in stems - {"__init__"} if not (tests / f"test_{stem}.py").is_file())


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return source_files()


@pytest.fixture(scope="module")
def graph(files: dict[str, Path]) -> dict[str, set[str]]:
    return import_graph(files)


# -- the checks ------------------------------------------------------------------------------------------------

def test_the_core_imports_no_event_loop_no_driver_io_and_nothing_outside_it(files: dict[str, Path]) -> None:
    core = {m: p for m, p in files.items() if _within(m, ["bucketq.core"])}
    assert len(core) > 10
    offenders = [v for module, path in core.items() for v in core_violations(*read(path, module))]
    assert not offenders, "bucketq/core imports what the sans-I/O core may not:\n" + "\n".join(offenders)


def test_the_dashboard_imports_nothing_of_the_cli(files: dict[str, Path]) -> None:
    web = {m: p for m, p in files.items() if _within(m, ["bucketq.web"])}
    assert len(web) > 3
    offenders = [v for module, path in web.items() for v in web_violations(*read(path, module))]
    assert not offenders, "bucketq/web imports bucketq/cli:\n" + "\n".join(offenders)


def test_no_folders_import_each_other(graph: dict[str, set[str]]) -> None:
    folders = folder_graph(graph)
    assert {"bucketq.core", "bucketq.cli", "bucketq.web", "bucketq.shell", "bench", "devtools", "tests",
            "spark"} <= set(folders)
    assert not cycles(folders), f"folders in an import loop: {cycles(folders)}"


def test_no_module_of_bucketq_imports_itself_back(graph: dict[str, set[str]]) -> None:
    ours = {m: {t for t in targets if _within(t, ["bucketq"])} for m, targets in graph.items()
            if _within(m, ["bucketq"])}
    assert not cycles(ours), f"modules of bucketq in an import loop: {cycles(ours)}"


def test_the_machinery_imports_only_the_vocabulary_of_the_public_face(graph: dict[str, set[str]]) -> None:
    offenders = upward_imports(graph)
    assert not offenders, "bucketq's subpackages import a public module built on them:\n" + "\n".join(offenders)


def test_each_shell_and_core_twin_has_the_test_file_of_its_name() -> None:
    missing = set(twins_without_tests(ROOT / "bucketq", ROOT / "tests"))
    assert missing <= set(TWINS_TESTED_ELSEWHERE), (
        f"shell/core twins without tests/test_<stem>.py (rename the tests, or list the twin with why): {missing}")
    assert set(TWINS_TESTED_ELSEWHERE) <= missing, "a listed twin has its test file now: drop it from the list"


# -- each rule can fail ----------------------------------------------------------------------------------------

def test_the_core_rule_finds_an_event_loop_a_driver_and_a_shell() -> None:
    allowed = ("import datetime as dt\nimport bson\nfrom bson import ObjectId\nfrom pymongo import UpdateOne\n"
               "from pymongo.errors import PyMongoError\nfrom bucketq.core.format import UTC\n"
               "from bucketq.errors import InvalidOption\nfrom . import claims\n")
    assert core_violations(allowed, "bucketq.core.example") == []
    bad = ("import asyncio\nfrom pymongo import AsyncMongoClient\nfrom pymongo.collection import Collection\n"
           "import motor\nfrom bucketq.queue import Queue\nfrom .. import clock\n"
           "def later():\n    from bucketq.store.aio import queue_store\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bucketq.queue import Queue\n")
    found = core_violations(bad, "bucketq.core.example")
    assert [v.split(": ", 1)[1].split(" ")[0] for v in found] == [
        "asyncio", "pymongo.AsyncMongoClient", "pymongo.collection.Collection", "motor", "bucketq.queue.Queue",
        "bucketq.clock", "bucketq.store.aio.queue_store"]


def test_the_web_rule_finds_an_import_of_the_cli() -> None:
    assert web_violations("from bucketq.shell.text_views import age\n", "bucketq.web.app") == []
    bad = "from bucketq.cli.output import age\nimport bucketq.cli.common\nfrom bucketq import cli\n"
    assert len(web_violations(bad, "bucketq.web.app")) == 3


def test_the_loop_rules_find_a_loop_of_folders_and_of_modules() -> None:
    modules = {"devtools.jars": {"bench.server"}, "bench.server": {"devtools.testserver"},
               "devtools.testserver": set(), "bucketq.web.app": {"bucketq.cli.common"},
               "bucketq.cli.web": {"bucketq.web"}, "bucketq.web": set(), "bucketq.cli.common": set()}
    assert cycles(folder_graph(modules)) == [["bench", "devtools"], ["bucketq.cli", "bucketq.web"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_upward_rule_finds_the_machinery_importing_the_queue(tmp_path: Path) -> None:
    for name in ("bucketq/shell/text_views.py", "bucketq/shell/clock.py", "bucketq/core/format.py",
                 "bucketq/cli/common.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    graph = {"bucketq.queue": {"bucketq.shell.clock", "bucketq.errors"}, "bucketq.errors": set(),
             "bucketq.codecs": {"bucketq.core.format"}, "bucketq.shell.clock": {"bucketq.errors", "bucketq.codecs"},
             "bucketq.shell.text_views": {"bucketq.queue"}, "bucketq.core.format": {"bucketq.errors"},
             "bucketq.cli.common": {"bucketq.queue"}}
    assert upward_imports(graph, tmp_path) == ["bucketq.shell.text_views -> bucketq.queue"]


def test_the_graph_reads_relative_and_lazy_imports_and_skips_type_checking_ones(tmp_path: Path) -> None:
    sources = {"__init__.py": "", "web/__init__.py": "from .app import create\n",
               "web/app.py": "def create():\n    from bucketq.cli import common\n",
               "cli/__init__.py": "", "cli/common.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                       "    from bucketq.web.app import create\n"}
    for name, source in sources.items():
        (tmp_path / "bucketq" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "bucketq" / name).write_text(source)
    files = {module_name(p, tmp_path): p for p in sorted(tmp_path.rglob("*.py"))}
    assert import_graph(files) == {"bucketq": set(), "bucketq.web": {"bucketq.web.app"},
                                   "bucketq.web.app": {"bucketq.cli.common"}, "bucketq.cli": set(),
                                   "bucketq.cli.common": set()}


def test_the_twin_rule_finds_a_twin_without_its_test_file(tmp_path: Path) -> None:
    for name in ("bucketq/shell/__init__.py", "bucketq/core/__init__.py", "bucketq/shell/cancel.py",
                 "bucketq/core/cancel.py", "bucketq/shell/clock.py", "bucketq/core/claims.py", "bucketq/shell/fees.py",
                 "bucketq/core/fees.py", "tests/test_cancel.py", "tests/test_clock.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert twins_without_tests(tmp_path / "bucketq", tmp_path / "tests") == ["fees"]
