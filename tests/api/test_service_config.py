"""The service config: the example file loads, every problem is listed at once, env overrides the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.config import ServiceConfigError, load_service_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "config" / "gpuops.example.yaml"


def test_example_config_loads_with_the_slurm_adapter_and_kafka() -> None:
    cfg = load_service_config(EXAMPLE)
    assert cfg.adapter.name == "slurm" and cfg.kafka_bootstrap and not cfg.embedded
    assert cfg.safety.armed is False and cfg.auth.tokens[0].role == "operator"


def test_no_config_is_the_embedded_default_on_loopback_with_sqlite_and_dry_run() -> None:
    cfg = load_service_config(None)
    assert cfg.embedded and cfg.host == "127.0.0.1" and cfg.adapter.name == "dryrun"
    assert cfg.resolved_store_url.startswith("sqlite:///") and cfg.drain_on_silence is False


def test_every_problem_is_listed_in_one_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("port: 99999\nlease_ttl_s: 0\nsafety: {armed: maybe}\nbogus: 1\n")
    with pytest.raises(ServiceConfigError) as e:
        load_service_config(f)
    msg = str(e.value)
    for key in ("port", "lease_ttl_s", "safety.armed", "bogus"):
        assert key in msg


def test_unknown_adapter_names_the_valid_ones(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("adapter: {name: lsf}\nmodel_dir: /nonexistent/models\n")
    with pytest.raises(ServiceConfigError, match="valid: dryrun, kubernetes, slurm") as e:
        load_service_config(f)
    assert "model_dir" in str(e.value)


def test_unknown_slurm_option_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("adapter: {name: slurm, options: {partition_cap: 3}}\n")
    with pytest.raises(ServiceConfigError, match="partition_cap"):
        load_service_config(f)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: 8080\nsafety: {armed: false}\n")
    monkeypatch.setenv("GPUOPS_PORT", "9001")
    monkeypatch.setenv("GPUOPS_SAFETY__ARMED", "true")
    cfg = load_service_config(f)
    assert cfg.port == 9001 and cfg.safety.armed is True


def test_cli_flags_override_the_file() -> None:
    cfg = load_service_config(EXAMPLE, host="0.0.0.0", port=0)
    assert (cfg.host, cfg.port) == ("0.0.0.0", 0)


def test_every_setting_documents_its_meaning() -> None:
    from pydantic import BaseModel

    from api.config import ServiceConfig

    def undocumented(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            if not (f.description or "").strip():
                out.append(prefix + name)
            ann = f.annotation
            inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
            for sub in inner:
                if sub.__module__ == "api.config":
                    out += undocumented(sub, f"{prefix}{name}.")
        return out

    assert undocumented(ServiceConfig) == []


def test_shadow_policies_are_checked_over_the_policy_and_the_service_builds_them(tmp_path: Path) -> None:
    from api.service import _shadow

    f = tmp_path / "c.yaml"
    f.write_text("shadow_policies: {strict: {act_threshold: 2}, live: {}, ok: {}}\n")
    with pytest.raises(ServiceConfigError) as e:
        load_service_config(f)
    assert "shadow_policies.strict: act_threshold" in str(e.value) and "shadow_policies.live" in str(e.value)
    f.write_text("policy: {act_threshold: 0.8}\nshadow_policies: {hbm-alert: {actions: {hbm_ecc: alert}}}\n")
    cfg = load_service_config(f)
    shadow = _shadow(cfg)
    assert shadow is not None and list(shadow.policies) == ["hbm-alert"]
    alt = shadow.policies["hbm-alert"]
    assert alt.act_threshold == 0.8 and alt.actions[next(k for k in alt.actions if k.value == "hbm_ecc")].value == "alert"
    assert _shadow(load_service_config(None)) is None


def test_a_policy_section_applies_over_the_defaults_as_a_policy_file_and_a_shadow_do(tmp_path: Path) -> None:
    """A mapping in `policy:` is merged key by key (it used to replace the default mapping whole, so naming
    `ib_link`'s sustain silently dropped `hbm_ecc`'s 900 s); `{}` clears it; env overrides still apply."""
    from collector.schema import FaultClass
    from remediation.config import load_policy_config

    f = tmp_path / "gpuops.yaml"
    f.write_text("policy:\n  act_sustain_s_by_fault: {ib_link: 300}\n  follow_ups: {}\n")
    policy = load_service_config(f).policy
    assert policy.sustain_for(FaultClass.IB_LINK) == 300.0 and policy.sustain_for(FaultClass.HBM_ECC) == 900.0
    assert policy.sustain_for(FaultClass.POWER) == 420.0 and policy.follow_up_for(FaultClass.HBM_ECC) is None
    assert policy == load_policy_config(f)  # the same file read by `gpuops replay --policy` means the same
    f.write_text("policy:\n  act_sustain_s_by_fault: {bogus: 1}\n")
    with pytest.raises(ServiceConfigError, match="policy.act_sustain_s_by_fault"):
        load_service_config(f)
