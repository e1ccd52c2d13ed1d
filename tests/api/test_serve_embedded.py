"""``gpuops serve`` with no config: the whole loop in one process, with no external service.

The simulated fleet feeds the in-process bus, the scoring worker scores it, the engine
(leader of its own SQLite store) decides in dry run, and the API lists the nodes to the
admin token the service printed. Polls with deadlines; no sleeps.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from api.config import load_service_config
from api.service import Service
from tests.helpers import wait_until



@pytest.fixture
def service(tmp_path: Path):  # noqa: ANN201
    cfg = load_service_config(None, port=0, state_dir=str(tmp_path), simulate={"speedup": 120})
    svc = Service(cfg).start()
    yield svc
    svc.stop()


@pytest.mark.timeout(90)
def test_embedded_default_lists_the_simulated_fleet_and_records_dry_run_actions(service: Service) -> None:
    assert service.cfg.host == "127.0.0.1" and service.admin_token
    auth = {"Authorization": f"Bearer {service.admin_token}"}

    def listed() -> int:
        return httpx.get(f"{service.url}/v1/nodes", headers=auth, timeout=5).json()["count"]

    assert wait_until(listed, timeout_s=40, interval_s=0.25) == 16
    assert httpx.get(f"{service.url}/v1/nodes", timeout=5).status_code == 401
    assert service.elector.is_leader() and service.engine.acting
    recs = wait_until(lambda: service.store.query(limit=50), timeout_s=40, interval_s=0.25,
                      message="an action recorded")
    assert all(r.dry_run and r.adapter == "dryrun" for r in recs)


def test_shutdown_releases_the_lease_and_stops_every_thread(tmp_path: Path) -> None:
    cfg = load_service_config(None, port=0, state_dir=str(tmp_path), simulate={"speedup": 120})
    svc = Service(cfg).start()
    wait_until(lambda: svc.feed.ticks > 0, timeout_s=40, interval_s=0.1)
    svc.stop()
    assert all(not loop.thread.is_alive() for loop in svc._loops)
    assert not svc._api_thread.is_alive()
    from remediation.store import ActionStore

    store = ActionStore(cfg.resolved_store_url)
    assert store.lease_holder("engine") is None
    store.close()


@pytest.mark.timeout(90)
def test_a_shadow_policy_is_decided_on_the_live_ticks_and_shown_beside_the_live_one(tmp_path: Path) -> None:
    cfg = load_service_config(None, port=0, state_dir=str(tmp_path), simulate={"speedup": 120},
                              shadow_policies={"rules-only": {"use_model": False}})
    svc = Service(cfg).start()
    try:
        auth = {"Authorization": f"Bearer {svc.admin_token}"}

        def shadow() -> dict:
            body = httpx.get(f"{svc.url}/v1/engine/shadow", headers=auth, timeout=5).json()
            return body if body["ticks"] >= 3 else {}

        body = wait_until(shadow, timeout_s=40, interval_s=0.25, message="three ticks decided by the shadow")
        assert body["leader"] is True and list(body["shadows"]) == ["rules-only"]
        assert body["shadows"]["rules-only"]["policy"]["use_model"] is False
        assert 'gpuops_shadow_decisions' in httpx.get(f"{svc.url}/metrics", headers=auth, timeout=5).text
    finally:
        svc.stop()
