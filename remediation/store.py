"""The action store: every action record, its audit trail, the latest node scores, settings.

One code path for SQLite (a single engine host: ``sqlite:////var/lib/gpuops/actions.db``, or
``sqlite://`` in memory for tests) and PostgreSQL (``postgresql+psycopg://user@host:5432/db``),
through SQLAlchemy Core. The schema is owned by the Alembic migrations shipped in
``remediation/migrations/`` and applied by :meth:`ActionStore.migrate`.

The engine writes a record *before* it calls a scheduler adapter and moves it through its
states by compare-and-set (:meth:`ActionStore.update` with ``expect``), so two writers — or
one writer that crashed and came back — can never both carry out the same move. Every move
writes an audit event in the same transaction.

SQLite runs in WAL mode (readers never block the writer), with a busy timeout, foreign keys
on, and every write transaction opened ``BEGIN IMMEDIATE`` so that two writers queue on the
database lock instead of failing a read-to-write upgrade. It is safe for one writer process
plus readers; PostgreSQL serves any number of each. Every method may be called from several
threads: each opens its own pooled connection and transaction.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from remediation.actions import ActionKind, ActionRecord, ActionState, check_transition

from .tables import (action_events, actions, leases, node_scores, settings, settings_events,
                     silence_events, silences)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
#: Alembic's bookkeeping table, named so it cannot collide with another tool's in a shared database
VERSION_TABLE = "gpuops_store_version"
#: states of an action that still holds, or may still come to hold, a node
OPEN_STATES = (ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING, ActionState.SUCCEEDED)
#: how long a SQLite writer waits for the database lock before failing, ms: longer than any
#: one transaction of ours (a 1,000-row batch takes tens of ms), short enough to surface a hung peer
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: libpq settings a PostgreSQL store gets unless its URL sets them (``?connect_timeout=5``). Without
#: them a server that accepts the connection and never answers, or a network that drops packets, holds
#: the caller for minutes (the kernel's TCP timeouts): the engine's tick, which holds the engine's lock,
#: and the leader's lease renewal among them. A connection attempt gives up after 10 s; a connection
#: whose peer went silent is found dead within about a minute (TCP keepalives, and unacknowledged sends)
PG_CONNECT_DEFAULTS: dict[str, int] = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30,
                                       "keepalives_interval": 10, "keepalives_count": 3,
                                       "tcp_user_timeout": 60_000}
#: batches up to this many records are inserted with RETURNING (exact, fewest round trips)
_SMALL_BATCH = 50
#: ids per ``IN (...)`` lookup: far below SQLite's 32,766 bound parameters
_IN_CHUNK = 1_000
URL_EXAMPLES = ("sqlite:////var/lib/gpuops/actions.db, sqlite:// (memory), "
                "postgresql+psycopg://user@127.0.0.1:5432/gpuops")


class StoreError(Exception):
    """The store refused or failed an operation (permanent: retrying will not help)."""


class StoreUnavailable(StoreError):
    """The database could not be reached or stayed locked (transient: retry later)."""


class StaleRecord(StoreError):
    """A compare-and-set lost: the record is not in the state the writer expected.

    ``current`` is the state found (``None`` when there is no such record).
    """

    def __init__(self, action_id: str, expected: ActionState, current: ActionState | None) -> None:
        found = "does not exist" if current is None else f"is {current.value}"
        super().__init__(f"action {action_id}: expected state {expected.value} but it {found} "
                         f"(another writer moved it first; re-read it with get())")
        self.action_id, self.expected, self.current = action_id, expected, current


@dataclass(frozen=True)
class Lease:
    """Who holds lease *name* until when (wall s since the epoch), in which term (``epoch``)."""

    name: str
    holder: str
    expires_at: float
    epoch: int
    acquired_at: float

    def live(self, now: float) -> bool:
        """Whether the lease is still held at *now*."""
        return now <= self.expires_at


@dataclass(frozen=True)
class NodeScoreRow:
    """The latest score of one node, as the engine last saw it (one row per node).

    ``ts`` is the telemetry time of the score, s since the epoch; ``risk`` and ``anomaly``
    the model's calibrated scores; ``state`` what gpuops makes of the node ("ok", "held",
    "unknown", ...).
    """

    node: str
    ts: float
    risk: float
    fault: str | None
    anomaly: float
    rule: str | None
    state: str


_SCORE_COLUMNS = ("node", "ts", "risk", "fault", "anomaly", "rule", "state")
_PG_PUT_SCORES = sa.text(
    "INSERT INTO node_scores (node, ts, risk, fault, anomaly, rule, state) "
    "SELECT * FROM unnest(CAST(:node AS varchar[]), CAST(:ts AS float8[]), CAST(:risk AS float8[]), "
    "CAST(:fault AS varchar[]), CAST(:anomaly AS float8[]), CAST(:rule AS varchar[]), CAST(:state AS varchar[])) "
    "ON CONFLICT (node) DO UPDATE SET ts = EXCLUDED.ts, risk = EXCLUDED.risk, fault = EXCLUDED.fault, "
    "anomaly = EXCLUDED.anomaly, rule = EXCLUDED.rule, state = EXCLUDED.state")

_RECORD_COLUMNS = tuple(c.name for c in actions.columns)
_JSON_FIELDS = ("evidence", "result")


def _record_row(rec: ActionRecord) -> dict[str, Any]:
    row = rec.to_dict()
    for f in _JSON_FIELDS:
        row[f] = json.dumps(row[f], sort_keys=True, default=str)
    return row


def _row_record(row: sa.Row) -> ActionRecord:
    d = {name: getattr(row, name) for name in _RECORD_COLUMNS}
    for f in _JSON_FIELDS:
        d[f] = json.loads(d[f])
    d["dry_run"], d["escalates"] = bool(d["dry_run"]), bool(d["escalates"])
    return ActionRecord.from_dict(d)


def _values(items: Iterable[Any] | None, enum_cls: type) -> list[str] | None:
    """Enum members or their string values, checked and turned into strings."""
    if items is None:
        return None
    if isinstance(items, (str, enum_cls)):
        items = [items]
    try:
        return [enum_cls(i).value for i in items]
    except ValueError as e:
        valid = ", ".join(m.value for m in enum_cls)
        raise StoreError(f"{e}; valid values: {valid}") from None


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable url>"


class ActionStore:
    """The persisted action records, their audit trail, node scores and settings.

    ``url`` is a SQLAlchemy URL (see the module docstring). The constructor does not
    connect; :meth:`migrate` creates or upgrades the schema and must run once before use
    (at start-up). ``clock`` gives the wall time of setting changes, s since the epoch.
    """

    def __init__(self, url: str, *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self._clock = clock
        try:
            parsed = sa.make_url(url)
        except sa.exc.ArgumentError as e:
            raise StoreError(f"action store URL {url!r} is not a database URL ({e}); "
                             f"examples: {URL_EXAMPLES}") from None
        self._dialect = parsed.get_backend_name()
        if self._dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"action store URL {safe_url(url)}: backend {self._dialect!r} is not "
                             f"supported (sqlite or postgresql); examples: {URL_EXAMPLES}")
        memory = self._dialect == "sqlite" and parsed.database in (None, "", ":memory:")
        # one in-memory database lives on one connection: share it, and take turns on it
        self._serial = threading.RLock() if memory else None
        kwargs: dict[str, Any] = {}
        if memory:
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        elif self._dialect == "sqlite":
            kwargs = {"connect_args": {"check_same_thread": False,
                                       "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
        else:
            kwargs = {"pool_pre_ping": True,
                      "connect_args": {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in parsed.query}}
        try:
            self._engine: Engine = sa.create_engine(parsed, **kwargs)
        except (sa.exc.ArgumentError, ImportError) as e:
            raise StoreError(f"cannot open action store {safe_url(url)}: {e}") from None
        if self._dialect == "sqlite":
            _sqlite_setup(self._engine, wal=not memory)
        self._writer = self._engine.execution_options(gpuops_write=True)
        self._insert = sqlite.insert if self._dialect == "sqlite" else postgresql.insert

    # ---- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _tx(self, write: bool) -> Iterator[Connection]:
        """One transaction; a write takes SQLite's lock up front (``BEGIN IMMEDIATE``)."""
        lock = self._serial
        if lock is not None:
            lock.acquire()
        try:
            with (self._writer if write else self._engine).begin() as conn:
                yield conn
        except StoreError:
            raise
        except sa.exc.SQLAlchemyError as e:
            raise _classify(e, self.url) from e
        finally:
            if lock is not None:
                lock.release()

    def migrate(self) -> None:
        """Create the schema or upgrade it to the newest revision (idempotent)."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        try:
            with self._tx(write=True) as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except StoreError as e:
            raise StoreError(f"migrating the action store failed: {e}") from e
        except Exception as e:  # alembic's own errors (a broken or unknown revision)
            raise StoreError(f"migrating the action store {safe_url(self.url)} failed: {e!r}; "
                             f"is the database from a newer gpuops?") from e

    def close(self) -> None:
        """Close every pooled connection (the store may be used again; it reconnects)."""
        self._engine.dispose()

    # ---- actions ------------------------------------------------------------------------------

    def insert(self, rec: ActionRecord, note: str = "") -> bool:
        """Store a new record; False (and the stored one untouched) if its id exists."""
        return self.insert_many([rec], note=note) == 1

    def insert_many(self, recs: Sequence[ActionRecord], note: str = "") -> int:
        """Store new records in one transaction; return how many were new (others untouched)."""
        if not recs:
            return 0
        by_id = {r.id: r for r in recs}
        with self._tx(write=True) as conn:
            new = self._insert_new(conn, [_record_row(r) for r in by_id.values()])
            if new:
                conn.execute(action_events.insert(), [
                    {"action_id": i, "at": by_id[i].updated_at, "from_state": None,
                     "to_state": by_id[i].state.value, "actor": by_id[i].actor, "note": note}
                    for i in by_id if i in new])
        return len(new)

    def _insert_new(self, conn: Connection, rows: list[dict[str, Any]]) -> set[str]:
        """Insert the rows whose id is not stored yet; return their ids.

        A small batch is one ``INSERT ... ON CONFLICT DO NOTHING RETURNING id``. A big one
        would be slow that way on PostgreSQL (psycopg parses the 20,000-parameter statement
        in Python: ~150 ms for 1,000 records), so it looks up which ids exist, then inserts
        the rest with a plain executemany; if another writer stored one of them in between
        (PostgreSQL only: SQLite writers hold the lock from BEGIN), the unique key refuses the
        batch and it is redone the small-batch way.
        """
        returning = self._insert(actions).on_conflict_do_nothing(index_elements=["id"]).returning(actions.c.id)
        if len(rows) <= _SMALL_BATCH:
            return set(conn.execute(returning, rows).scalars())
        ids = [r["id"] for r in rows]
        existing: set[str] = set()
        for i in range(0, len(ids), _IN_CHUNK):
            existing.update(conn.execute(sa.select(actions.c.id).where(
                actions.c.id.in_(ids[i:i + _IN_CHUNK]))).scalars())
        fresh = [r for r in rows if r["id"] not in existing]
        if not fresh:
            return set()
        try:
            with conn.begin_nested():
                conn.execute(actions.insert(), fresh)
        except sa.exc.IntegrityError:
            return set(conn.execute(returning, fresh).scalars())
        return {r["id"] for r in fresh}

    def get(self, action_id: str) -> ActionRecord | None:
        with self._tx(write=False) as conn:
            row = conn.execute(sa.select(actions).where(actions.c.id == action_id)).first()
        return None if row is None else _row_record(row)

    def update(self, rec: ActionRecord, expect: ActionState, actor: str, note: str = "") -> ActionRecord:
        """Store *rec* (the new version) if the stored record is still in state *expect*.

        Raises :class:`StaleRecord` when another writer moved it first (nothing written),
        and ``InvalidTransition`` when *expect* -> ``rec.state`` is not an allowed move. A
        record kept in its state (``rec.state == expect``: an attempt counted, a result added)
        is a field update, audited like a move.
        """
        expect = ActionState(expect)
        if rec.state is not expect:
            check_transition(rec.id, expect, rec.state)
        row = _record_row(rec)
        del row["id"]
        with self._tx(write=True) as conn:
            done = conn.execute(actions.update().where(actions.c.id == rec.id,
                                                       actions.c.state == expect.value).values(**row))
            if done.rowcount != 1:
                cur = conn.execute(sa.select(actions.c.state).where(actions.c.id == rec.id)).scalar()
                raise StaleRecord(rec.id, expect, None if cur is None else ActionState(cur))
            conn.execute(action_events.insert().values(
                action_id=rec.id, at=rec.updated_at, from_state=expect.value,
                to_state=rec.state.value, actor=actor, note=note))
        return rec

    def history(self, action_id: str) -> list[dict[str, Any]]:
        """The record's audit events, oldest first: ``{at, from_state, to_state, actor, note}``."""
        e = action_events
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(e.c.at, e.c.from_state, e.c.to_state, e.c.actor, e.c.note)
                                .where(e.c.action_id == action_id).order_by(e.c.seq)).all()
        return [r._asdict() for r in rows]

    def query(self, *, node: str | None = None, states: Iterable[ActionState | str] | None = None,
              kinds: Iterable[ActionKind | str] | None = None, actor: str | None = None,
              since: float | None = None, until: float | None = None,
              limit: int = 100, offset: int = 0) -> list[ActionRecord]:
        """Records matching every filter given, newest ``created_at`` first.

        ``since`` is inclusive, ``until`` exclusive (s since the epoch, on ``created_at``).
        """
        if limit < 0 or offset < 0:
            raise StoreError(f"limit and offset must be >= 0 (got limit={limit}, offset={offset})")
        stmt = sa.select(actions).where(*self._filters(node=node, states=states, kinds=kinds,
                                                       actor=actor, since=since, until=until))
        stmt = stmt.order_by(actions.c.created_at.desc(), actions.c.id.desc()).limit(limit).offset(offset)
        with self._tx(write=False) as conn:
            return [_row_record(r) for r in conn.execute(stmt)]

    def with_verdicts(self, since: float) -> list[ActionRecord]:
        """Records a person gave a verdict (``verdict`` set), updated at or after *since* (s since the
        epoch, ``updated_at``), oldest update first."""
        stmt = sa.select(actions).where(actions.c.verdict.is_not(None), actions.c.updated_at >= since)
        with self._tx(write=False) as conn:
            return [_row_record(r) for r in conn.execute(stmt.order_by(actions.c.updated_at, actions.c.id))]

    def open_actions(self, node: str | None = None) -> list[ActionRecord]:
        """Every record not yet in a terminal state or verified, newest first."""
        stmt = sa.select(actions).where(*self._filters(node=node, states=OPEN_STATES))
        stmt = stmt.order_by(actions.c.created_at.desc(), actions.c.id.desc())
        with self._tx(write=False) as conn:
            return [_row_record(r) for r in conn.execute(stmt)]

    def count(self, *, since: float, kinds: Iterable[ActionKind | str] | None = None,
              states: Iterable[ActionState | str] | None = None, node: str | None = None) -> int:
        """How many records were created at or after *since* (for rate caps)."""
        stmt = sa.select(sa.func.count()).select_from(actions).where(
            *self._filters(node=node, states=states, kinds=kinds, since=since))
        with self._tx(write=False) as conn:
            return int(conn.execute(stmt).scalar_one())

    @staticmethod
    def _filters(*, node: str | None = None, states: Any = None, kinds: Any = None,
                 actor: str | None = None, since: float | None = None,
                 until: float | None = None) -> list[sa.ColumnElement[bool]]:
        c = actions.c
        where: list[sa.ColumnElement[bool]] = []
        if node is not None:
            where.append(c.node == node)
        if (sv := _values(states, ActionState)) is not None:
            where.append(c.state.in_(sv))
        if (kv := _values(kinds, ActionKind)) is not None:
            where.append(c.kind.in_(kv))
        if actor is not None:
            where.append(c.actor == actor)
        if since is not None:
            where.append(c.created_at >= since)
        if until is not None:
            where.append(c.created_at < until)
        return where

    # ---- node scores --------------------------------------------------------------------------

    def put_scores(self, rows: Sequence[NodeScoreRow]) -> None:
        """Upsert the latest score of each node given (one transaction; others untouched)."""
        latest = {r.node: r for r in rows}  # one row per node per statement (ON CONFLICT rule)
        if not latest:
            return
        data = [{"node": r.node, "ts": float(r.ts), "risk": float(r.risk), "fault": r.fault,
                 "anomaly": float(r.anomaly), "rule": r.rule, "state": r.state} for r in latest.values()]
        if self._dialect == "postgresql":
            # one statement over arrays: executemany costs a round trip per row (24 ms per 1,000
            # rows here), unnest about a tenth of that
            cols = {k: [d[k] for d in data] for k in _SCORE_COLUMNS}
            with self._tx(write=True) as conn:
                conn.execute(_PG_PUT_SCORES, cols)
            return
        stmt = self._insert(node_scores)
        stmt = stmt.on_conflict_do_update(
            index_elements=["node"],
            set_={k: stmt.excluded[k] for k in _SCORE_COLUMNS[1:]})
        with self._tx(write=True) as conn:
            conn.execute(stmt, data)  # executemany of one cached statement

    def scores(self) -> list[NodeScoreRow]:
        """Every node's latest score, by node name."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(node_scores).order_by(node_scores.c.node)).all()
        return [NodeScoreRow(**r._asdict()) for r in rows]

    # ---- settings -----------------------------------------------------------------------------

    def get_setting(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under *key*, or *default*."""
        with self._tx(write=False) as conn:
            raw = conn.execute(sa.select(settings.c.value).where(settings.c.key == key)).scalar()
        return default if raw is None else json.loads(raw)

    def set_setting(self, key: str, value: Any, actor: str, note: str = "", *, audit: bool = True) -> None:
        """Store *value* (JSON-able) under *key*, with an audit event naming *actor* (``audit=False``:
        none, for the engine's own checkpoints; a change a person should see is audited)."""
        try:
            raw = json.dumps(value, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise StoreError(f"setting {key!r}: value is not JSON-able ({e})") from None
        now = self._clock()
        with self._tx(write=True) as conn:
            stmt = self._insert(settings).values(key=key, value=raw, updated_at=now, actor=actor)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["key"], set_={"value": raw, "updated_at": now, "actor": actor}))
            if audit:
                conn.execute(settings_events.insert().values(key=key, at=now, value=raw, actor=actor, note=note))

    def setting_history(self, key: str) -> list[dict[str, Any]]:
        """Every change of *key*, oldest first: ``{at, value, actor, note}``."""
        e = settings_events
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(e.c.at, e.c.value, e.c.actor, e.c.note)
                                .where(e.c.key == key).order_by(e.c.seq)).all()
        return [{**r._asdict(), "value": json.loads(r.value)} for r in rows]

    # ---- silences (rows as dicts; remediation/silences.py gives them meaning) ------------------

    def insert_silence(self, row: dict[str, Any], note: str = "") -> bool:
        """Store a new silence row (``scope`` JSON-able) with a ``created`` audit event by its author;
        False (the stored one untouched) if its id exists."""
        data = {**row, "scope": json.dumps(row["scope"], sort_keys=True)}
        with self._tx(write=True) as conn:
            got = conn.execute(self._insert(silences).values(**data)
                               .on_conflict_do_nothing(index_elements=["id"]).returning(silences.c.id)).scalar()
            if got is None:
                return False
            conn.execute(silence_events.insert().values(silence_id=row["id"], at=row["created_at"], event="created",
                                                        actor=row["author"], note=note or row["reason"]))
        return True

    def delete_silence(self, silence_id: str, at: float, actor: str, note: str = "") -> bool:
        """Mark a silence deleted at *at* by *actor* (audited); False if none such or deleted already."""
        sc = silences.c
        with self._tx(write=True) as conn:
            done = conn.execute(silences.update().where(sc.id == silence_id, sc.deleted_at.is_(None))
                                .values(deleted_at=at, deleted_by=actor))
            if done.rowcount != 1:
                return False
            conn.execute(silence_events.insert().values(silence_id=silence_id, at=at, event="deleted",
                                                        actor=actor, note=note))
        return True

    def silence_rows(self, *, active_at: float | None = None, silence_id: str | None = None,
                     limit: int = 10_000) -> list[dict[str, Any]]:
        """Silence rows, newest first: all, one (*silence_id*), or those in force at *active_at*
        (``starts_at <= t < ends_at``, not deleted)."""
        sc = silences.c
        where: list[sa.ColumnElement[bool]] = []
        if silence_id is not None:
            where.append(sc.id == silence_id)
        if active_at is not None:
            where += [sc.starts_at <= active_at, sc.ends_at > active_at, sc.deleted_at.is_(None)]
        stmt = sa.select(silences).where(*where).order_by(sc.created_at.desc(), sc.id).limit(limit)
        with self._tx(write=False) as conn:
            rows = conn.execute(stmt).all()
        return [{**r._asdict(), "scope": json.loads(r.scope)} for r in rows]

    def silence_history(self, silence_id: str) -> list[dict[str, Any]]:
        """A silence's audit events, oldest first: ``{at, event, actor, note}``."""
        e = silence_events
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(e.c.at, e.c.event, e.c.actor, e.c.note)
                                .where(e.c.silence_id == silence_id).order_by(e.c.seq)).all()
        return [r._asdict() for r in rows]

    # ---- leases (leader election) ---------------------------------------------------------------

    def acquire_lease(self, name: str, holder: str, ttl_s: float, now: float) -> int | None:
        """Take or keep lease *name* for *holder* until ``now + ttl_s``; its epoch, or None if another holds it.

        Compare-and-set in one write transaction: the lease is taken only if nobody holds it,
        it has lapsed (``expires_at < now``), or *holder* already holds it (then it is simply
        extended). The epoch (fencing token) grows by one whenever the lease starts a new term:
        a new holder, or the same holder after it lapsed. On PostgreSQL the conditional
        ``UPDATE`` locks the row and re-checks its condition, on SQLite the writer holds the
        database lock from ``BEGIN IMMEDIATE``: two replicas can never both win.
        """
        if not ttl_s > 0:
            raise StoreError(f"lease ttl must be > 0 s, got {ttl_s!r}")
        lt = leases.c
        with self._tx(write=True) as conn:
            got = conn.execute(self._insert(leases).values(
                name=name, holder=holder, expires_at=now + ttl_s, epoch=1, acquired_at=now,
            ).on_conflict_do_nothing(index_elements=["name"]).returning(leases.c.epoch)).scalar()
            if got is not None:
                return int(got)
            same_term = sa.and_(lt.holder == holder, lt.expires_at >= now)
            got = conn.execute(
                leases.update()
                .where(lt.name == name, sa.or_(lt.holder == holder, lt.expires_at < now))
                .values(holder=holder, expires_at=now + ttl_s,
                        epoch=sa.case((same_term, lt.epoch), else_=lt.epoch + 1),
                        acquired_at=sa.case((same_term, lt.acquired_at), else_=now))
                .returning(lt.epoch)).scalar()
        return None if got is None else int(got)

    def renew_lease(self, name: str, holder: str, ttl_s: float, now: float, epoch: int | None = None) -> bool:
        """Extend *holder*'s live lease to ``now + ttl_s``; False if it lapsed or changed hands.

        With *epoch*, only that term is extended (a holder that lost and retook the lease in
        between learns it from the False).
        """
        lt = leases.c
        where = [lt.name == name, lt.holder == holder, lt.expires_at >= now]
        if epoch is not None:
            where.append(lt.epoch == epoch)
        with self._tx(write=True) as conn:
            done = conn.execute(leases.update().where(*where).values(expires_at=now + ttl_s))
        return done.rowcount == 1

    def release_lease(self, name: str, holder: str) -> bool:
        """Give lease *name* up now (graceful shutdown) so a standby takes it at once; False if not held."""
        lt = leases.c
        with self._tx(write=True) as conn:
            done = conn.execute(leases.update().where(lt.name == name, lt.holder == holder)
                                .values(expires_at=-1.0))
        return done.rowcount == 1

    def lease(self, name: str) -> Lease | None:
        """Lease *name* as stored (live or lapsed), None if never taken."""
        with self._tx(write=False) as conn:
            row = conn.execute(sa.select(leases).where(leases.c.name == name)).first()
        return None if row is None else Lease(row.name, row.holder, float(row.expires_at), int(row.epoch),
                                              float(row.acquired_at))

    def lease_holder(self, name: str, now: float | None = None) -> str | None:
        """Who holds lease *name* at *now* (default: the store's clock); None when nobody does."""
        got = self.lease(name)
        now = self._clock() if now is None else now
        return got.holder if got is not None and got.live(now) else None

    # ---- retention ----------------------------------------------------------------------------

    def delete_older_than(self, before: float) -> dict[str, int]:
        """Delete node scores last updated before *before* and alert records created before it.

        Alerts change nothing on a cluster and pile up; every other action record is the
        audit trail and is kept. Returns how many rows of each went.
        """
        with self._tx(write=True) as conn:
            ids = list(conn.execute(sa.select(actions.c.id).where(
                actions.c.kind == ActionKind.ALERT.value, actions.c.created_at < before)).scalars())
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i:i + _IN_CHUNK]
                conn.execute(action_events.delete().where(action_events.c.action_id.in_(chunk)))
                conn.execute(actions.delete().where(actions.c.id.in_(chunk)))
            scores = conn.execute(node_scores.delete().where(node_scores.c.ts < before)).rowcount
        return {"node_scores": int(scores), "alerts": len(ids)}


