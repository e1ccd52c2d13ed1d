"""The dashboard's sign-in and roles in headless Chromium, on the API test context (tests/api/conftest.py):
a wrong token goes back to the login box with the server's message, and a viewer's approval shows
the server's 403 message and leaves the action waiting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.context import AppContext
from remediation.actions import ActionState
from tests.api.conftest import FLEET, TOKENS
from tests.api.browser import alert, find, read, retry_stale, shot
from tests.helpers import wait_until
from tests.remediation.test_engine import explain, fleet

pytestmark = pytest.mark.browser


def _waiting_drain(ctx: AppContext) -> str:
    """Pause the engine and let it propose a drain of n00003 (held for a person)."""
    ctx.engine.pause("operator:test", "hold proposals for the test")
    ctx.clock.t += 60.0                                            # type: ignore[attr-defined]
    ctx.engine.tick(fleet(FLEET, ctx.clock.t, rule_nodes=[3]), explain)  # type: ignore[attr-defined]
    recs = ctx.store.query(states=[ActionState.PROPOSED], node="n00003")
    assert recs, ctx.store.query(node="n00003")
    return recs[0].id


def _sign_in(driver: Any, url: str, token: str) -> None:
    driver.get(url + "/ui/")
    find(driver, "#token").send_keys(token)
    find(driver, "#login-submit").click()


@pytest.mark.timeout(120)
def test_a_wrong_token_goes_back_to_the_login_box_with_the_servers_message(live_api: str, browser: Any,
                                                                          artefacts: Path) -> None:
    _sign_in(browser, live_api, "not-a-token")
    err = wait_until(lambda: read(browser, "#login-error", lambda e: e.text), timeout_s=20, message="the login error")
    assert "bearer token is required" in err and find(browser, "#login").is_displayed()
    shot(browser, artefacts, "wrong-token")
    _sign_in(browser, live_api, TOKENS["viewer"])
    wait_until(lambda: len(browser.find_elements("css selector", ".tile")) == FLEET, timeout_s=20,
               message="the fleet's tiles")
    assert not find(browser, "#login").is_displayed()


@pytest.mark.timeout(120)
def test_a_viewer_who_approves_sees_the_servers_403_and_the_action_keeps_waiting(
        api_ctx: AppContext, live_api: str, browser: Any, artefacts: Path) -> None:
    aid = _waiting_drain(api_ctx)
    _sign_in(browser, live_api, TOKENS["viewer"])
    find(browser, ".tile")
    browser.get(live_api + "/ui/#/actions")
    retry_stale(lambda: find(browser, f'#queue tr[data-id="{aid}"] button.approve').click())
    prompt = wait_until(lambda: alert(browser), timeout_s=10, message="the note prompt")
    prompt.accept()
    flash = wait_until(lambda: (lambda t: t if "refused" in t else None)(read(browser, "#flash", lambda e: e.text)),
                       timeout_s=20, message="the refusal on screen")
    assert "has role viewer; this needs operator" in flash
    assert "error" in read(browser, "#flash", lambda e: e.get_attribute("class"))
    shot(browser, artefacts, "viewer-403")
    assert api_ctx.store.get(aid).state is ActionState.PROPOSED
    assert read(browser, f'#queue tr[data-id="{aid}"]', lambda e: e.get_attribute("data-state")) == "proposed"
