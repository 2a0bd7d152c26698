"""Policies are checked against the live schema before anything runs: a table,
column or predicate that does not fit is a SchemaError naming the policy; a
timestamp column without an index is a warning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from expiry.app import App
from expiry.errors import SchemaError

from ._support import Db, cli, doomed, run_worker, standard_rows, write_config

Apps = Callable[..., App]


def check_fails(app: App) -> str:
    assert app.cleanup is not None
    with pytest.raises(SchemaError) as caught:
        app.cleanup.check()
    return str(caught.value)


def test_a_fitting_policy_checks_clean(db: Db, apps: Apps) -> None:
    db.create_sessions()
    app = apps(db.url)
    assert app.cleanup is not None
    assert app.cleanup.check() == []


def test_missing_table(db: Db, apps: Apps) -> None:
    message = check_fails(apps(db.url))
    assert "policy 'expired-sessions'" in message
    assert "table 'sessions' does not exist" in message
    assert "create it, or correct 'table'" in message


def test_missing_table_also_stops_a_run(db: Db, apps: Apps) -> None:
    app = apps(db.url)
    assert app.cleanup is not None
    with pytest.raises(SchemaError, match="'sessions' does not exist"):
        app.cleanup.open_run("expired-sessions")
    assert db.expiry_counts()["runs"] == 0


@pytest.mark.parametrize("field", ["key", "timestamp"])
def test_missing_column(db: Db, apps: Apps, field: str) -> None:
    db.create_sessions()
    message = check_fails(apps(db.url, {field: "no_such_column"}))
    assert "policy 'expired-sessions'" in message
    assert f"{field} column 'no_such_column' is not in table 'sessions'" in message
    assert "columns: id, user_id, expires_at" in message


@pytest.mark.parametrize("key_type", ["text", "numeric", "real", "interval"])
def test_a_non_integer_key_gets_time_windows_and_refuses_key_windows(
    db: Db, apps: Apps, key_type: str
) -> None:
    if key_type == "interval" and db.dialect == "sqlite":
        key_type = "blob"
    declared = key_type
    if db.dialect == "mysql":  # MySQL's names: its types as information_schema writes them
        key_type, declared = {
            "text": ("text", "text"),
            "numeric": ("numeric", "decimal(10,0)"),
            "real": ("real", "double"),
            "interval": ("time", "time"),
        }[key_type]
    ts = "datetime" if db.dialect == "mysql" else "timestamp"
    db.execute(f"create table sessions (id {key_type}, expires_at {ts}, revoked_at {ts})")
    app = apps(db.url)
    assert app.cleanup is not None
    app.cleanup.check()
    [strategy, *_] = app.cleanup.target("expired-sessions").notes
    assert strategy.lower().startswith(
        f"time windows: key column 'id' is {declared}, not an integer"
    )
    message = check_fails(apps(db.url, {"windows": "key"}))
    assert "policy 'expired-sessions'" in message
    assert 'windows = "key" needs an integer key' in message
    assert 'windows = "time"' in message  # the fix


@pytest.mark.parametrize("key_type", ["smallint", "integer", "bigint"])
def test_integer_keys_are_accepted(db: Db, apps: Apps, key_type: str) -> None:
    ts = db.time_type
    db.execute(f"create table sessions (id {key_type}, expires_at {ts}, revoked_at {ts})")
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    app = apps(db.url)
    assert app.cleanup is not None
    assert app.cleanup.check() == []


def test_timestamp_of_the_wrong_type_on_postgres(pg_db: Db, apps: Apps) -> None:
    pg_db.execute("create table sessions (id bigint primary key, expires_at text, revoked_at text)")
    message = check_fails(apps(pg_db.url))
    assert "policy 'expired-sessions'" in message
    assert "timestamp column 'expires_at' is text" in message
    assert "store time as timestamptz, timestamp or date" in message


@pytest.mark.parametrize(
    "where", ["no_such_column is null", "revoked_at is", "revoked_at + 'x' = (select"]
)
def test_invalid_where_is_refused_by_explain(db: Db, apps: Apps, where: str) -> None:
    db.create_sessions()
    message = check_fails(apps(db.url, {"where": where}))
    assert "policy 'expired-sessions'" in message
    assert f"where = {where!r} is not a valid predicate on 'sessions'" in message
    assert "\n" not in message


def test_where_with_a_percent_sign_checks_and_runs(db: Db, apps: Apps) -> None:
    """'%' is escaped for the driver; the check and the run must both undo it."""
    db.create_sessions()
    rows = standard_rows(200)
    db.insert_sessions(rows)
    app = apps(db.url, {"where": "revoked_at is null and id % 2 = 0"})
    assert app.cleanup is not None
    assert app.cleanup.check() == []
    app.cleanup.open_run("expired-sessions")
    run_worker(app)
    gone = {i for i in doomed(rows) if i % 2 == 0}
    assert db.ids() == {i for i, _, _ in rows} - gone


def test_missing_archive_table(db: Db, apps: Apps) -> None:
    db.create_sessions()
    message = check_fails(apps(db.url, {"action": "archive", "archive_table": "sessions_archive"}))
    assert "policy 'expired-sessions'" in message
    assert "archive_table 'sessions_archive' does not exist" in message


def test_archive_table_lacking_columns(db: Db, apps: Apps) -> None:
    db.create_sessions()
    db.execute("create table sessions_archive (id bigint, expires_at timestamp)")
    message = check_fails(apps(db.url, {"action": "archive", "archive_table": "sessions_archive"}))
    assert "policy 'expired-sessions'" in message
    assert "archive_table 'sessions_archive' lacks columns user_id, revoked_at, note" in message


def test_timestamp_without_index_is_a_warning(db: Db, apps: Apps) -> None:
    db.create_sessions(index=False)
    app = apps(db.url)
    assert app.cleanup is not None
    warnings = app.cleanup.check()
    assert len(warnings) == 1
    assert "policy 'expired-sessions'" in warnings[0]
    assert "no index leads with timestamp column 'expires_at'" in warnings[0]
    assert "create index on sessions (expires_at)" in warnings[0]
    db.execute("create index sessions_expires_at on sessions (expires_at)")
    assert app.cleanup.check() == []


def test_the_tie_index_is_advised_only_where_the_database_would_sort(db: Db, apps: Apps) -> None:
    """Time windows read rows sharing one timestamp in key order. On InnoDB and
    in an SQLite rowid table every index ends with the primary key, so an index
    on the timestamp alone serves (ts, id) order: no index is advised there.
    PostgreSQL's indexes do not: (ts, id) is advised. The oracle is the
    database's own plan for that order: a sort (filesort, temp b-tree, Sort)
    exactly where the advice is given."""
    db.create_sessions()
    app = apps(db.url, {"windows": "time"})
    assert app.cleanup is not None
    app.cleanup.check()
    [ties] = [
        n for n in app.cleanup.target("expired-sessions").notes if "sharing one expires_at" in n
    ]
    ordered = "select id from sessions where expires_at < {} order by expires_at, id limit 10"
    if db.dialect == "mysql":
        plan = " ".join(str(r) for r in db.rows("explain " + ordered.format("now()")))
        sorts = "filesort" in plan
    elif db.dialect == "sqlite":
        plan = " ".join(str(r) for r in db.rows("explain query plan " + ordered.format("1e12")))
        sorts = "TEMP B-TREE" in plan
    else:
        db.execute("analyze sessions")
        db.execute("set enable_seqscan = off")  # the plan an index would give
        plan = " ".join(str(r) for r in db.rows("explain " + ordered.format("now()")))
        sorts = "Sort" in plan
    advised = "create index on sessions (expires_at, id)" in ties
    assert advised == sorts, (ties, plan)
    assert advised == (db.dialect == "postgres")


def test_an_unindexed_cascade_or_set_null_reference_is_a_warning_with_its_index(
    db: Db, apps: Apps, tmp_path: Path
) -> None:
    """A child table whose ON DELETE CASCADE (or SET NULL) reference no index
    serves makes every deleted row scan it: `expiry check` says so, with the
    CREATE INDEX to copy, quoted; once that index exists the warning goes. InnoDB
    indexes every foreign key itself (and will not drop that index), so on
    MariaDB the warning never fires."""
    db.create_sessions()
    db.execute(
        f"create table {db.quote('order')} (id integer primary key, session_id bigint"
        " references sessions (id) on delete cascade)"
    )
    db.execute(
        "create table visits (id integer primary key, session_id bigint"
        " references sessions (id) on delete set null)"
    )
    app = apps(db.url)
    assert app.cleanup is not None
    warnings = app.cleanup.check()
    if db.dialect == "mysql":
        assert warnings == []
        return
    q = db.quote
    concurrently = " concurrently" if db.dialect == "postgres" else ""
    order_index = (
        f"create index{concurrently} {q('order_session_id_idx')} on {q('order')} "
        f"({q('session_id')})"
    )
    assert len(warnings) == 2, warnings
    cascade, set_null = sorted(warnings)
    assert cascade.startswith(
        "policy 'expired-sessions': order (session_id) references sessions (id) on delete "
        "cascade, and no index of order leads with (session_id): every row a window "
        "deletes scans order"
    ), cascade
    assert cascade.endswith(f"(fix: {order_index})"), cascade
    assert "visits (session_id) references sessions (id) on delete set null" in set_null
    config = write_config(tmp_path / "expiry.toml", db.url)
    shown = cli("--config", str(config), "check", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert order_index in " ".join(shown.stdout.split())  # folded to the terminal's width

    db.execute(order_index)  # as the warning writes it
    db.execute(set_null.rsplit("(fix: ", 1)[1].removesuffix(")"))
    assert app.cleanup.check() == []


def test_reserved_words_are_quoted(db: Db, apps: Apps) -> None:
    """Names from the config are always quoted: a table called "order" works."""
    ts, q = db.time_type, db.quote
    order, select, end = q("order"), q("select"), q("end")
    db.execute(f"create table {order} ({select} bigint primary key, {end} {ts} not null)")
    db.execute(f"create index order_end on {order} ({end})")
    db.execute(
        f"insert into {order} ({select}, {end}) values (1, {{now}} - "
        + db.seconds("3600")
        + "), (2, {now} + "
        + db.seconds("3600")
        + ")"
    )
    app = apps(db.url, {"table": "order", "key": "select", "timestamp": "end", "where": None})
    assert app.cleanup is not None
    assert app.cleanup.check() == []
    app.cleanup.open_run("expired-sessions")
    run_worker(app)
    assert db.rows(f"select {select} from {order}") == [(2,)]


def test_schema_qualified_table_on_postgres(pg_db: Db, apps: Apps) -> None:
    pg_db.execute("create schema auth")
    pg_db.create_sessions("auth.sessions", index=False)
    pg_db.execute("create index on auth.sessions (expires_at)")
    rows = standard_rows(50)
    pg_db.insert_sessions(rows, "auth.sessions")
    app = apps(pg_db.url, {"table": "auth.sessions"})
    assert app.cleanup is not None
    assert app.cleanup.check() == []
    app.cleanup.open_run("expired-sessions")
    run_worker(app)
    assert pg_db.ids("auth.sessions") == {i for i, _, _ in rows} - doomed(rows)
