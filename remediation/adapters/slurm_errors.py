"""What a failed Slurm command means: retry later, or do not retry at all.

One table, :data:`SLURM_ERRORS`, maps the text Slurm's clients print (stderr, stdout, or
the ``errors`` of a ``--json`` answer) to an error class, with where each message was seen.
"transcript" is shared/infra/slurm_transcript.txt (Slurm 22.05.8); "observed" is the
test cluster of deploy/testservices/slurm_up.sh (22.05.8) with slurmctld stopped, or the
adapter tests. The first matching row wins; text that matches no row is permanent (an
error gpuops does not understand is not retried blindly) and carries the full message.
"""

from __future__ import annotations

import re
import subprocess

from remediation.adapters.base import (AdapterError, PermanentAdapterError, TransientAdapterError,
                                       UnknownNode)

#: (pattern, error class, where the message was seen); case-insensitive search
SLURM_ERRORS: tuple[tuple[str, type[AdapterError], str], ...] = (
    # scontrol update / reboot, sbatch -w with a node the controller lacks (transcript)
    (r"Invalid node name specified", UnknownNode, "transcript: scontrol update/reboot gpu-node-99"),
    # scontrol show node gpu-node-99 prints it on stdout with rc=1 (transcript)
    (r"^Node \S+ not found", UnknownNode, "transcript: scontrol show node gpu-node-99"),
    # controller process stopped: every RPC after ~9 s of connect retries (observed)
    (r"Unable to contact slurm controller", TransientAdapterError,
     "observed: scontrol update/reboot, show reservation, sinfo, squeue with slurmctld stopped"),
    # scontrol requeue / update jobid=... with slurmctld stopped (observed)
    (r"Unexpected message received", TransientAdapterError,
     "observed: scontrol requeue J / update jobid=J with slurmctld stopped"),
    # sinfo --json / squeue --json with slurmctld stopped: rc=0 and errors=[{"error": ...}] (observed)
    (r"Unspecified error", TransientAdapterError, "observed: sinfo/squeue --json with slurmctld stopped"),
    # slurm_strerror texts of a refused or stalled connection (Slurm's errno table; not seen here)
    (r"Connection refused", TransientAdapterError, "slurm_strerror(ECONNREFUSED); not observed"),
    (r"Socket timed out", TransientAdapterError, "slurm_strerror(SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT); not observed"),
    (r"Zero Bytes were transmitted or received", TransientAdapterError,
     "slurm_strerror(SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT), e.g. munge restarting; not observed"),
    (r"Slurm backup controller in standby mode|Slurmctld is not responding", TransientAdapterError,
     "slurm_strerror during a controller fail-over; not observed"),
    # scontrol requeue of a job submitted with --no-requeue (observed)
    (r"Requested operation is presently disabled", PermanentAdapterError,
     "observed: scontrol requeue of a --no-requeue job"),
    # scontrol requeue / show job of a job id the controller no longer has (transcript)
    (r"Invalid job id specified", PermanentAdapterError, "transcript: scontrol requeue 99999"),
    # RESUME on a node that is not drained or down (transcript)
    (r"Invalid node state specified", PermanentAdapterError, "transcript: State=RESUME on an idle node"),
    # DRAIN without a reason (transcript); the adapter always sends one
    (r"You must specify a reason", PermanentAdapterError, "transcript: State=DRAIN without Reason="),
    (r"Invalid input", PermanentAdapterError, "transcript: State=BOGUS"),
)

_COMPILED = tuple((re.compile(p, re.IGNORECASE | re.MULTILINE), cls, seen) for p, cls, seen in SLURM_ERRORS)


def classify(message: str, command: str) -> AdapterError:
    """The error to raise for *message* (what Slurm printed) from *command* (for the text)."""
    text = " ".join(message.split()) or "no output"
    for pattern, cls, _seen in _COMPILED:
        if pattern.search(message):
            hint = (" (slurmctld unreachable: check `scontrol ping` and the controller's log; "
                    "gpuops retries later)" if cls is TransientAdapterError else "")
            return cls(f"{command}: {text}{hint}")
    return PermanentAdapterError(f"{command}: unrecognised Slurm failure: {text} "
                                 "(not retried; add it to SLURM_ERRORS if it is transient)")


def classify_timeout(exc: subprocess.TimeoutExpired, command: str) -> TransientAdapterError:
    """A Slurm client that did not answer within the adapter's timeout: retry later."""
    return TransientAdapterError(f"{command}: no answer within {exc.timeout:g} s "
                                 "(slurmctld slow or unreachable; gpuops retries later)")
