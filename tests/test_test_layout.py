"""How the test suite is laid out, read from its source (``ast``; no import, no server): a test module imports no
other test module and no file's private name (what tests share lives in helper modules: ``tests/helpers.py``,
``tests/cli_runner.py``...), and the modules a test runs in another process by name (``python -m tests.X``, a
worker's ``tests.X:HANDLER``) are in ``tests/entrypoints/``. Each rule is also run on a planted violation."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINTS = "tests.entrypoints"
# Run by name by a test but not an entry point of it: the stress harness, a tool with a folder of its own that
# `make stress` runs (test_stress_small.py runs it small).
HARNESSES = frozenset({"tests.stress"})


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at ``path`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(root: Path) -> list[Path]:
    return sorted((root / "tests").rglob("*.py"))


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for all the rules."""
    return ast.parse(path.read_text(), str(path))


def imported(root: Path, path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) of each import in ``path``: ``name`` is None for ``import module``; ``from package
    import module`` gives the package and the module's name; relative imports are resolved."""
    own = module_name(root, path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            yield from ((node.lineno, base, alias.name) for alias in node.names)


def is_test_module(name: str) -> bool:
    return name.split(".")[0] == "tests" and name.rsplit(".", 1)[-1].startswith("test_")


def imports_of_test_modules(root: Path) -> list[str]:
    """``file:line module`` of each import of a test module (``tests/**/test_*.py``), from any file under tests/."""
    found = []
    for path in python_files(root):
        for line, module, name in imported(root, path):
            if is_test_module(module) or (name is not None and is_test_module(f"{module}.{name}")):
                found.append(f"{path.relative_to(root)}:{line} {module}{'' if name is None else f'.{name}'}")
    return found


def private_imports(root: Path) -> list[str]:
    """``file:line module.name`` of each ``_name`` imported from another module under tests/."""
    return [f"{path.relative_to(root)}:{line} {module}.{name}" for path in python_files(root)
            for line, module, name in imported(root, path)
            if module.split(".")[0] == "tests" and name is not None and name.startswith("_")]


def named_module(root: Path, text: str) -> str | None:
    """The module under tests/ that ``text`` names by its import path (``tests.X`` or ``tests.X:NAME``), if any."""
    name = text.split(":", 1)[0]
    if not name.startswith("tests.") or not all(part.isidentifier() for part in name.split(".")):
        return None
    path = root.joinpath(*name.split("."))
    return name if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() else None


def strings(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants of ``tree`` but its docstrings (which may name a command without running it)."""
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return (node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings)


def plugins(root: Path) -> set[str]:
    """The suite's pytest plugins, as tests/conftest.py lists them: loaded by name (``-p``) as well, not run."""
    tree = parsed(root / "tests" / "conftest.py")
    return {node.value for assign in ast.walk(tree) if isinstance(assign, ast.Assign)
            and any(isinstance(target, ast.Name) and target.id == "pytest_plugins" for target in assign.targets)
            for node in strings(assign.value)}


def run_by_name_outside_entrypoints(root: Path) -> list[str]:
    """``file:line module`` of each module under tests/ that a test file names to run (``-m``, ``MODULE:NAME``,
    ``race_processes``) and that is not in tests/entrypoints/, the suite's plugins or the stress harness."""
    allowed = plugins(root) | HARNESSES
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        for node in sorted(strings(parsed(path)), key=lambda node: node.lineno):
            module = named_module(root, node.value)
            if module is not None and module not in allowed and module.split(".")[:2] != ENTRYPOINTS.split("."):
                found.append(f"{path.relative_to(root)}:{node.lineno} {module}")
    return found


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules(ROOT) == [], "move what they share into a helper module (tests/helpers.py, ...)"


def test_no_private_name_is_imported_across_files() -> None:
    assert private_imports(ROOT) == [], "make the name public, in a helper module, or keep it in its file"


def test_only_entrypoints_are_run_by_name() -> None:
    assert run_by_name_outside_entrypoints(ROOT) == [], f"move the module into {ENTRYPOINTS.replace('.', '/')}/"


def planted(tmp_path: Path, files: dict[str, str]) -> Path:
    """A checkout under ``tmp_path`` holding ``files`` ({path: source}) and an empty tests/conftest.py."""
    for name, source in {"tests/__init__.py": "", "tests/conftest.py": "", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    return tmp_path


def test_the_import_rule_finds_a_test_module_imported(tmp_path: Path) -> None:
    root = planted(tmp_path, {
        "tests/test_a.py": "from tests.test_b import shared\nfrom tests.helpers import fine\n",
        "tests/test_c.py": "from tests import test_b\nimport tests.test_b\n",
        "tests/spark/__init__.py": "", "tests/spark/test_d.py": "from .test_e import shared\nfrom ..helpers import x\n",
        "tests/helpers.py": "import tests.test_b\n",
    })
    assert imports_of_test_modules(root) == [
        "tests/helpers.py:1 tests.test_b", "tests/spark/test_d.py:1 tests.spark.test_e.shared",
        "tests/test_a.py:1 tests.test_b.shared", "tests/test_c.py:1 tests.test_b", "tests/test_c.py:2 tests.test_b"]


def test_the_private_rule_finds_a_private_name_imported(tmp_path: Path) -> None:
    root = planted(tmp_path, {
        "tests/test_a.py": "from tests.helpers import _drain, public\nfrom os import _exit\n",
        "tests/spark/__init__.py": "", "tests/spark/test_b.py": "from ..clock import _real\n",
    })
    assert private_imports(root) == ["tests/spark/test_b.py:1 tests.clock._real",
                                     "tests/test_a.py:1 tests.helpers._drain"]


def test_the_entrypoint_rule_finds_a_module_run_from_among_the_tests(tmp_path: Path) -> None:
    root = planted(tmp_path, {
        "tests/conftest.py": 'pytest_plugins = ["tests.watchdog"]\n',
        "tests/watchdog.py": "", "tests/proc.py": "", "tests/handlers.py": "",
        "tests/entrypoints/__init__.py": "", "tests/entrypoints/ok_proc.py": "",
        "tests/stress/__init__.py": "", "tests/stress/__main__.py": "",
        "tests/test_a.py": '"""Runs ``python -m tests.proc``."""\nimport sys\n'
                           'ARGV = [sys.executable, "-m", "tests.proc"]\n'
                           'WORKER = ["worker", "tests.handlers:record", "tests.missing:f"]\n'
                           'FINE = ["-m", "tests.entrypoints.ok_proc", "-p", "tests.watchdog", "-m", "tests.stress"]\n',
    })
    assert run_by_name_outside_entrypoints(root) == ["tests/test_a.py:3 tests.proc", "tests/test_a.py:4 tests.handlers"]
