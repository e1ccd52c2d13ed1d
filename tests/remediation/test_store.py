"""The action store keeps every record once, moves it only by compare-and-set with an audit
event per move, answers the engine's and the API's queries, and keeps what it committed across
restarts — the same on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from remediation.actions import (ENGINE_ACTOR, ActionKind, ActionRecord, ActionState,
                                 InvalidTransition, action_id)
from remediation.store import (PG_CONNECT_DEFAULTS, VERSION_TABLE, ActionStore, NodeScoreRow, StaleRecord,
                               StoreError, StoreUnavailable)
from remediation.tables import METADATA

T0 = 1_800_000_000.0


def record(node: str = "gpu-node-01", kind: ActionKind = ActionKind.DRAIN, at: float = T0,
           state: ActionState = ActionState.PROPOSED, actor: str = ENGINE_ACTOR, **kw) -> ActionRecord:
    fault = kw.pop("fault", "xid79")
    return ActionRecord(id=action_id(node, kind, kw.get("gpu"), fault, at, actor), node=node, kind=kind,
                        state=state, reason=f"{fault} on {node}", actor=actor, incident_ts=at,
                        created_at=at, updated_at=at, fault=fault, **kw)


# ---- records ------------------------------------------------------------------------------

def test_insert_stores_every_field_and_reads_it_back(store):
    rec = record(gpu=3, grade="confirmed", source="model", score=0.93,
                 evidence={"risk": 0.93, "features": {"xid79_count": 2}}, dry_run=False,
                 adapter="slurm", attempts=1, error=None, result={"jobs": [12, 13]}, blocked_by=None)
    assert store.insert(rec)
    assert store.get(rec.id) == rec
    assert store.get("no-such-id") is None


def test_insert_is_idempotent_on_the_id_and_leaves_the_stored_record_untouched(store):
    rec = record()
    assert store.insert(rec, note="first")
    changed = record(evidence={"other": True})
    assert changed.id == rec.id
    assert not store.insert(changed, note="second")
    assert store.get(rec.id) == rec
    assert store.history(rec.id) == [{"at": T0, "from_state": None, "to_state": "proposed",
                                      "actor": ENGINE_ACTOR, "note": "first"}]


def test_insert_many_writes_in_one_go_and_counts_only_the_new_ones(store):
    first = [record(node=f"gpu-node-{i:02d}") for i in range(5)]
    assert store.insert_many(first) == 5
    more = first[3:] + [record(node=f"gpu-node-{i:02d}") for i in range(5, 8)]
    assert store.insert_many(more) == 3
    assert store.insert_many([]) == 0
    assert store.count(since=0) == 8
    assert all(len(store.history(r.id)) == 1 for r in first + more)


def test_a_big_batch_with_some_stored_records_inserts_only_the_others(store):
    first = [record(node=f"gpu-node-{i:03d}") for i in range(0, 300, 2)]
    assert store.insert_many(first) == 150
    every = [record(node=f"gpu-node-{i:03d}") for i in range(300)]
    changed = [record(node=r.node, evidence={"changed": True}) for r in every]
    assert store.insert_many(changed) == 150
    assert store.insert_many(changed) == 0
    assert store.count(since=0) == 300
    assert store.get(first[7].id) == first[7]
    assert store.get(every[7].id).evidence == {"changed": True}
    assert all(len(store.history(r.id)) == 1 for r in every[:20])


def test_update_moves_a_record_when_it_is_in_the_expected_state_and_audits_the_actor(store):
    rec = record()
    store.insert(rec)
    approved = store.update(rec.moved(ActionState.APPROVED, T0 + 1), ActionState.PROPOSED,
                            "operator:alice", "looks real")
    executing = approved.moved(ActionState.EXECUTING, T0 + 2, attempts=1, adapter="slurm")
    store.update(executing, ActionState.APPROVED, ENGINE_ACTOR)
    assert store.get(rec.id) == executing
    assert store.history(rec.id) == [
        {"at": T0, "from_state": None, "to_state": "proposed", "actor": ENGINE_ACTOR, "note": ""},
        {"at": T0 + 1, "from_state": "proposed", "to_state": "approved", "actor": "operator:alice",
         "note": "looks real"},
        {"at": T0 + 2, "from_state": "approved", "to_state": "executing", "actor": ENGINE_ACTOR, "note": ""},
    ]


def test_update_of_a_record_another_writer_moved_raises_stale_and_writes_nothing(store):
    rec = record()
    store.insert(rec)
    store.update(rec.moved(ActionState.CANCELLED, T0 + 1), ActionState.PROPOSED, "operator:bob")
    with pytest.raises(StaleRecord, match="expected state proposed but it is cancelled") as e:
        store.update(rec.moved(ActionState.APPROVED, T0 + 2), ActionState.PROPOSED, ENGINE_ACTOR)
    assert e.value.current is ActionState.CANCELLED
    assert store.get(rec.id).state is ActionState.CANCELLED
    assert [h["to_state"] for h in store.history(rec.id)] == ["proposed", "cancelled"]


def test_update_of_a_missing_record_raises_stale_naming_that_it_does_not_exist(store):
    rec = record()
    with pytest.raises(StaleRecord, match="does not exist"):
        store.update(rec.moved(ActionState.APPROVED, T0 + 1), ActionState.PROPOSED, ENGINE_ACTOR)


def test_an_illegal_transition_is_refused_before_the_store_is_touched(store):
    rec = record()
    store.insert(rec)
    with pytest.raises(InvalidTransition):
        rec.moved(ActionState.SUCCEEDED, T0 + 1)
    # a record moved legally, but from a state other than the one claimed, is refused too
    with pytest.raises(InvalidTransition):
        store.update(rec.moved(ActionState.APPROVED, T0 + 1), ActionState.EXECUTING, ENGINE_ACTOR)
    assert store.get(rec.id) == rec
    assert len(store.history(rec.id)) == 1


def test_concurrent_moves_of_one_record_from_two_threads_let_exactly_one_win(store):
    rec = record()
    store.insert(rec)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def move(to: ActionState, actor: str) -> None:
        barrier.wait()
        try:
            store.update(rec.moved(to, T0 + 1), ActionState.PROPOSED, actor)
            outcomes.append(actor)
        except StaleRecord:
            outcomes.append("stale")

    threads = [threading.Thread(target=move, args=(ActionState.APPROVED, "engine")),
               threading.Thread(target=move, args=(ActionState.CANCELLED, "operator:carol"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes)[1] == "stale" and sorted(outcomes)[0] != "stale", outcomes
    winner = outcomes[0] if outcomes[0] != "stale" else outcomes[1]
    history = store.history(rec.id)
    assert len(history) == 2 and history[1]["actor"] == winner
    assert store.get(rec.id).state is (ActionState.APPROVED if winner == "engine" else ActionState.CANCELLED)


def test_many_threads_inserting_and_moving_at_once_lose_nothing(store):
    recs = [record(node=f"gpu-node-{i:02d}") for i in range(8)]
    errors: list[BaseException] = []

    def work(r: ActionRecord) -> None:
        try:
            store.insert(r)
            store.update(r.moved(ActionState.APPROVED, T0 + 1), ActionState.PROPOSED, ENGINE_ACTOR)
            store.open_actions()
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in recs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert store.count(since=0, states=[ActionState.APPROVED]) == 8


# ---- queries -------------------------------------------------------------------------------

def test_query_filters_orders_newest_first_and_pages(store):
    recs = [record(node=f"gpu-node-{i % 3:02d}", at=T0 + i,
                   kind=ActionKind.DRAIN if i % 2 else ActionKind.ALERT,
                   actor="operator:dan" if i == 4 else ENGINE_ACTOR) for i in range(10)]
    store.insert_many(recs)
    store.update(recs[1].moved(ActionState.APPROVED, T0 + 20), ActionState.PROPOSED, ENGINE_ACTOR)

    assert [r.created_at for r in store.query()] == [T0 + i for i in range(9, -1, -1)]
    assert [r.created_at for r in store.query(limit=3, offset=2)] == [T0 + 7, T0 + 6, T0 + 5]
    assert store.query(limit=3, offset=10) == []
    assert {r.node for r in store.query(node="gpu-node-01")} == {"gpu-node-01"}
    assert len(store.query(node="gpu-node-01")) == 3
    assert [r.id for r in store.query(states=[ActionState.APPROVED])] == [recs[1].id]
    assert [r.id for r in store.query(states=["approved"])] == [recs[1].id]
    assert all(r.kind is ActionKind.DRAIN for r in store.query(kinds=[ActionKind.DRAIN]))
    assert len(store.query(kinds=["drain", "alert"])) == 10
    assert [r.id for r in store.query(actor="operator:dan")] == [recs[4].id]
    assert [r.created_at for r in store.query(since=T0 + 3, until=T0 + 6)] == [T0 + 5, T0 + 4, T0 + 3]
    assert store.query(node="gpu-node-00", kinds=["drain"], since=T0 + 3) == [recs[3], recs[9]][::-1]


def test_query_refuses_an_unknown_state_naming_the_valid_ones(store):
    with pytest.raises(StoreError, match="valid values: proposed, approved"):
        store.query(states=["drained"])


def test_open_actions_are_those_not_yet_finished_or_verified(store):
    recs = {s: record(node=f"gpu-node-{i:02d}", at=T0 + i, state=s) for i, s in enumerate(ActionState)}
    store.insert_many(list(recs.values()))
    open_states = {r.state for r in store.open_actions()}
    assert open_states == {ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING,
                           ActionState.SUCCEEDED}
    assert [r.state for r in store.open_actions(node="gpu-node-01")] == [ActionState.APPROVED]
    assert store.open_actions(node="gpu-node-07") == []  # cancelled


def test_count_counts_records_created_since_a_time_by_kind_state_and_node(store):
    store.insert_many([record(node=f"gpu-node-{i % 2:02d}", at=T0 + i,
                              kind=ActionKind.DRAIN if i < 6 else ActionKind.REBOOT) for i in range(10)])
    assert store.count(since=T0) == 10
    assert store.count(since=T0 + 4) == 6
    assert store.count(since=T0 + 4, kinds=[ActionKind.DRAIN]) == 2
    assert store.count(since=T0, kinds=["reboot"], node="gpu-node-01") == 2
    assert store.count(since=T0, states=[ActionState.APPROVED]) == 0


# ---- node scores and settings ---------------------------------------------------------------

def test_put_scores_upserts_one_row_per_node(store):
    store.put_scores([NodeScoreRow("gpu-node-02", T0, 0.1, None, 0.2, None, "ok"),
                      NodeScoreRow("gpu-node-01", T0, 0.9, "xid79", 0.7, "xid79_now", "held")])
    store.put_scores([NodeScoreRow("gpu-node-02", T0 + 60, 0.5, "nvlink", 0.3, None, "unknown")])
    store.put_scores([])
    assert store.scores() == [NodeScoreRow("gpu-node-01", T0, 0.9, "xid79", 0.7, "xid79_now", "held"),
                              NodeScoreRow("gpu-node-02", T0 + 60, 0.5, "nvlink", 0.3, None, "unknown")]


def test_settings_store_json_values_and_audit_every_change(store_url):
    clock = iter([T0, T0 + 5.0])
    s = ActionStore(store_url, clock=lambda: next(clock))
    s.migrate()
    try:
        assert s.get_setting("armed") is None
        assert s.get_setting("armed", False) is False
        s.set_setting("armed", True, "operator:erin", "maintenance over")
        s.set_setting("armed", {"until": T0 + 3600, "nodes": ["gpu-node-01"]}, "operator:frank")
        assert s.get_setting("armed") == {"until": T0 + 3600, "nodes": ["gpu-node-01"]}
        assert s.setting_history("armed") == [
            {"at": T0, "value": True, "actor": "operator:erin", "note": "maintenance over"},
            {"at": T0 + 5.0, "value": {"until": T0 + 3600, "nodes": ["gpu-node-01"]},
             "actor": "operator:frank", "note": ""}]
        assert s.setting_history("other") == []
        with pytest.raises(StoreError, match="not JSON-able"):
            s.set_setting("armed", object(), "operator:erin")
    finally:
        s.close()


# ---- schema and lifetime -----------------------------------------------------------------

def test_migrate_is_idempotent_and_yields_exactly_the_tables_the_store_queries(store):
    store.migrate()
    store.migrate()
    engine = sa.create_engine(store.url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
        assert tables == set(METADATA.tables) | {VERSION_TABLE}
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext

        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}), METADATA)
        assert diff == []
    finally:
        engine.dispose()


def test_using_the_store_before_migrate_says_to_migrate(store_url):
    s = ActionStore(store_url)
    try:
        with pytest.raises(StoreError, match="migrate"):
            s.get("x")
    finally:
        s.close()


def test_a_url_that_is_not_a_supported_database_is_refused_with_examples():
    with pytest.raises(StoreError, match="examples: sqlite:////var/lib/gpuops/actions.db"):
        ActionStore("not a url")
    with pytest.raises(StoreError, match="not supported"):
        ActionStore("mysql://u@h/db")


def test_a_second_store_on_the_same_database_sees_committed_records(store):
    rec = record()
    store.insert(rec)
    restarted = ActionStore(store.url)
    try:
        restarted.migrate()
        assert restarted.get(rec.id) == rec
        moved = restarted.update(rec.moved(ActionState.APPROVED, T0 + 1), ActionState.PROPOSED, ENGINE_ACTOR)
        assert store.get(rec.id) == moved
    finally:
        restarted.close()


def test_a_record_survives_closing_and_reopening_a_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'actions.db'}"
    s = ActionStore(url)
    s.migrate()
    rec = record()
    s.insert(rec)
    s.set_setting("armed", True, "operator:gina")
    s.close()
    reopened = ActionStore(url)
    try:
        reopened.migrate()
        assert reopened.get(rec.id) == rec
        assert reopened.get_setting("armed") is True
        assert len(reopened.history(rec.id)) == 1
    finally:
        reopened.close()


def test_an_in_memory_store_works_from_several_threads():
    s = ActionStore("sqlite://")
    s.migrate()
    recs = [record(node=f"gpu-node-{i:02d}") for i in range(6)]
    threads = [threading.Thread(target=s.insert, args=(r,)) for r in recs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(s.open_actions()) == 6
    s.close()


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a hung server, or a network that drops
    replies): its ``(host, port)``."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held: list = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept())
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()
    stop.set()
    t.join(timeout=5)
    for conn, _ in held:
        conn.close()
    srv.close()


def _first_call(url: str) -> tuple[BaseException | None, float | None]:
    """(what a first store call raised, seconds it took; ``None`` when it had not returned after 60 s)."""
    out: list[BaseException] = []

    def call() -> None:
        try:
            ActionStore(url).get_setting("armed")
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=call, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(timeout=60)
    return (out[0] if out else None), (None if t.is_alive() else time.monotonic() - t0)


def test_a_postgresql_server_that_never_answers_fails_the_call_instead_of_holding_it(silent_server):
    host, port = silent_server
    err, took = _first_call(f"postgresql+psycopg://gpuops@{host}:{port}/gpuops")
    assert took is not None, "a store call waited on a silent server for over a minute"
    assert isinstance(err, StoreUnavailable) and "timeout" in str(err)


def test_a_url_that_sets_its_own_connect_timeout_keeps_it(silent_server):
    host, port = silent_server
    err, took = _first_call(f"postgresql+psycopg://gpuops@{host}:{port}/gpuops?connect_timeout=1")
    assert isinstance(err, StoreUnavailable)
    assert took is not None and took < PG_CONNECT_DEFAULTS["connect_timeout"] / 2   # its 1 s, not the default 10