def _classify(e: sa.exc.SQLAlchemyError, url: str) -> StoreError:
    """A database error as ours: unreachable or locked is transient, the rest permanent."""
    text = str(getattr(e, "orig", None) or e)
    if "no such table" in text or isinstance(getattr(e, "orig", None), _pg_undefined()):
        return StoreError(f"action store {safe_url(url)} has no schema yet ({text.strip()}): "
                          f"run ActionStore.migrate() at start-up")
    if isinstance(e, (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError)):
        return StoreUnavailable(f"action store {safe_url(url)} unavailable: {text.strip()}")
    return StoreError(f"action store {safe_url(url)}: {text.strip()}")


def _pg_undefined() -> tuple[type, ...]:
    try:
        from psycopg.errors import UndefinedColumn, UndefinedTable
    except ImportError:
        return ()
    return (UndefinedTable, UndefinedColumn)


def _sqlite_setup(engine: Engine, wal: bool) -> None:
    """Pragmas on every new connection, and explicit BEGINs (IMMEDIATE for writes).

    pysqlite's own transaction handling is switched off (``isolation_level = None``) so the
    store decides how each transaction begins: a writer takes the lock at BEGIN and waits
    up to the busy timeout for it, instead of failing when a read turns into a write.
    """
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")  # a committed action survives a power loss too
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("gpuops_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
