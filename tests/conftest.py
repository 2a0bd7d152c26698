"""Test databases: real PostgreSQL, real MariaDB (or MySQL) and real SQLite
files, fresh for every test.

PostgreSQL comes from EXPIRY_TEST_POSTGRES_URL (default: the local server). Each
test gets its own database cloned from a template migrated once per session,
and dropped afterwards. MariaDB comes from EXPIRY_TEST_MYSQL_URL (default:
root on the local server); each test gets a database of its own, migrated, and
dropped afterwards. A missing server fails the run; it is never skipped.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pymysql
import pytest
from psycopg.conninfo import conninfo_to_dict

from dialects import DIALECTS
from expiry.app import App
from expiry.engines import Engine, open_engine

ADMIN_URL = os.environ.get(
    "EXPIRY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_URL = os.environ.get("EXPIRY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
_counter = itertools.count()
_PREFIX = f"expiry_test_{os.getpid()}"


def _url_for(dbname: str) -> str:
    params = conninfo_to_dict(ADMIN_URL)
    params["dbname"] = dbname
    return _as_url(params)


def _as_url(params: dict[str, object]) -> str:
    user = params.get("user", "postgres")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", 5432)
    password = params.get("password")
    auth = f"{user}:{password}@" if password else f"{user}@"
    return f"postgresql://{auth}{host}:{port}/{params['dbname']}"


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:  # fail loudly: never skip
        pytest.fail(f"PostgreSQL is required for the tests ({ADMIN_URL}): {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"{_PREFIX}_template"
    with _admin() as admin:
        admin.execute(f'drop database if exists "{name}"')
        admin.execute(f'create database "{name}"')
    engine = open_engine(_url_for(name))
    engine.migrate()
    engine.close()
    yield name
    with _admin() as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"{_PREFIX}_{next(_counter)}"
    with _admin() as admin:
        admin.execute(f'create database "{name}" template "{pg_template}"')
    yield _url_for(name)
    with _admin() as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def bare_pg_url() -> Iterator[str]:
    """An empty PostgreSQL database: expiry was never migrated there."""
    name = f"{_PREFIX}_{next(_counter)}"
    with _admin() as admin:
        admin.execute(f'create database "{name}"')
    yield _url_for(name)
    with _admin() as admin:
        admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh, migrated SQLite file for one test."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = open_engine(url)
    engine.migrate()
    engine.close()
    return url


def mysql_admin() -> pymysql.connections.Connection:
    """A connection to the MariaDB server with no database chosen."""
    from expiry.engines.mysql.sessions import parse_url

    params = parse_url(MYSQL_URL.rstrip("/") + "/mysql")
    params.pop("database")
    try:
        return pymysql.connect(**params, autocommit=True, connect_timeout=5)
    except pymysql.err.OperationalError as exc:  # fail loudly: never skip
        pytest.fail(f"MariaDB is required for the tests ({MYSQL_URL}): {exc}", pytrace=False)


def mysql_url_for(name: str) -> str:
    return MYSQL_URL.rstrip("/") + "/" + name


@pytest.fixture
def bare_mysql_url() -> Iterator[str]:
    """An empty MariaDB database: expiry was never migrated there."""
    name = f"{_PREFIX}_{next(_counter)}"
    admin = mysql_admin()
    with admin.cursor() as cur:
        cur.execute(f"drop database if exists `{name}`")
        cur.execute(f"create database `{name}`")
    yield mysql_url_for(name)
    with admin.cursor() as cur:
        cur.execute(f"drop database if exists `{name}`")
    admin.close()


@pytest.fixture
def mysql_url(bare_mysql_url: str) -> str:
    """A fresh, migrated MariaDB database for one test."""
    engine = open_engine(bare_mysql_url)
    engine.migrate()
    engine.close()
    return bare_mysql_url


ENGINES = list(DIALECTS)
_FIXTURES = {"sqlite": "sqlite_url", "postgres": "pg_url", "mysql": "mysql_url"}


@pytest.fixture(params=ENGINES)
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes db_url runs once per engine: the conformance suite."""
    return str(request.getfixturevalue(_FIXTURES[request.param]))


@pytest.fixture
def another_db_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A second empty database on the same server as db_url (SQLite: another
    file): what another application on the server would hold."""
    name = f"{_PREFIX}_{next(_counter)}"
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'another.db'}"
    elif db_url.startswith("postgres"):
        with _admin() as admin:
            admin.execute(f'create database "{name}"')
        yield _url_for(name)
        with _admin() as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')
    else:
        admin = mysql_admin()
        with admin.cursor() as cur:
            cur.execute(f"create database `{name}`")
        yield mysql_url_for(name)
        with admin.cursor() as cur:
            cur.execute(f"drop database if exists `{name}`")
        admin.close()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = open_engine(db_url)
    yield eng
    eng.close()


@pytest.fixture
def app(db_url: str) -> Iterator[App]:
    application = App(db_url)
    yield application
    application.close()


ENGINE_FIXTURES = {
    "postgres": {"pg_url", "bare_pg_url", "pg_template", "pg_db", "pg_live", "pg_engine"},
    "mysql": {"mysql_url", "bare_mysql_url", "mysql_db"},
    "sqlite": {"sqlite_url", "sqlite_db", "sqlite_live"},
}
"""The fixtures that put a test on one engine."""


DRILLS = ("drills", "bench")
"""The folders of tests marked ``drill``: the failure drills (they kill and
restart real processes and servers) and the benchmarks' short forms, a minute
or two each. ``make test`` leaves them to ``make drills``; CI runs both."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the engines it talks to (``-m postgres`` selects every
    PostgreSQL test, its id naming the engine or not): from the engine fixtures
    it uses and the engine its parameters name (``db_url[postgres]``). A test
    under tests/drills or tests/bench is marked ``drill`` as well."""
    here = Path(__file__).parent
    for item in items:
        if Path(item.path).relative_to(here).parts[0] in DRILLS:
            item.add_marker(pytest.mark.drill)
        used = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        named = {str(v) for v in callspec.params.values()} if callspec is not None else set()
        for engine, fixtures in ENGINE_FIXTURES.items():
            if engine in named or (
                used & fixtures and not named & (set(ENGINE_FIXTURES) - {engine})
            ):
                item.add_marker(getattr(pytest.mark, engine))
