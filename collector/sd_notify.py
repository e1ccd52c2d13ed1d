"""systemd's notify protocol (``sd_notify``), so a unit with ``Type=notify`` and ``WatchdogSec`` restarts
an agent whose sampler is stuck, as the Helm chart's liveness probe does on Kubernetes.

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named by ``$NOTIFY_SOCKET``
(a leading ``@`` is Linux's abstract namespace). Without ``$NOTIFY_SOCKET`` (not under systemd, or a
unit of another type) every call does nothing. A failed send is logged once and never raises: the
watchdog missing a ping restarts the agent, which is the point; the agent must not die of it.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify states to ``$NOTIFY_SOCKET`` (read when built)."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET") or None
        self.address = "\0" + addr[1:] if addr and addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        #: the unit's WatchdogSec in seconds (None: no watchdog asked for)
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 else None
        self._warned = False

    def notify(self, state: str) -> bool:
        """Send *state* (e.g. ``READY=1``, ``WATCHDOG=1``); True if sent."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.connect(self.address)
                s.sendall(state.encode())
        except OSError as e:
            if not self._warned:
                log.warning("cannot notify systemd at %r (%s): its watchdog may restart the agent", self.address, e)
                self._warned = True
            return False
        return True
