"""The house's import contracts, read from the source (no database): the
floors of docs/architecture.md hold as the code imports them.

- only ``engines/`` imports a database driver;
- the engines import, of the rest of expiry, only the model modules;
- the App and the faces (the CLI, the HTTP API and dashboard, the read models
  they share) are imported by the faces alone: no service imports them back;
- the module-level imports have no circle.

A new import that breaks one fails here with the module and the line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "expiry"
"""Read as files, not imported: a circle that breaks the import still shows here."""

DRIVERS = {"psycopg", "psycopg_pool", "pymysql", "sqlite3", "MySQLdb", "mysql", "asyncpg"}
"""The database drivers a module could import."""

DRIVER_OUTSIDE_ENGINES = {
    # The demo builds the user's demo SQLite database (its tables and rows)
    # before expiry cleans it through the engine: the application's part.
    "expiry.cli.demo",
}

MODEL = {"expiry.defaults", "expiry.errors", "expiry.types", "expiry.timestamps"}
"""What the engines may import from the rest of expiry: the closed, typed seam
and what it speaks (timestamps: the stored formats an engine reads back)."""

FACES = ("expiry.cli", "expiry.http", "expiry.status", "expiry.__main__")
"""The floor above the App: what users run and read. ``expiry`` itself (the
package's ``__init__``) re-exports the App for the Python API."""

ABOVE_SERVICES = ("expiry.app", *FACES)

FLOORS: list[tuple[str, ...]] = [
    # the model: plain data, errors, defaults and pure helpers
    (
        "expiry.types",
        "expiry.errors",
        "expiry.defaults",
        "expiry.times",
        "expiry.timestamps",
        "expiry.crontab",
        "expiry.log",
        "expiry.signals",
    ),
    ("expiry.engines",),
    ("expiry.config", "expiry.keys"),
    ("expiry.queue",),
    ("expiry.cleanup",),
    ("expiry.health",),
    ("expiry.cron",),
    ("expiry.app",),
    FACES,
]
"""The floors of the house, from the bottom: the folders of ``src/expiry`` and
the modules at its top. A module imports its own floor and those below."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def exists(name: str) -> bool:
    relative = Path(*name.split("."))
    return (SRC.parent / relative).with_suffix(".py").exists() or (
        SRC.parent / relative / "__init__.py"
    ).exists()


def in_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def runtime(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes run when the module is imported: not the bodies of functions,
    nor ``if TYPE_CHECKING`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(child, ast.If) and in_type_checking(child):
            yield from (n for other in child.orelse for n in [other, *runtime(other)])
            continue
        yield child
        yield from runtime(child)


def imports(path: Path, *, runtime_only: bool = False) -> Iterator[tuple[str, int]]:
    """(module imported, line) for each import of the file; ``runtime_only``
    leaves out those under ``if TYPE_CHECKING`` and inside functions."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    nodes = list(runtime(tree) if runtime_only else ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # from . import roll: the module roll
                if exists(f"{target}.{alias.name}"):
                    yield f"{target}.{alias.name}", node.lineno


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def under(name: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_only_the_engines_import_a_database_driver() -> None:
    found = [
        f"{module_name(path)}:{line} imports {target}"
        for path in sources()
        for target, line in imports(path)
        if target.split(".")[0] in DRIVERS
        and not under(module_name(path), ("expiry.engines",))
        and module_name(path) not in DRIVER_OUTSIDE_ENGINES
    ]
    assert found == []


def test_the_engines_import_only_the_model_of_the_rest() -> None:
    found = [
        f"{module_name(path)}:{line} imports {target}"
        for path in sources()
        if under(module_name(path), ("expiry.engines",))
        for target, line in imports(path)
        if under(target, ("expiry",)) and not under(target, ("expiry.engines", *MODEL))
    ]
    assert found == []


def test_no_service_imports_the_app_or_a_face() -> None:
    """The App wires the services together; the faces call it. A service that
    imported either would climb back up the floors."""
    found = [
        f"{module_name(path)}:{line} imports {target}"
        for path in sources()
        if not under(module_name(path), ABOVE_SERVICES) and module_name(path) != "expiry"
        for target, line in imports(path)
        if under(target, ABOVE_SERVICES)
    ]
    assert found == []


def floor(name: str) -> int | None:
    return next((i for i, names in enumerate(FLOORS) if under(name, names)), None)


def test_every_module_stands_on_a_floor() -> None:
    assert [module_name(p) for p in sources() if floor(module_name(p)) is None] == ["expiry"]


def test_the_floors_import_only_down() -> None:
    """A folder is a floor: a module of the queue imports nothing of cleanup,
    cleanup nothing of cron, and so on up; ``from .. import defaults`` names
    the model module, not the package above."""
    found = [
        f"{module_name(path)}:{line} imports {target}"
        for path in sources()
        if (here := floor(module_name(path))) is not None
        for target, line in imports(path)
        if target != "expiry" and (there := floor(target)) is not None and there > here
    ]
    assert found == []


def test_the_module_level_imports_have_no_circle() -> None:
    graph = {
        module_name(path): {
            target
            for target, _ in imports(path, runtime_only=True)
            if under(target, ("expiry",)) and target != module_name(path) and exists(target)
        }
        for path in sources()
    }
    # A package's __init__ importing its own modules is how packages work: leave
    # the edge from a module to the package that holds it out.
    for name, targets in graph.items():
        targets -= {t for t in targets if name.startswith(t + ".")}
    circles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_the_contracts_see_the_imports_they_govern() -> None:
    """The reader works: it finds the engines' driver imports and the faces'
    imports of the App (a reader that found nothing would pass every test)."""
    postgres = SRC / "engines" / "postgres" / "engine.py"
    assert "psycopg" in {t for t, _ in imports(postgres)}
    cli = SRC / "cli" / "opening.py"
    assert "expiry.app" in {t for t, _ in imports(cli)}
    status = SRC / "status.py"
    assert "expiry.health.roll" in {t for t, _ in imports(status)}
    worker = SRC / "queue" / "worker.py"
    assert floor("expiry.queue.worker") == FLOORS.index(("expiry.queue",))
    assert "expiry.signals" in {t for t, _ in imports(worker)}


SCHEMES = ("postgresql:", "postgres:", "mysql:", "mariadb:", "sqlite:")


def dialect_questions(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) for each place a module asks which database it is on: a
    comparison with ``.dialect``, or a URL's scheme read by ``startswith``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "dialect" for s in sides):
                yield node.lineno, "compares .dialect"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
        ):
            texts = [c.value for a in node.args for c in ast.walk(a) if isinstance(c, ast.Constant)]
            if any(isinstance(t, str) and t.startswith(SCHEMES) for t in texts):
                yield node.lineno, "reads a URL's scheme"


def test_only_the_engines_ask_which_database_they_are_on() -> None:
    """What differs by database is a capability of the engine (engines/kinds.py,
    the Engine's attributes), asked by name: ``engine.kind.embedded``, not
    ``engine.dialect == "sqlite"``."""
    found = [
        f"{module_name(path)}:{line} {what}"
        for path in sources()
        if not under(module_name(path), ("expiry.engines",))
        for line, what in dialect_questions(path)
    ]
    assert found == []


def test_the_dialect_reader_sees_a_dialect_question(tmp_path: Path) -> None:
    """The reader works: both kinds of question, as they were asked before the
    engines answered them (app.py, config/)."""
    asked = tmp_path / "asked.py"
    asked.write_text(
        "def embedded(engine, url):\n"
        '    return engine.dialect == "sqlite" or url.startswith(("sqlite:///", "x"))\n'
    )
    assert sorted(what for _, what in dialect_questions(asked)) == [
        "compares .dialect",
        "reads a URL's scheme",
    ]
