"""Bearer tokens: only hashes in the config, every entry compared, roles ordered, a generated admin
token usable once shown, and config mistakes refused at start-up with what to fix."""

from __future__ import annotations

import pytest

from api.auth import Auth, AuthConfigError, Role, token_hash


def test_a_token_is_known_by_its_hash_only_and_maps_to_its_name_and_role():
    auth = Auth.from_config([{"name": "oncall", "role": "operator", "sha256": token_hash("s3cret")},
                             {"name": "grafana", "role": "viewer", "sha256": token_hash("look")}])
    who = auth.authenticate("s3cret")
    assert (who.name, who.role, who.actor) == ("oncall", Role.OPERATOR, "operator:oncall")
    assert auth.authenticate("look").role is Role.VIEWER
    assert auth.authenticate("S3cret") is None and auth.authenticate("") is None and auth.authenticate(None) is None


def test_roles_are_ordered_viewer_operator_admin():
    assert Role.VIEWER < Role.OPERATOR < Role.ADMIN
    assert Role.parse("Admin") is Role.ADMIN


def test_a_generated_admin_token_works_and_only_its_hash_is_kept():
    auth = Auth(token_factory=lambda: "fixed-token-for-test")
    token = auth.generate_admin()
    assert token == "fixed-token-for-test" and auth.authenticate(token).role is Role.ADMIN
    assert token not in repr(vars(auth))


@pytest.mark.parametrize("entry,says", [
    ({"name": "a", "role": "root", "sha256": "0" * 64}, "unknown role"),
    ({"name": "a", "role": "admin", "sha256": "my-plain-token"}, "64 hex digits"),
    ({"name": "a", "role": "admin"}, "sha256"),
    ({"name": " ", "role": "admin", "sha256": "0" * 64}, "non-blank name"),
])
def test_a_bad_token_entry_is_refused_saying_what_to_fix(entry, says):
    with pytest.raises(AuthConfigError, match=says):
        Auth.from_config([entry])


def test_a_token_name_used_twice_is_refused():
    e = {"name": "a", "role": "admin", "sha256": "0" * 64}
    with pytest.raises(AuthConfigError, match="used twice"):
        Auth.from_config([e, {**e, "sha256": "1" * 64}])
