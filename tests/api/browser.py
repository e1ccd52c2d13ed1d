"""Selenium helpers for the dashboard's browser tests: polled finds (the page draws after its fetches
answer), clicks and reads that survive a redraw, the note prompt, and screenshots kept as artefacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tests.helpers import wait_until


def shot(driver: Any, out: Path, name: str) -> Path:
    """Save a PNG of the window as *out*/*name*.png and print its path (a test artefact)."""
    path = out / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def find(driver: Any, css: str, timeout_s: float = 20) -> Any:
    """The first element matching *css*, polled (the page draws after its fetches answer)."""
    from selenium.webdriver.common.by import By

    return wait_until(lambda: (driver.find_elements(By.CSS_SELECTOR, css) or [None])[0], timeout_s=timeout_s,
                      interval_s=0.1, message=f"an element {css!r} on {driver.current_url}")


def retry_stale(fn: Callable[[], Any], timeout_s: float = 20) -> Any:
    """Run *fn* until it does not hit an element the page redrew meanwhile (the fleet redraws every 5 s)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt() -> Any:
        try:
            return fn() or True
        except StaleElementReferenceException:
            return None
    return wait_until(attempt, timeout_s=timeout_s, interval_s=0.1, message="a click on a steady element")


def read(driver: Any, css: str, get: Callable[[Any], Any], timeout_s: float = 20) -> Any:
    """*get*(element) of the first element matching *css*, found again when the page redrew it
    between the find and the read (the fleet and the queues redraw every few seconds)."""
    from selenium.common.exceptions import StaleElementReferenceException

    got: list[Any] = []

    def attempt() -> bool | None:
        try:
            got[:] = [get(find(driver, css, timeout_s))]
            return True
        except StaleElementReferenceException:
            return None
    wait_until(attempt, timeout_s=timeout_s, interval_s=0.1, message=f"a steady element {css!r}")
    return got[0]


def alert(driver: Any) -> Any:
    """The open prompt or alert, or None."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None
