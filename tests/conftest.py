"""Fixtures for the real test services (shared/DESIGN.md, "Test services").

Tests that integrate talk to a real Kafka broker, a real Slurm controller, a real
PostgreSQL server, a real Kubernetes API server and a headless Chromium, started by
``deploy/testservices/run-tests.sh`` (or by hand with ``kafka_up.sh`` / ``slurm_up.sh`` /
``postgres_up.sh`` / ``k8s_up.sh``).
A test whose service is missing is skipped locally with a message saying how to start
it; with ``CI=true`` the same situation fails the test instead, so CI cannot go green by
skipping. Only service fixtures live here; packages add their own in their subfolders.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# `python -m pytest` from the repo root can import `tests.helpers`; a bare `pytest` (or one
# run from another directory) cannot, so make the repo root importable here. (The same as
# `pythonpath = ["."]` under [tool.pytest.ini_options].)
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.helpers import wait_until  # noqa: E402

KAFKA_HINT = ("no Kafka broker: run deploy/testservices/kafka_up.sh and "
              "export GPUOPS_TEST_KAFKA=127.0.0.1:19092")
POSTGRES_HINT = ("no PostgreSQL server: run deploy/testservices/postgres_up.sh and export "
                 "GPUOPS_TEST_POSTGRES=postgresql+psycopg://postgres@127.0.0.1:15432/gpuops")
SLURM_HINT = ("no Slurm controller: run deploy/testservices/slurm_up.sh and "
              "export SLURM_CONF=/tmp/gpuops-slurm/etc/slurm.conf")
BROWSER_HINT = ("no headless browser: apt-get install chromium chromium-driver (run-tests.sh does) and "
                "pip install selenium (the test extra)")
K8S_HINT = ("no Kubernetes API server: run deploy/testservices/k8s_up.sh and "
            "export GPUOPS_TEST_K8S=/tmp/gpuops-k8s/kubeconfig")


def in_ci() -> bool:
    """True when running in CI (``CI=true``), where a missing service is a failure."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def service_missing(message: str) -> None:
    """Skip the test locally, fail it in CI."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


# ---- Kafka ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``host:port`` of the real test broker (``GPUOPS_TEST_KAFKA``), checked reachable."""
    bootstrap = os.environ.get("GPUOPS_TEST_KAFKA", "").strip()
    if not bootstrap:
        service_missing(KAFKA_HINT)
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gpuops-tests-probe",
                                 request_timeout_ms=10_000)
    except KafkaError as e:
        service_missing(f"GPUOPS_TEST_KAFKA={bootstrap} but the broker is unreachable ({e!r}); {KAFKA_HINT}")
    admin.close()
    return bootstrap


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> Iterator["KafkaAdminClient"]:  # noqa: F821
    """One admin client for the session (creating/deleting test topics)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="gpuops-tests",
                             request_timeout_ms=30_000)
    yield admin
    admin.close()


def _topic_name(test_name: str) -> str:
    # Kafka topic names: [a-zA-Z0-9._-], at most 249 characters
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", test_name)[:150].strip("-.")
    return f"test.{stem}.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_kafka_topic(request: pytest.FixtureRequest, kafka_admin) -> Iterator[Callable[..., str]]:
    """Factory: ``make_kafka_topic(name=None, partitions=4)`` creates a topic and waits for its leaders.

    A consumer group that subscribes to a topic before it exists sees no partitions until its
    next metadata refresh (minutes in kafka-python), so tests create every topic they read
    *before* subscribing. Topics are deleted afterwards if possible.
    """
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError

    created: list[str] = []

    def make(name: str | None = None, partitions: int = 4) -> str:
        name = name or _topic_name(request.node.name)
        kafka_admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                  timeout_ms=30_000)
        created.append(name)

        def ready() -> bool:
            described = kafka_admin.describe_topics([name])
            return bool(described) and described[0].get("error_code") == 0 and all(
                p.get("leader", -1) >= 0 for p in described[0].get("partitions", [])) and len(
                described[0].get("partitions", [])) == partitions

        wait_until(ready, timeout_s=30, interval_s=0.1,
                   message=f"topic {name} has {partitions} partitions with leaders")
        return name

    yield make
    try:
        if created:
            kafka_admin.delete_topics(created, timeout_ms=30_000)
    except KafkaError:
        pass  # best effort: the broker's state is scratch and purged by kafka_down.sh --purge


@pytest.fixture
def kafka_topic(make_kafka_topic: Callable[..., str]) -> str:
    """A fresh topic with 4 partitions, unique to this test; deleted afterwards if possible."""
    return make_kafka_topic()


# ---- Slurm ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm_conf() -> Path:
    """Path of the real test cluster's ``slurm.conf`` (``SLURM_CONF``), controller checked up.

    ``SLURM_CONF`` stays in the environment, so ``scontrol``/``sbatch``/``sinfo`` run by the
    tests and by the code under test talk to this cluster.
    """
    conf = os.environ.get("SLURM_CONF", "").strip()
    if not conf:
        service_missing(SLURM_HINT)
    if not Path(conf).is_file():
        service_missing(f"SLURM_CONF={conf} does not exist; {SLURM_HINT}")
    if shutil.which("scontrol") is None:
        service_missing(f"scontrol not installed (apt-get install slurm-client); {SLURM_HINT}")
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15,
                              env={**os.environ, "SLURM_CONF": conf})
    except subprocess.TimeoutExpired:
        service_missing(f"`scontrol ping` timed out for SLURM_CONF={conf}; {SLURM_HINT}")
    if "is UP" not in ping.stdout:
        service_missing(f"slurmctld is not up for SLURM_CONF={conf} "
                        f"(scontrol ping: {(ping.stdout + ping.stderr).strip()!r}); {SLURM_HINT}")
    return Path(conf)


# ---- PostgreSQL -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def postgres_url() -> str:
    """SQLAlchemy URL of the real test database (``GPUOPS_TEST_POSTGRES``), checked to connect.

    Tests that write make their own schema or database in it (tests/remediation/conftest.py).
    """
    url = os.environ.get("GPUOPS_TEST_POSTGRES", "").strip()
    if not url:
        service_missing(POSTGRES_HINT)
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 10})
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        engine.dispose()
    except (sa.exc.SQLAlchemyError, ImportError) as e:
        service_missing(f"GPUOPS_TEST_POSTGRES={url} but the server is unreachable ({e}); {POSTGRES_HINT}")
    return url


# ---- Kubernetes ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kube_api() -> Iterator["ApiClient"]:  # noqa: F821
    """A ``kubernetes.client.ApiClient`` for the real test API server, checked ready.

    Configured from the kubeconfig ``GPUOPS_TEST_K8S`` names (``k8s_up.sh`` writes it: admin
    token in ``system:masters``). The server runs no controllers and no kubelet: tests create
    Nodes and Pods themselves and play the controllers' part (shared/infra/README.md).
    """
    kubeconfig = os.environ.get("GPUOPS_TEST_K8S", "").strip()
    if not kubeconfig:
        service_missing(K8S_HINT)
    if not Path(kubeconfig).is_file():
        service_missing(f"GPUOPS_TEST_K8S={kubeconfig} does not exist; {K8S_HINT}")
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        ready = api.call_api("/readyz", "GET", auth_settings=["BearerToken"], response_type="str",
                             _return_http_data_only=True, _request_timeout=10)
    except Exception as e:  # noqa: BLE001 - any failure here means "no usable server"
        api.close()
        service_missing(f"GPUOPS_TEST_K8S={kubeconfig} but the API server is unreachable ({e!r}); {K8S_HINT}")
    if str(ready).strip() != "ok":
        api.close()
        service_missing(f"API server of {kubeconfig} is not ready (/readyz: {ready!r}); {K8S_HINT}")
    yield api
    api.close()


# ---- A browser (the dashboard) ----------------------------------------------------------

#: where Debian's chromium-driver puts the driver (used as is: no Selenium Manager download)
CHROMEDRIVER = Path(os.environ.get("GPUOPS_CHROMEDRIVER", "/usr/bin/chromedriver"))


@pytest.fixture
def browser() -> Iterator["WebDriver"]:  # noqa: F821
    """Headless Chromium driven by Selenium through the system chromedriver; quit afterwards."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or not CHROMEDRIVER.is_file():
        service_missing(f"chromium or {CHROMEDRIVER} missing; {BROWSER_HINT}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService
    except ImportError:
        service_missing(f"selenium is not installed; {BROWSER_HINT}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def artefacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test keeps what a person should look at afterwards (screenshots):
    ``$GPUOPS_ARTIFACTS/<test name>/`` when set (CI keeps it), else the test's tmp_path."""
    root = os.environ.get("GPUOPS_ARTIFACTS", "").strip()
    out = Path(root) / re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name) if root else tmp_path / "artefacts"
    out.mkdir(parents=True, exist_ok=True)
    return out


# ---- shared fixtures tree -------------------------------------------------------------------

@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """``../shared/fixtures`` beside the repository (captured real data for sources/tests)."""
    path = REPO_ROOT.parent / "shared" / "fixtures"
    if not path.is_dir():
        service_missing(f"shared fixtures not found at {path} (expected ../shared/fixtures beside the repo)")
    return path


BMC_HINT = ("start the test BMCs with `eval \"$(deploy/testservices/bmc_up.sh | tail -1)\"` "
            "(ipmi_sim, sushy-emulator and sushy-static on 127.0.0.1)")


@pytest.fixture(scope="session")
def bmc() -> dict[str, str]:
    """The test BMC services from ``GPUOPS_TEST_BMC``
    (``ipmi=H:P,redfish=URL,redfish_newer=URL,redfish_ca=PATH,passfile=PATH``), checked up.

    Keys: ``ipmi_host``, ``ipmi_port``, ``redfish`` (sushy-emulator, HTTP), ``redfish_newer`` (sushy-static over
    HTTPS, serving a BMC with only the newer schema), ``redfish_ca`` (its self-signed certificate), ``passfile``;
    the IPMI user is ``gpuops``.
    """
    raw = os.environ.get("GPUOPS_TEST_BMC", "").strip()
    if not raw:
        service_missing(f"GPUOPS_TEST_BMC not set; {BMC_HINT}")
    parts = dict(p.split("=", 1) for p in raw.split(",") if "=" in p)
    if not {"ipmi", "redfish", "redfish_newer", "redfish_ca", "passfile"} <= parts.keys():
        service_missing(f"GPUOPS_TEST_BMC={raw!r} lacks ipmi=, redfish=, redfish_newer=, redfish_ca= or passfile=; "
                        f"{BMC_HINT}")
    if shutil.which("ipmitool") is None:
        service_missing(f"ipmitool not installed (apt-get install ipmitool); {BMC_HINT}")
    host, _, port = parts["ipmi"].rpartition(":")
    import ssl
    import urllib.request
    for key in ("redfish", "redfish_newer"):
        try:
            urllib.request.urlopen(parts[key] + "/redfish/v1/Chassis", timeout=5,
                                   context=ssl.create_default_context(cafile=parts["redfish_ca"])).read()
        except OSError as e:
            service_missing(f"Redfish test BMC at {parts[key]} does not answer ({e}); {BMC_HINT}")
    return {"ipmi_host": host, "ipmi_port": port, "redfish": parts["redfish"], "redfish_newer": parts["redfish_newer"],
            "redfish_ca": parts["redfish_ca"], "passfile": parts["passfile"], "user": "gpuops"}
