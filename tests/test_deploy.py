"""docker-compose.yml, .dockerignore and the Dockerfile, read as a deployer's checklist: the KV
Redis has a ceiling and never evicts or snapshots, the broker is a Redis of its own, no password
has a default, no .env enters the image, and the image renders the PDF export."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_the_kv_redis_has_a_ceiling_never_evicts_and_never_snapshots() -> None:
    cmd = _compose()["services"]["redis"]["command"]
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args["--maxmemory-policy"] == "noeviction" and args["--maxmemory"]
    assert args["--save"] == "" and args["--appendonly"] == "no"


def test_the_broker_is_a_redis_of_its_own() -> None:
    c = _compose()
    env = c["x-setflow-env"]
    assert env["BROKER_URL"].split("@")[-1].startswith("broker:") and env["REDIS_URL"].split("@")[-1].startswith("redis:")
    assert "broker" in c["services"] and "noeviction" in c["services"]["broker"]["command"]


def test_no_password_has_a_default_and_no_env_file_enters_the_image() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "POSTGRES_PASSWORD:-" not in text and "${POSTGRES_PASSWORD:?" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".env.*" in ignored


def test_the_image_can_render_the_pdf_export() -> None:
    """WeasyPrint's libraries and fonts for any script are installed, and the build renders a
    chart into a PDF (the export's own functions) before the image exists."""
    text = (ROOT / "Dockerfile").read_text()
    apt = text[text.index("apt-get install"):text.index("rm -rf /var/lib/apt/lists")]
    for package in ("libpango-1.0-0", "libpangoft2-1.0-0", "libharfbuzz-subset0", "fonts-dejavu-core", "fonts-noto-cjk"):
        assert package in apt, package
    assert "exports.pdf(" in text and "exports.svg(" in text


def test_ports_are_published_on_loopback_only_unless_asked() -> None:
    """Every published port binds 127.0.0.1 (the API's may be moved by SETFLOW_API_BIND, which
    defaults to it): Redis, the broker and PostgreSQL publish none."""
    services = _compose()["services"]
    published = {name: s.get("ports", []) for name, s in services.items()}
    assert not published["redis"] and not published["broker"] and not published["postgres"]
    for name, ports in published.items():
        for port in ports:
            assert port.startswith(("127.0.0.1:", "${SETFLOW_API_BIND:-127.0.0.1}:")), (name, port)


def test_both_redis_servers_require_a_password_with_no_default() -> None:
    c = _compose()
    for name in ("redis", "broker"):
        cmd = c["services"][name]["command"]
        assert cmd[cmd.index("--requirepass") + 1] == "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
        assert c["services"][name]["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")  # healthcheck
    env = c["x-setflow-env"]
    for url in (env["REDIS_URL"], env["BROKER_URL"]):
        assert url.startswith("redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD}@"), url
    assert "REDIS_PASSWORD:-" not in (ROOT / "docker-compose.yml").read_text()


def test_only_the_api_container_gets_the_api_keys() -> None:
    c = _compose()
    assert "SETFLOW_API_KEYS" not in c["x-setflow-env"]
    holders = [name for name, s in c["services"].items() if "SETFLOW_API_KEYS" in (s.get("environment") or {})]
    assert holders == ["api"] and c["services"]["api"]["environment"]["SETFLOW_API_KEYS"].startswith("${SETFLOW_API_KEYS:?")
