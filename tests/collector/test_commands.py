"""The command format: signing, and every reason verify() refuses a command for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest

from collector.commands import (MAX_MESSAGE_BYTES, Command, CommandKeyError, CommandRejected, CommandResult,
                                RejectReason, ReplayGuard, ResultStatus, load_key, result_event,
                                result_from_event, sign, verify)
from collector.schema import RecordType, validate_record
from collector.wire import decode_event, encode_event

KEY = b"k" * 32
NOW = 1_767_225_600.0
NODE = "gpu-node-007"


def _command(**kw) -> Command:
    base = dict(id="a1b2c3d4e5f6a7b8c9d0", verb="gpu_reset", node=NODE, gpu=3, issued_at=NOW, expires_at=NOW + 300,
                nonce="0123456789abcdef0123456789abcdef", reason="gpuops: pending row remap, node idle")
    return Command(**{**base, **kw})


def _verify(raw: bytes, **kw) -> Command:
    args = dict(node=NODE, now=NOW + 1, max_skew_s=30.0)
    return verify(raw, KEY, **{**args, **kw})


def _reason(raw: bytes, **kw) -> RejectReason:
    with pytest.raises(CommandRejected) as e:
        _verify(raw, **kw)
    return e.value.reason


def _resign(raw: bytes, change) -> bytes:
    """*raw* with its body changed by *change* (a function of the body dict) and signed again."""
    import hashlib
    import hmac

    env = orjson.loads(raw)
    body = orjson.loads(env["body"])
    change(body)
    b = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return orjson.dumps({**env, "body": b.decode(), "sig": hmac.new(KEY, b, hashlib.sha256).hexdigest()})


def test_a_signed_command_verifies_to_the_same_command() -> None:
    cmd = _command()
    assert _verify(sign(cmd, KEY)) == cmd


def test_the_envelope_carries_the_exact_signed_body_and_a_hex_signature() -> None:
    env = orjson.loads(sign(_command(), KEY))
    assert env["schema"] == "gpuops.command" and env["v"] == 1 and len(env["sig"]) == 64
    assert orjson.loads(env["body"])["verb"] == "gpu_reset"


def test_a_forged_signature_is_bad_signature() -> None:
    assert _reason(sign(_command(), b"x" * 32)) is RejectReason.BAD_SIGNATURE


def test_a_body_altered_after_signing_is_bad_signature() -> None:
    env = orjson.loads(sign(_command(gpu=3), KEY))
    env["body"] = env["body"].replace('"gpu":3', '"gpu":4')
    assert _reason(orjson.dumps(env)) is RejectReason.BAD_SIGNATURE


def test_a_command_without_a_signature_is_unsigned() -> None:
    env = orjson.loads(sign(_command(), KEY))
    del env["sig"]
    assert _reason(orjson.dumps(env)) is RejectReason.UNSIGNED


def test_an_expired_command_is_expired_once_past_the_skew() -> None:
    raw = sign(_command(), KEY)
    assert _verify(raw, now=NOW + 300 + 29).id  # inside the skew allowance
    assert _reason(raw, now=NOW + 300 + 31) is RejectReason.EXPIRED


def test_a_command_from_the_future_is_not_yet_valid() -> None:
    raw = sign(_command(issued_at=NOW + 100, expires_at=NOW + 400), KEY)
    assert _reason(raw, now=NOW) is RejectReason.NOT_YET_VALID
    assert _verify(raw, now=NOW + 71).gpu == 3


def test_a_command_for_another_node_is_foreign_node() -> None:
    assert _reason(sign(_command(node="gpu-node-008"), KEY)) is RejectReason.FOREIGN_NODE


def test_a_verb_the_agent_does_not_know_is_unknown_verb() -> None:
    assert _reason(sign(_command(verb="reboot"), KEY)) is RejectReason.UNKNOWN_VERB


@pytest.mark.parametrize("gpu", [-1, 256, True, 2.0, "3"])
def test_a_gpu_index_out_of_range_or_not_an_int_is_bad_gpu(gpu) -> None:
    raw = _resign(sign(_command(), KEY), lambda b: b.__setitem__("gpu", gpu))
    assert _reason(raw) is RejectReason.BAD_GPU


def test_a_gpu_the_node_does_not_have_is_bad_gpu() -> None:
    assert _reason(sign(_command(gpu=8), KEY), gpu_count=8) is RejectReason.BAD_GPU


def test_the_same_command_twice_is_replayed() -> None:
    guard = ReplayGuard()
    raw = sign(_command(), KEY)
    _verify(raw, replay=guard)
    assert _reason(raw, replay=guard) is RejectReason.REPLAYED


def test_a_new_id_with_a_used_nonce_is_replayed() -> None:
    guard = ReplayGuard()
    _verify(sign(_command(), KEY), replay=guard)
    assert _reason(sign(_command(id="another-action"), KEY), replay=guard) is RejectReason.REPLAYED


def test_the_replay_memory_forgets_expired_commands_and_stays_bounded() -> None:
    guard = ReplayGuard(max_entries=3)
    for i in range(5):
        _verify(sign(_command(id=f"act-{i}", nonce=f"{i:032x}", expires_at=NOW + 100 + i), KEY), replay=guard)
    assert len(guard) == 3 and guard.evicted == 2
    _verify(sign(_command(id="late", nonce="f" * 32, issued_at=NOW + 200, expires_at=NOW + 500), KEY),
            replay=guard, now=NOW + 200)
    assert len(guard) == 1  # the five expired at NOW+104 at the latest, plus 30 s skew


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[]", b'{"schema": "gpuops.event", "v": 1}', b'{"schema": "gpuops.command", "v": 99}',
    b'{"schema": "gpuops.command", "v": 1, "body": {"id": "x"}, "sig": "' + b"0" * 64 + b'"}',
    b"{" * 100_000, b'{"schema": "gpuops.command", "v": 1, "body": "' + b"a" * MAX_MESSAGE_BYTES + b'"}',
])
def test_oversized_or_malformed_messages_are_malformed(raw: bytes) -> None:
    assert _reason(raw) is RejectReason.MALFORMED


@pytest.mark.parametrize("change", [
    lambda b: b.pop("nonce"), lambda b: b.__setitem__("extra", 1), lambda b: b.__setitem__("id", "a b"),
    lambda b: b.__setitem__("id", "x" * 65), lambda b: b.__setitem__("nonce", "short"),
    lambda b: b.__setitem__("reason", "r" * 513), lambda b: b.__setitem__("issued_at", float("1e300")),
    lambda b: b.__setitem__("expires_at", b["issued_at"] + 3601), lambda b: b.__setitem__("expires_at", "soon"),
    lambda b: b.__setitem__("node", "bad node;rm"), lambda b: b.__setitem__("v", 2),
    lambda b: b.__setitem__("v", True),
])
def test_signed_bodies_with_fields_out_of_bounds_are_malformed(change) -> None:
    raw = _resign(sign(_command(), KEY), change)
    with pytest.raises(CommandRejected) as e:
        _verify(raw)
    assert e.value.reason is RejectReason.MALFORMED and e.value.command is not None


def test_a_rejection_before_the_signature_check_carries_no_command_fields() -> None:
    with pytest.raises(CommandRejected) as e:
        _verify(sign(_command(), b"y" * 32))
    assert e.value.command is None


def test_a_short_key_cannot_sign() -> None:
    with pytest.raises(CommandKeyError, match="at least 32 bytes"):
        sign(_command(), b"short")


def test_a_key_file_readable_by_everyone_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "command.key"
    path.write_text("ab" * 32 + "\n")
    os.chmod(path, 0o644)
    with pytest.raises(CommandKeyError, match="chmod 600"):
        load_key(path)
    os.chmod(path, 0o600)
    assert load_key(path) == b"ab" * 32


def test_a_missing_or_short_key_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CommandKeyError, match="cannot read"):
        load_key(tmp_path / "nope")
    short = tmp_path / "short.key"
    short.write_text("abc")
    short.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(CommandKeyError, match="at least 32 bytes"):
        load_key(short)


def test_a_result_travels_as_a_valid_event_and_reads_back() -> None:
    result = CommandResult(command_id="a1b2", node=NODE, gpu=3, status=ResultStatus.FAILED,
                           detail="busy: 2 compute process(es)", at=NOW)
    event = result_event(result)
    assert validate_record(event, RecordType.EVENT) is None
    assert event["kind"] == "command_result" and event["source"] == "agent"
    raw = encode_event(event)
    assert result_from_event(raw) == result == result_from_event(decode_event(raw))
    assert result.code == "busy"


def test_other_events_are_not_results() -> None:
    xid = {"ts": NOW, "node": NODE, "gpu": 1, "source": "kmsg", "kind": "xid", "code": 79, "message": "x"}
    assert result_from_event(xid) is None and result_from_event(b"garbage") is None
    forged = {**result_event(CommandResult("a", NODE, 0, ResultStatus.SUCCEEDED, "reset", NOW)), "status": "maybe"}
    assert result_from_event(forged) is None


def test_verify_never_raises_anything_but_rejected_on_mutated_envelopes() -> None:
    import random

    rng = random.Random(7)
    good = sign(_command(), KEY)
    for _ in range(2000):
        raw = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            cmd = _verify(bytes(raw))
        except CommandRejected:
            continue
        assert cmd == _command()  # only a no-op mutation may pass
