"""Wire format of the commands the engine sends a node agent (``gpu.commands``), owned by the collector.

The collector owns it, as it owns ``collector/wire.py``: the agent obeys it and the
remediation engine imports it (imports run one way). A command is a signed,
expiring request for one fixed verb on one GPU of one node::

    {"schema": "gpuops.command", "v": 1,
     "body": "{\\"expires_at\\":…,\\"gpu\\":3,\\"id\\":\\"…\\",…,\\"verb\\":\\"gpu_reset\\"}",
     "sig": "<64 hex digits: HMAC-SHA256(key, body)>"}

``body`` is the command as canonical JSON (sorted keys, no spaces, ASCII) carried as a
string, so the receiver authenticates the exact bytes that were signed *before* it parses
them, and no JSON library's float or escape spelling can break a signature. The message
is keyed by node name on ``gpu.commands``.

:func:`verify` refuses anything it cannot vouch for with :class:`CommandRejected`, whose
``reason`` is one :class:`RejectReason`. The order of checks is: size and envelope
(``malformed``), signature present (``unsigned``) and valid (``bad_signature``), body
fields (``malformed``), ``unknown_verb``, ``foreign_node``, ``bad_gpu``, time
(``not_yet_valid`` / ``expired``, each with ``max_skew_s`` of slack), ``replayed``.

The agent answers on ``gpu.events`` with a :class:`CommandResult`, carried as an ordinary
event of spec/telemetry.md §3 (:func:`result_event`): ``source="agent"``,
``kind="command_result"``, ``gpu`` the GPU, ``message`` a one-line summary, plus three
extra columns ``command_id``, ``status`` and ``detail`` (the contract keeps extra columns,
and consumers that only know XIDs skip other kinds). :func:`result_from_event` reads one
back. ``detail`` starts with a code word (``busy``, ``reset_failed``, a reject reason…)
then ``": "`` and words for a person.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import orjson

from collector.schema import NODE_NAME_RE
from collector.wire import WireError, decode_event

TOPIC_COMMANDS = "gpu.commands"
SCHEMA_COMMAND = "gpuops.command"
#: Version of the command envelope and body; bump on any incompatible change.
COMMAND_VERSION = 1
SUPPORTED_COMMAND_VERSIONS = frozenset({1})

#: The event a result travels as on ``gpu.events`` (spec §3: source, kind).
RESULT_SOURCE = "agent"
RESULT_KIND = "command_result"

#: Bounds on what a command may hold; anything outside is ``malformed`` (or ``bad_gpu``).
MAX_MESSAGE_BYTES = 4096          # a command is ~400 bytes; this stops a huge message before JSON parsing
MAX_REASON_CHARS = 512            # the engine's reason ("gpuops: …"), for logs and the audit
MAX_LIFETIME_S = 3600.0           # expires_at - issued_at: bounds the replay memory's window
MAX_GPU_INDEX = 255               # NVML indexes; no node has 256 GPUs
MAX_DETAIL_CHARS = 512            # a result's detail
MIN_KEY_BYTES = 32                # HMAC-SHA256 key: at least its block of entropy (`openssl rand -hex 32`)
_TIME_RANGE = (0.0, 1e11)         # seconds since the epoch: 1970 .. year 5138
COMMAND_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_NONCE_RE = re.compile(r"^[0-9a-f]{16,64}$")
_SIG_RE = re.compile(r"^[0-9a-f]{64}$")
_BODY_FIELDS = frozenset({"v", "id", "verb", "node", "gpu", "issued_at", "expires_at", "nonce", "reason"})


class Verb(str, enum.Enum):
    """What a command may ask of the agent: a fixed list, grown only by a code change."""

    GPU_RESET = "gpu_reset"


class ResultStatus(str, enum.Enum):
    """How a command ended on the node."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"


class RejectReason(str, enum.Enum):
    """Why :func:`verify` refused a command (one word each, for logs, counters and results)."""

    MALFORMED = "malformed"
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    FOREIGN_NODE = "foreign_node"
    UNKNOWN_VERB = "unknown_verb"
    REPLAYED = "replayed"
    BAD_GPU = "bad_gpu"


