"""The named queries and the code that runs them agree, read from the source
(no database): a typo in a query name fails here, not at run time.

- every engine's ``queries/*.sql`` name the same queries, except the few that only
  one dialect needs (listed below, with the reason);
- every name the engine code runs (``self._rows(conn, "name")``, ``_run``,
  ``_one``, ``_tx_rows``, ``self.queries["name"]``) is a literal that exists in
  the ``queries/*.sql`` of each engine that runs it;
- every query in a ``queries/*.sql`` is run by the engine code;
- nothing outside ``engines/`` runs a named query or reads a stored time itself;
- every engine method that runs one of these queries has a conformance test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import expiry
from expiry.engines import Engine
from expiry.engines.common import load_queries
from expiry.errors import MigrationError

SRC = Path(expiry.__file__).parent
ENGINES = SRC / "engines"
TESTS = Path(__file__).parent

RUNNERS = {"_rows", "_run", "_one", "_tx_rows"}
"""The engine's private runners of a named query: (conn, name, params)."""
PRIVATE = RUNNERS | {"_time", "_maybe_time", "queries"}
"""What only engines/ may touch on an engine."""

DIALECT_ONLY = {
    # pg_notify hints listeners of new jobs; SQLite has no NOTIFY and polls.
    # job_complete_strict raises LeaseLost in the server, so that a job's
    # completion can travel with its COMMIT (pipeline mode); the others read
    # job_complete's answer before they commit.
    "postgres": {"job_notify", "job_complete_strict"},
    # SQLite merges each queue's due jobs in Python before claiming (one writer,
    # no SKIP LOCKED); PostgreSQL claims in one statement.
    "sqlite": {"job_due"},
    # MySQL has no INSERT ... RETURNING nor ON CONFLICT DO NOTHING: an enqueue
    # reads the keys queued already and inserts the rest; a claim counts (fair
    # share) and locks each queue's due jobs before leasing them.
    "mysql": {"job_existing", "job_due", "job_due_count"},
}


def queries(dialect: str) -> dict[str, str]:
    return load_queries(f"expiry.engines.{dialect}")


def names_run(path: Path) -> set[str]:
    """The query names a module's code runs."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in RUNNERS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    found.add(name.value)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "queries"
            and isinstance(node.slice, ast.Constant)
        ):
            found.add(str(node.slice.value))
    return found


SEAM = sorted((ENGINES / "seam").glob("*.py"))
"""The seam's parts (engines/base.py composes them): the queries every engine runs."""
BASE = set().union(*(names_run(path) for path in SEAM))
OWN = {dialect: names_run(ENGINES / dialect / "engine.py") for dialect in DIALECT_ONLY}


@pytest.mark.parametrize("dialect", sorted(DIALECT_ONLY))
def test_each_query_has_a_name_and_an_intent_line(dialect: str) -> None:
    for name, body in queries(dialect).items():
        assert body.startswith("-- "), f"{dialect} query {name}: no intent line"
        assert body.split("\n", 1)[1].strip(), f"{dialect} query {name}: no SQL"


def test_every_engine_names_the_same_queries() -> None:
    named = {dialect: set(queries(dialect)) for dialect in DIALECT_ONLY}
    for dialect, own in DIALECT_ONLY.items():
        assert own <= named[dialect], f"{dialect}: {own - named[dialect]}"
    common = {dialect: named[dialect] - DIALECT_ONLY[dialect] for dialect in DIALECT_ONLY}
    assert common["postgres"] == common["sqlite"] == common["mysql"]


def test_every_query_the_seam_runs_exists_in_every_engine() -> None:
    assert BASE, "no named query found in engines/seam/: is the scan broken?"
    for dialect in DIALECT_ONLY:
        missing = BASE - set(queries(dialect))
        assert not missing, f"engines/seam/ runs queries missing in {dialect}: {missing}"


@pytest.mark.parametrize("dialect", sorted(DIALECT_ONLY))
def test_every_query_an_engine_runs_exists_in_its_queries_sql(dialect: str) -> None:
    missing = OWN[dialect] - set(queries(dialect))
    assert not missing, f"engines/{dialect}/engine.py runs unknown queries: {missing}"


@pytest.mark.parametrize("dialect", sorted(DIALECT_ONLY))
def test_every_query_in_queries_sql_is_run(dialect: str) -> None:
    unused = set(queries(dialect)) - BASE - OWN[dialect]
    assert not unused, f"engines/{dialect}/queries/ has queries nothing runs: {unused}"


def test_query_names_are_literals() -> None:
    """A name built at run time would escape the checks above: only the runners
    themselves pass a name on."""
    for path in [*SEAM, *(ENGINES / d / "engine.py" for d in DIALECT_ONLY)]:
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef) or func.name in RUNNERS:
                continue
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in RUNNERS
                ):
                    name = node.args[1] if len(node.args) >= 2 else None
                    assert isinstance(name, ast.Constant), (
                        f"{path.name}:{node.lineno} ({func.name}) runs a query by a computed name"
                    )


def test_nothing_outside_engines_runs_a_query_or_reads_a_stored_time() -> None:
    """``engine._rows(conn, "name")`` and the like stay inside engines/: the rest
    of expiry calls the typed methods."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if ENGINES in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or node.attr not in PRIVATE | {"rows", "one"}:
                continue
            owner = node.value
            named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if named in ("engine", "_engine"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert found == []


def test_every_engine_method_of_a_named_query_has_a_conformance_test() -> None:
    """Jobs are covered by tests/queue/test_conformance.py; every other method named
    after a query is called by a test in tests/engines/."""
    names = set(queries("postgres")) | set(queries("sqlite"))
    methods = {
        name
        for name in dir(Engine)
        if name in names and not name.startswith("job_") and callable(getattr(Engine, name))
    }
    assert {"run_insert", "schedule_advance", "cron_calls", "key_active"} <= methods
    tested = "\n".join(p.read_text() for p in TESTS.glob("test_conformance_*.py"))
    untested = sorted(m for m in methods if f"engine.{m}(" not in tested)
    assert untested == []


def test_a_query_named_in_two_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine's queries are one file a noun: the same name in two of them
    would leave one silently unused, so loading refuses it."""
    package = tmp_path / "twice_named"
    (package / "queries").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "queries" / "jobs.sql").write_text("-- name: now\n-- One.\nselect 1;\n")
    (package / "queries" / "runs.sql").write_text("-- name: now\n-- Two.\nselect 2;\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MigrationError, match="'now' is named twice"):
        load_queries("twice_named")
