"""MySQL drivers side by side: what expiry's MySQL engine would pay per window
with PyMySQL (pure Python, the engine's driver) and with mysqlclient (the C
client library), on the same server in the same run.

    .venv/bin/python bench/mysql_driver.py                # 3 interleaved rounds
    .venv/bin/pip install mysqlclient                     # needs Debian's libmariadb-dev

Each round, each driver runs, on one connection:

* round trip: ``SELECT 1``, N times (the floor of every statement);
* window: the statements of one expiry window on a small table, as the engine
  sends them: BEGIN, SAVEPOINT, a DELETE of one key range, RELEASE, the job's
  completion (UPDATE then SELECT row_count()), the ledger INSERT and its
  SELECT, COMMIT; N windows (the rows are put back outside the clock).

It prints operations per second for each and the ratio. mysqlclient missing:
a printed line, PyMySQL alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MYSQL_URL = os.environ.get("EXPIRY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/")
DB = f"expiry_bench_driver_{os.getpid()}"


def connect(driver: str) -> Any:
    from expiry.engines.mysql.sessions import parse_url

    p = parse_url(MYSQL_URL.rstrip("/") + "/" + DB)
    if driver == "pymysql":
        import pymysql
        from pymysql.constants import CLIENT

        return pymysql.connect(**p, autocommit=True, client_flag=CLIENT.FOUND_ROWS)
    import MySQLdb
    from MySQLdb.constants import CLIENT as MCLIENT

    return MySQLdb.connect(
        host=p["host"],
        port=p["port"],
        user=p["user"],
        password=p["password"],
        database=p["database"],
        autocommit=True,
        client_flag=MCLIENT.FOUND_ROWS,
    )


def setup() -> None:
    import pymysql

    from expiry.engines.mysql.sessions import parse_url

    p = parse_url(MYSQL_URL.rstrip("/") + "/mysql")
    p.pop("database")
    admin = pymysql.connect(**p, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"drop database if exists `{DB}`")
        cur.execute(f"create database `{DB}`")
        cur.execute(f"create table `{DB}`.t (id bigint primary key, at datetime(6) not null)")
        cur.execute(f"create table `{DB}`.jobs (id bigint primary key, state varchar(16) not null)")
        cur.execute(f"create table `{DB}`.ledger (`key` varchar(200) primary key, n int)")
    admin.close()


def teardown() -> None:
    import pymysql

    from expiry.engines.mysql.sessions import parse_url

    p = parse_url(MYSQL_URL.rstrip("/") + "/mysql")
    p.pop("database")
    admin = pymysql.connect(**p, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"drop database if exists `{DB}`")
    admin.close()


def round_trips(conn: Any, n: int) -> float:
    cur = conn.cursor()
    started = time.perf_counter()
    for _ in range(n):
        cur.execute("select 1")
        cur.fetchall()
    return n / (time.perf_counter() - started)


def windows(conn: Any, n: int) -> float:
    cur = conn.cursor()
    cur.execute("delete from t")
    cur.execute("delete from jobs")
    cur.execute("delete from ledger")
    values = ", ".join(f"({i}, utc_timestamp(6) - interval 1 hour)" for i in range(n * 10))
    cur.execute(f"insert into t values {values}")
    cur.execute("insert into jobs values " + ", ".join(f"({i}, 'running')" for i in range(n)))
    started = time.perf_counter()
    for i in range(n):
        cur.execute("begin")
        cur.execute("savepoint w")
        cur.execute(
            "delete from t where id > %s and id <= %s and at < utc_timestamp(6)"
            " and not exists (select 1 from ledger where `key` = %s)",
            (i * 10 - 1, i * 10 + 9, f"w{i}"),
        )
        cur.execute("release savepoint w")
        cur.execute("update jobs set state = 'completed' where id = %s and state = 'running'", (i,))
        cur.execute("select %s from dual where row_count() > 0", (i,))
        cur.fetchall()
        cur.execute("insert into ledger values (%s, 10)", (f"w{i}",))
        cur.execute("select %s from dual", (f"w{i}",))
        cur.fetchall()
        cur.execute("commit")
    return n / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=3000, help="operations a measurement (3000)")
    args = parser.parse_args()
    drivers = ["pymysql"]
    try:
        import MySQLdb  # noqa: F401

        drivers.append("mysqlclient")
    except ImportError:
        print("mysqlclient is not installed (pip install mysqlclient): PyMySQL alone")
    setup()
    results: dict[tuple[str, str], list[float]] = {}
    tests: list[tuple[str, Callable[[Any, int], float]]] = [
        ("round trip", round_trips),
        ("window", windows),
    ]
    try:
        for round_ in range(1, args.rounds + 1):
            order = drivers if round_ % 2 else list(reversed(drivers))
            for driver in order:
                conn = connect(driver)
                for name, test in tests:
                    rate = test(conn, args.n)
                    results.setdefault((driver, name), []).append(rate)
                    print(f"round {round_} {driver:<12} {name:<10} {rate:>10,.0f} /s", flush=True)
                conn.close()
    finally:
        teardown()
    print()
    print(f"{'driver':<12} {'test':<10} {'median /s':>10}  vs PyMySQL")
    for name, _ in tests:
        base = statistics.median(results[("pymysql", name)])
        for driver in drivers:
            median = statistics.median(results[(driver, name)])
            print(f"{driver:<12} {name:<10} {median:>10,.0f}  {median / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