class CommandRejected(ValueError):
    """A command the agent will not carry out; ``reason`` says why, ``str()`` says it for a person.

    ``command`` holds the body's fields when the signature was valid (so the command is
    the engine's own), else ``None``: only then may an answer be published for it.
    """

    def __init__(self, reason: RejectReason, message: str, command: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.command = dict(command) if command is not None else None


class CommandKeyError(ValueError):
    """The shared command key cannot be used (missing, readable by anyone, too short)."""


@dataclass(frozen=True)
class Command:
    """One signed request to a node agent. Times are s since the epoch (the engine's clock).

    ``id`` is the engine's action id, so the result lands on the action's record.
    """

    id: str
    verb: str
    node: str
    gpu: int
    issued_at: float
    expires_at: float
    nonce: str
    reason: str
    v: int = COMMAND_VERSION

    def body(self) -> dict[str, Any]:
        """The signed fields, as a JSON object."""
        return {"v": self.v, "id": self.id, "verb": self.verb, "node": self.node, "gpu": self.gpu,
                "issued_at": self.issued_at, "expires_at": self.expires_at, "nonce": self.nonce,
                "reason": self.reason}


@dataclass(frozen=True)
class CommandResult:
    """How one command ended on its node; ``at`` is the agent's wall time (s since the epoch)."""

    command_id: str
    node: str
    gpu: int | None
    status: ResultStatus
    detail: str
    at: float

    @property
    def code(self) -> str:
        """The code word that starts ``detail`` (``busy``, ``reset_failed``, ``expired``…)."""
        return self.detail.split(":", 1)[0]


# --------------------------------------------------------------------------- signing


def _canonical(body: Mapping[str, Any]) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def _mac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def check_key(key: bytes) -> bytes:
    """*key* if it is long enough to sign with, else :class:`CommandKeyError`."""
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise CommandKeyError(f"the command key must be at least {MIN_KEY_BYTES} bytes "
                              f"(make one with `openssl rand -hex 32`)")
    return key


def sign(command: Command, key: bytes) -> bytes:
    """The envelope of *command* signed with *key*: bytes ready for ``gpu.commands``."""
    body = _canonical(command.body())
    return orjson.dumps({"schema": SCHEMA_COMMAND, "v": command.v, "body": body.decode(),
                         "sig": _mac(check_key(key), body)})


def load_key(path: Path | str) -> bytes:
    """Read the shared key from *path* (surrounding whitespace stripped).

    Refuses a file that other users may read or write (the key lets anyone who holds it
    reset GPUs): ``chmod 600`` it, owned by the agent's user.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            raise CommandKeyError(f"command key file {path} is readable or writable by every user "
                                  f"(mode {stat.filemode(mode)}); run `chmod 600 {path}`")
        with open(path, "rb") as f:
            key = f.read(4097).strip()
    except OSError as e:
        raise CommandKeyError(f"cannot read the command key file {path}: {e.strerror or e}") from None
    if not key:
        raise CommandKeyError(f"command key file {path} is empty (make one with `openssl rand -hex 32`)")
    try:
        return check_key(key)
    except CommandKeyError as e:
        raise CommandKeyError(f"{path}: {e}") from None


# --------------------------------------------------------------------------- verifying


class ReplayGuard:
    """Command ids and nonces already accepted, each remembered until its command expires.

    Bounded: at most *max_entries* commands. An entry is forgotten once its time has
    passed (expiry plus skew); when the memory is full of live entries the one expiring
    soonest is forgotten and counted in ``evicted``. Only commands with a valid signature
    are remembered, and they live at most :data:`MAX_LIFETIME_S`, so only a flood of the
    engine's own commands (thousands within an hour, to one node) could reach the bound.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._by_id: dict[str, tuple[str, float]] = {}  # id -> (nonce, forget after)
        self._nonces: set[str] = set()
        self.evicted = 0

    def seen(self, command: Command) -> bool:
        """True when *command*'s id or nonce was accepted before (and not yet forgotten)."""
        return command.id in self._by_id or command.nonce in self._nonces

    def remember(self, command: Command, forget_after: float) -> None:
        """Remember *command* until *forget_after* (wall time, s since the epoch)."""
        self._by_id[command.id] = (command.nonce, forget_after)
        self._nonces.add(command.nonce)
        while len(self._by_id) > self.max_entries:
            self._forget(min(self._by_id, key=lambda cid: self._by_id[cid][1]))
            self.evicted += 1

    def purge(self, now: float) -> None:
        """Forget every command whose time has passed."""
        for cid in [cid for cid, (_, until) in self._by_id.items() if until < now]:
            self._forget(cid)

    def _forget(self, cid: str) -> None:
        nonce, _ = self._by_id.pop(cid)
        self._nonces.discard(nonce)

    def __len__(self) -> int:
        return len(self._by_id)


def _number(body: Mapping[str, Any], name: str) -> float:
    v = body.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not _TIME_RANGE[0] <= v <= _TIME_RANGE[1]:
        raise CommandRejected(RejectReason.MALFORMED, f"'{name}' must be a time in s since the epoch, got {v!r}",
                              body)
    return float(v)


def _string(body: Mapping[str, Any], name: str, pattern: re.Pattern[str] | None, max_chars: int) -> str:
    v = body.get(name)
    if not isinstance(v, str) or len(v) > max_chars or (pattern is not None and not pattern.match(v)):
        shown = v[:80] if isinstance(v, str) else v
        raise CommandRejected(RejectReason.MALFORMED, f"'{name}' is missing or malformed: {shown!r}", body)
    return v


def _version_ok(v: Any) -> bool:
    return type(v) is int and v in SUPPORTED_COMMAND_VERSIONS  # not True, not 1.0


def _envelope(raw: bytes) -> tuple[bytes, str | None]:
    """The body bytes and the signature (``None`` when absent) of an envelope."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise CommandRejected(RejectReason.MALFORMED, f"message is {type(raw).__name__}, not bytes")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise CommandRejected(RejectReason.MALFORMED, f"message is {len(raw)} bytes (limit {MAX_MESSAGE_BYTES})")
    try:
        env = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CommandRejected(RejectReason.MALFORMED, f"not valid JSON: {e}") from None
    if not isinstance(env, dict) or env.get("schema") != SCHEMA_COMMAND:
        raise CommandRejected(RejectReason.MALFORMED, f"not a {SCHEMA_COMMAND} message")
    if not _version_ok(env.get("v")):
        raise CommandRejected(RejectReason.MALFORMED, f"unsupported command version {env.get('v')!r} "
                                                      f"(supported: {sorted(SUPPORTED_COMMAND_VERSIONS)})")
    body = env.get("body")
    if not isinstance(body, str):
        raise CommandRejected(RejectReason.MALFORMED, "'body' must be a string of JSON")
    sig = env.get("sig")
    if sig is not None and not (isinstance(sig, str) and _SIG_RE.match(sig)):
        raise CommandRejected(RejectReason.BAD_SIGNATURE, "'sig' is not 64 lower-case hex digits")
    return body.encode(), sig


def verify(raw: bytes, key: bytes, *, node: str, now: float, max_skew_s: float,
           replay: ReplayGuard | None = None, gpu_count: int | None = None) -> Command:
    """The :class:`Command` in *raw* if this node should carry it out now; else :class:`CommandRejected`.

    *now* is this node's wall time; a command is accepted from ``issued_at - max_skew_s``
    to ``expires_at + max_skew_s``. With *replay*, an id or nonce seen before is
    ``replayed`` and an accepted command is remembered; without it this function keeps
    no state. With *gpu_count*, a GPU index at or above it is ``bad_gpu``.
    """
    body_bytes, sig = _envelope(raw)
    if sig is None:
        raise CommandRejected(RejectReason.UNSIGNED, "the message carries no signature")
    if not hmac.compare_digest(_mac(key, body_bytes), sig):
        raise CommandRejected(RejectReason.BAD_SIGNATURE, "the signature does not match (wrong key or altered)")
    # from here the body is the engine's own: a rejection may be answered
    try:
        body = orjson.loads(body_bytes)
    except orjson.JSONDecodeError as e:
        raise CommandRejected(RejectReason.MALFORMED, f"body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise CommandRejected(RejectReason.MALFORMED, "body is not a JSON object")
    fields = {k: body.get(k) for k in _BODY_FIELDS if not isinstance(body.get(k), (dict, list))}
    if set(body) != _BODY_FIELDS:
        missing, extra = sorted(_BODY_FIELDS - set(body)), sorted(map(str, set(body) - _BODY_FIELDS))[:5]
        raise CommandRejected(RejectReason.MALFORMED, f"body fields wrong: missing {missing}, unknown {extra}", fields)
    if not _version_ok(body["v"]):
        raise CommandRejected(RejectReason.MALFORMED, f"unsupported body version {body['v']!r}", fields)
    cid = _string(fields, "id", COMMAND_ID_RE, 64)
    verb = _string(fields, "verb", None, 64)
    target = _string(fields, "node", NODE_NAME_RE, 63)
    nonce = _string(fields, "nonce", _NONCE_RE, 64)
    reason = _string(fields, "reason", None, MAX_REASON_CHARS)
    issued_at, expires_at = _number(fields, "issued_at"), _number(fields, "expires_at")
    if not 0 < expires_at - issued_at <= MAX_LIFETIME_S:
        raise CommandRejected(RejectReason.MALFORMED, f"lifetime {expires_at - issued_at:.0f} s is outside "
                                                      f"(0, {MAX_LIFETIME_S:.0f}] s", fields)
    if verb not in {v.value for v in Verb}:
        raise CommandRejected(RejectReason.UNKNOWN_VERB, f"verb {verb[:64]!r} is not one this agent knows "
                                                         f"({', '.join(v.value for v in Verb)})", fields)
    if target != node:
        raise CommandRejected(RejectReason.FOREIGN_NODE, f"command is for node {target!r}, this is {node!r}", fields)
    gpu = fields["gpu"]
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu <= MAX_GPU_INDEX \
            or (gpu_count is not None and gpu >= gpu_count):
        have = f"this node has {gpu_count} GPUs" if gpu_count is not None else f"0..{MAX_GPU_INDEX}"
        raise CommandRejected(RejectReason.BAD_GPU, f"GPU index {gpu!r} is not valid ({have})", fields)
    if now < issued_at - max_skew_s:
        raise CommandRejected(RejectReason.NOT_YET_VALID, f"issued {issued_at - now:.1f} s in the future "
                                                          f"(more than the {max_skew_s:g} s clock skew allowed)",
                              fields)
    if now > expires_at + max_skew_s:
        raise CommandRejected(RejectReason.EXPIRED, f"expired {now - expires_at:.1f} s ago", fields)
    command = Command(id=cid, verb=verb, node=target, gpu=gpu, issued_at=issued_at, expires_at=expires_at,
                      nonce=nonce, reason=reason, v=body["v"])
    if replay is not None:
        replay.purge(now)
        if replay.seen(command):
            raise CommandRejected(RejectReason.REPLAYED, f"command {cid} (or its nonce) was already accepted",
                                  fields)
        replay.remember(command, expires_at + max_skew_s)
    return command


# --------------------------------------------------------------------------- results


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def result_event(result: CommandResult) -> dict[str, Any]:
    """*result* as a spec §3 event record for ``gpu.events`` (see the module docstring)."""
    return {"ts": result.at, "node": result.node, "gpu": result.gpu, "source": RESULT_SOURCE, "kind": RESULT_KIND,
            "code": None, "pci_bus_id": None,
            "message": _clip(f"command {result.command_id} {result.status.value}: {result.detail}", 1024),
            "command_id": result.command_id, "status": result.status.value,
            "detail": _clip(result.detail, MAX_DETAIL_CHARS)}


def result_from_event(event: Mapping[str, Any] | bytes) -> CommandResult | None:
    """The :class:`CommandResult` an event carries, or ``None`` for any other (or malformed) event.

    Accepts a decoded event record or the raw ``gpu.events`` message bytes.
    """
    if isinstance(event, (bytes, bytearray, str)):
        try:
            event = decode_event(event)
        except WireError:
            return None
    if not isinstance(event, Mapping) or event.get("kind") != RESULT_KIND or event.get("source") != RESULT_SOURCE:
        return None
    try:
        status = ResultStatus(event.get("status"))
    except ValueError:
        return None
    cid, node, detail, at, gpu = (event.get(k) for k in ("command_id", "node", "detail", "ts", "gpu"))
    if not (isinstance(cid, str) and COMMAND_ID_RE.match(cid) and isinstance(node, str)
            and isinstance(detail, str)):
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
        return None
    return CommandResult(command_id=cid, node=node, gpu=gpu, status=status, detail=detail, at=float(at))


def new_nonce() -> str:
    """A fresh random nonce (128 bits, hex) for a command."""
    return os.urandom(16).hex()
