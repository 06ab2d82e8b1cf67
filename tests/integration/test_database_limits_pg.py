"""Postgres with bounded waits: the engine sets statement_timeout and lock_timeout on every
connection (and connect and TCP timeouts on the client side), a query past them is a 503
naming the cause, and a table lock held elsewhere makes /select, /reward and /readyz
answer 503 (never a 500) until it is released."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import text

from rofu.service.db import repository
from rofu.service.db.engine import DatabaseLimits, make_engine
from rofu.service.errors import Unavailable
from rofu.service.settings import Settings
from tests.support import app_client

CONTEXT = [0.1, 0.2, 0.3]


def _settings(url: str) -> Settings:
    return Settings(
        database_url=url,
        context_dim=3,
        hidden=(8,),
        embedded_trainer=False,
        reward_window_seconds=0.0,
        db_lock_timeout_ms=300,
        db_statement_timeout_ms=1_000,
        db_pool_timeout_seconds=2.0,
    )


@contextmanager
def _table_lock(url: str) -> Iterator[None]:
    """Another session holding the API's tables in ACCESS EXCLUSIVE mode."""
    with psycopg.connect(url) as connection:
        connection.execute("LOCK TABLE decisions, rewards IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            connection.rollback()


def test_engine_sets_the_timeouts_and_a_slow_query_is_unavailable(pg_url: str) -> None:
    engine = make_engine(pg_url, DatabaseLimits(statement_timeout_ms=300, lock_timeout_ms=200))
    try:
        with engine.connect() as connection:
            shown = [
                connection.execute(text(f"show {name}")).scalar_one()
                for name in ("statement_timeout", "lock_timeout")
            ]
            dbapi = connection.connection.dbapi_connection
            assert dbapi is not None
            parameters = dbapi.info.get_parameters()
        with (
            pytest.raises(Unavailable) as raised,
            repository.database_errors(),
            engine.connect() as connection,
        ):
            connection.execute(text("select pg_sleep(5)"))
    finally:
        engine.dispose()
    assert shown == ["300ms", "200ms"]
    assert (parameters["connect_timeout"], parameters["tcp_user_timeout"]) == ("5", "20000")
    assert parameters["keepalives"] == "1"
    assert raised.value.cause == "statement_timeout"
    assert raised.value.headers() == {"Retry-After": "2"}


def test_engine_without_limits_keeps_the_servers_defaults(pg_url: str) -> None:
    engine = make_engine(pg_url)  # migrations and the trainer may wait as long as needed
    try:
        with engine.connect() as connection:
            shown = connection.execute(text("show statement_timeout")).scalar_one()
    finally:
        engine.dispose()
    assert shown == "0"


@pytest.mark.anyio
async def test_api_table_lock_is_a_503_with_retry_after_then_recovers(pg_clean: str) -> None:
    async with app_client(_settings(pg_clean)) as (client, _):
        made = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "pg-held"})
        assert made.status_code == 200
        with _table_lock(pg_clean):
            chosen = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "pg-2"})
            rewarded = await client.post("/v1/reward", json={"event_id": "pg-held", "value": 1.0})
            ready = await client.get("/readyz")
            metrics_text = (await client.get("/metrics")).text
        again = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "pg-2"})
        stored = await client.post("/v1/reward", json={"event_id": "pg-held", "value": 1.0})
        recovered = await client.get("/readyz")
    for reply in (chosen, rewarded):
        assert reply.status_code == 503, reply.text
        assert reply.headers["retry-after"].isdigit()
        assert "lock_timeout" in reply.json()["error"]["message"]
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "not writable"
    assert ready.json()["checks"]["database_cause"] == "lock_timeout"
    assert 'rofu_database_errors_total{cause="lock_timeout"}' in metrics_text
    assert (again.status_code, stored.json()["duplicate"]) == (200, False)
    assert recovered.status_code == 200
    with psycopg.connect(pg_clean) as connection:
        rows = connection.execute("select event_id, value from rewards").fetchall()
    assert rows == [("pg-held", 1.0)]
