"""The Slurm adapter: drain, requeue, reboot and resume nodes with ``scontrol``.

Every command runs as an argument list (``subprocess.run``, never a shell) with a timeout,
after :func:`~remediation.adapters.base.validate_node_name` has checked the node name.
State is read with ``sinfo --json``, ``squeue --json`` and ``scontrol -o show reservation``
(Slurm 22.05: ``scontrol`` has no ``--json``, and ``--json`` ignores ``-n``/``-j``, so
filtering happens here; see :mod:`remediation.adapters.slurm_state`).

What each action does (shared/infra/slurm_transcript.txt has the real outputs):

- ``drain``: ``scontrol update nodename=N state=DRAIN reason=R``. Running jobs continue.
  A node already drained by gpuops is left as it is; a node carrying anyone else's reason
  (an admin's drain, a DOWN reason) raises :class:`NotOurs` — gpuops never overwrites it.
  (``scontrol`` has no compare-and-set: an admin drain landing between the read and the
  update is overwritten; the window is one ``sinfo`` round trip, ~20 ms.)
- ``requeue``: drain, then ``scontrol requeue`` each running batch job that allows requeue,
  then — once the job is PENDING — ``scontrol update jobid=J StartTime=now``: a requeued job
  otherwise waits ~120 s (Reason=BeginTime) before it may start again. Jobs that cannot be
  requeued (``--no-requeue``, interactive ``srun``/``salloc``) are left running and reported
  in :attr:`RequeueResult.skipped`.
- ``reboot``: ``scontrol reboot ASAP nextstate=RESUME reason=R N``: Slurm drains the node,
  reboots it once idle (RebootProgram) and returns it to service with the reason cleared.
- ``resume``: ``scontrol update nodename=N state=RESUME`` only when the node's reason is
  gpuops' own (:func:`~remediation.adapters.base.owned`); a node not held is a no-op. On a
  node whose ``reboot ASAP`` still waits for jobs, RESUME also withdraws the reboot (observed:
  ``allocated+drain+reboot_requested`` → ``allocated``, no reboot afterwards).

Where a node sits, for facility grouping (:mod:`remediation.facility`): ``NodeStatus.extra``
carries ``leaf``, the lowest-level switch of the topology plugin (``scontrol show topology``,
topology/tree; read at most every ``topology_refresh_s``), and ``rack``, from the node's
features by the site's convention (a feature ``rack_r07`` is rack ``r07``). A cluster without
a topology plugin or rack features gets neither label, silently, and groups by partition.

Failures are classified by :mod:`remediation.adapters.slurm_errors`; transient ones
(controller unreachable, timeout) are retried ``retries`` times with doubling backoff
through the injected ``sleep``, then raised.

Knobs (constructor keywords; :meth:`SlurmAdapter.from_config` takes the same names from a mapping):

============================  ==========  ====================================================
``scontrol/sinfo/squeue``     path/name   the client binaries (tests point them at fakes)
``slurm_conf``                path        exported as ``SLURM_CONF`` to the clients; None: inherit
``env``                       mapping     the clients' whole environment; None: ``os.environ``
``timeout_s``                 30 s        per command; above Slurm's MessageTimeout (10 s) so an
                                          unreachable controller shows Slurm's own message (~9 s)
``retries``                   2           extra attempts on a transient failure (3 in all)
``backoff_s``                 1 s         first pause between attempts, doubled each time
``requeue_release_timeout_s`` 30 s        how long requeue waits for jobs to leave COMPLETING
                                          (KillWait and epilog) before releasing them
``poll_interval_s``           0.2 s       pause between polls while waiting for that
``rack_feature_prefix``       ``rack_``   a node feature starting with it names the rack
                                          (``rack=`` for ``rack=r07``); None or "": no racks
``topology``                  true        read leaf switches from ``scontrol show topology``
``topology_refresh_s``        300 s       how long one topology read is used: cabling changes
                                          rarely, and it costs a controller round trip
============================  ==========  ====================================================
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from typing import Any, Callable, Mapping

from remediation.actions import REASON_PREFIX
from remediation.adapters.base import (NodeStatus, NotOurs, PermanentAdapterError,
                                       TransientAdapterError, UnknownNode, owned, validate_node_name)
from remediation.adapters.slurm_errors import classify, classify_timeout
from remediation.adapters.slurm_state import (Facility, SlurmJob, json_errors, jobs_on, leaf_switches,
                                              maintenance_reservations, node_status, parse_jobs, parse_nodes)

log = logging.getLogger(__name__)

#: the knobs :meth:`SlurmAdapter.from_config` takes (the table above); the service config checks against it
SETTINGS = frozenset({"scontrol", "sinfo", "squeue", "slurm_conf", "env", "timeout_s", "retries", "backoff_s",
                      "requeue_release_timeout_s", "poll_interval_s", "rack_feature_prefix", "topology",
                      "topology_refresh_s"})


class RequeueResult(list[str]):
    """The job ids requeued (a list, as :meth:`Adapter.requeue` returns), plus what was not.

    ``skipped`` maps a job id left running to why; ``delayed`` lists requeued jobs still
    completing at the deadline: they run again, but only after Slurm's BeginTime (~120 s).
    """

    def __init__(self, requeued: list[str], skipped: dict[str, str], delayed: list[str]) -> None:
        super().__init__(requeued)
        self.skipped = skipped
        self.delayed = delayed


class SlurmAdapter:
    """Drains, requeues, reboots and resumes Slurm nodes through the Slurm command-line clients."""

    name = "slurm"

    def __init__(self, *, scontrol: str = "scontrol", sinfo: str = "sinfo", squeue: str = "squeue",
                 slurm_conf: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
                 timeout_s: float = 30.0, retries: int = 2, backoff_s: float = 1.0,
                 requeue_release_timeout_s: float = 30.0, poll_interval_s: float = 0.2,
                 rack_feature_prefix: str | None = "rack_", topology: bool = True,
                 topology_refresh_s: float = 300.0, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(f"timeout_s must be > 0, retries and backoff_s >= 0 "
                             f"(got {timeout_s}, {retries}, {backoff_s})")
        self.scontrol, self.sinfo, self.squeue = scontrol, sinfo, squeue
        self.env = dict(os.environ if env is None else env)
        if slurm_conf is not None:
            self.env["SLURM_CONF"] = os.fspath(slurm_conf)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.requeue_release_timeout_s = requeue_release_timeout_s
        self.poll_interval_s = poll_interval_s
        self.rack_feature_prefix, self.topology = rack_feature_prefix, topology
        self.topology_refresh_s = topology_refresh_s
        self._leaves: tuple[float, dict[str, str]] | None = None   # (read at, node -> leaf)
        self._sleep, self._clock = sleep, clock

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **injected: Any) -> "SlurmAdapter":
        """An adapter from a settings mapping (the knobs above); ``injected``: sleep, clock."""
        unknown = set(config) - SETTINGS
        if unknown:
            raise ValueError(f"unknown Slurm adapter setting(s) {sorted(unknown)}; valid: {sorted(SETTINGS)}")
        return cls(**dict(config), **injected)

    # ---- actions --------------------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        validate_node_name(node)
        _check_reason(reason)
        now = self._held(node)
        if not now.exists:
            raise UnknownNode(f"drain {node}: Slurm has no node {node} (check `sinfo -N`)")
        if now.drained and now.ours:
            return
        if now.reason and not now.ours:
            raise NotOurs(f"drain {node}: the node already carries someone else's reason "
                          f"{now.reason!r} ({now.raw_state}); gpuops leaves it alone")
        self._scontrol("update", f"nodename={node}", "state=DRAIN", f"reason={reason}")

    def requeue(self, node: str, reason: str) -> RequeueResult:
        self.drain(node, reason)
        skipped: dict[str, str] = {}
        requeued: list[str] = []
        for job in jobs_on(self._jobs(), node):
            if job.state != "RUNNING":
                continue  # completing / suspended: nothing to send elsewhere now
            if not job.batch:
                skipped[job.job_id] = "interactive (srun/salloc): Slurm requeues only batch jobs"
            elif not job.requeueable:
                skipped[job.job_id] = "submitted with --no-requeue"
            else:
                try:
                    self._scontrol("requeue", job.job_id)
                    requeued.append(job.job_id)
                except PermanentAdapterError as e:  # ended meanwhile, or requeue disabled
                    skipped[job.job_id] = str(e)
        delayed = self._release(requeued)
        for job_id, why in skipped.items():
            log.warning("requeue %s: job %s left running: %s", node, job_id, why)
        return RequeueResult(requeued, skipped, delayed)

    def reboot(self, node: str, reason: str) -> None:
        validate_node_name(node)
        _check_reason(reason)
        now = self._held(node)
        if not now.exists:
            raise UnknownNode(f"reboot {node}: Slurm has no node {node} (check `sinfo -N`)")
        if now.reason and not now.ours:
            raise NotOurs(f"reboot {node}: the node carries someone else's reason {now.reason!r} "
                          f"({now.raw_state}); gpuops leaves it alone")
        if now.rebooting and now.ours:
            return
        self._scontrol("reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node)

    def resume(self, node: str, reason: str) -> None:
        validate_node_name(node)
        _check_reason(reason)
        now = self._held(node)
        if not now.exists:
            raise UnknownNode(f"resume {node}: Slurm has no node {node} (check `sinfo -N`)")
        if not (now.drained or now.down):
            return
        if not now.ours:
            raise NotOurs(f"resume {node}: held by someone else (reason {now.reason!r}, {now.raw_state}); "
                          "gpuops only resumes its own drains")
        try:
            self._scontrol("update", f"nodename={node}", "state=RESUME")
        except PermanentAdapterError:
            if self._held(node).drained:  # "Invalid node state": resumed meanwhile is fine
                raise

    # ---- state ----------------------------------------------------------------------

    def status(self, node: str) -> NodeStatus:
        validate_node_name(node)
        record = self._node_record(node)
        if record is None:
            return NodeStatus(name=node, exists=False)
        return node_status(record, self._jobs(), self._maintenance(), self._facility())

    def list_nodes(self) -> list[NodeStatus]:
        return parse_nodes(self._json(self.sinfo, "--json"), self._json(self.squeue, "--json"),
                           self._reservations(), self._facility())

    # ---- internals ------------------------------------------------------------------

    def _node_record(self, node: str) -> dict[str, Any] | None:
        sinfo = self._json(self.sinfo, "--json")
        return next((n for n in sinfo.get("nodes") or [] if n.get("name") == node), None)

    def _held(self, node: str) -> NodeStatus:
        """The node's state, drain and reason only (one ``sinfo``): enough to decide ownership."""
        record = self._node_record(node)
        return NodeStatus(name=node, exists=False) if record is None else node_status(record, (), set())

    def _jobs(self) -> list[SlurmJob]:
        return parse_jobs(self._json(self.squeue, "--json"))

    def _maintenance(self) -> dict[str, str]:
        return maintenance_reservations(self._reservations())

    def _facility(self) -> Facility:
        return Facility(self._leaf_switches(), self.rack_feature_prefix)

    def _leaf_switches(self) -> dict[str, str]:
        """Node -> leaf switch, re-read every ``topology_refresh_s``. No topology plugin: empty
        (Slurm prints nothing). A failed read keeps the last one and is logged once per refresh."""
        if not self.topology:
            return {}
        now = self._clock()
        if self._leaves is not None and now - self._leaves[0] < self.topology_refresh_s:
            return self._leaves[1]
        last = self._leaves[1] if self._leaves is not None else {}
        try:
            leaves = leaf_switches(self._run([self.scontrol, "show", "topology"]))
        except (PermanentAdapterError, TransientAdapterError) as e:
            log.warning("cannot read the Slurm topology (%s); leaf switches as last read (%d nodes)", e, len(last))
            leaves = last
        self._leaves = (now, leaves)
        return leaves

    def _reservations(self) -> str:
        return self._run([self.scontrol, "-o", "show", "reservation"])

    def _release(self, job_ids: list[str]) -> list[str]:
        """``StartTime=now`` for each requeued job once PENDING; the ids still completing at the deadline."""
        waiting = set(job_ids)
        deadline = self._clock() + self.requeue_release_timeout_s
        while waiting:
            states = {j.job_id: j.state for j in self._jobs()}
            for job_id in sorted(waiting):
                state = states.get(job_id)
                if state == "PENDING":
                    self._scontrol("update", f"jobid={job_id}", "StartTime=now")
                    waiting.discard(job_id)
                elif state is None or state not in ("COMPLETING", "RUNNING", "CONFIGURING"):
                    waiting.discard(job_id)  # cancelled or gone meanwhile: nothing to release
            if not waiting or self._clock() >= deadline:
                break
            self._sleep(self.poll_interval_s)
        if waiting:
            log.warning("requeued jobs %s still completing after %g s: they start after Slurm's BeginTime",
                        sorted(waiting), self.requeue_release_timeout_s)
        return sorted(waiting)

    def _scontrol(self, *args: str) -> str:
        return self._run([self.scontrol, *args])

    def _json(self, binary: str, *args: str) -> dict[str, Any]:
        def parse(out: str) -> dict[str, Any]:
            try:
                document = json.loads(out)
            except json.JSONDecodeError as e:
                raise PermanentAdapterError(f"{binary} {' '.join(args)}: not JSON ({e}): {out[:200]!r}") from None
            errors = json_errors(document)
            if errors:
                raise classify("\n".join(errors), f"{binary} {' '.join(args)}")
            return document
        return self._run([binary, *args], parse)

    def _run(self, argv: list[str], parse: Callable[[str], Any] = lambda out: out) -> Any:
        """Run *argv* (retrying transient failures) and return ``parse(stdout)``."""
        command = " ".join(argv)
        for attempt in range(self.retries + 1):
            try:
                return parse(self._once(argv, command))
            except TransientAdapterError as e:
                if attempt == self.retries:
                    raise TransientAdapterError(f"{e} [gave up after {attempt + 1} attempts]",
                                                retry_after_s=self.backoff_s * 2 ** attempt) from e
                pause = self.backoff_s * 2 ** attempt
                log.info("%s (attempt %d of %d; again in %g s)", e, attempt + 1, self.retries + 1, pause)
                self._sleep(pause)
        raise AssertionError("unreachable")

    def _once(self, argv: list[str], command: str) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  env=self.env, check=False)
        except subprocess.TimeoutExpired as e:
            raise classify_timeout(e, command) from None
        except OSError as e:  # binary missing or not executable: configuration, not weather
            raise PermanentAdapterError(f"{command}: cannot run {argv[0]!r} ({e}); install slurm-client "
                                        "or set the adapter's scontrol/sinfo/squeue paths") from None
        if done.returncode != 0:
            raise classify(f"{done.stderr}\n{done.stdout}".strip(), command)
        return done.stdout


def _check_reason(reason: str) -> None:
    if not isinstance(reason, str) or not owned(reason):
        raise PermanentAdapterError(f"reason {reason!r} must start with {REASON_PREFIX!r} "
                                    "(build it with remediation.actions.scheduler_reason)")
    if "\n" in reason or len(reason) > 1024:
        raise PermanentAdapterError(f"reason must be one line of at most 1024 characters (got {len(reason)})")
