"""Start a real `hutch serve` for the whole test session (no mocks).

The server runs from `target/debug/hutch` (or `$HUTCH_BIN`) on an ephemeral port with a
temporary state directory and the `minimal` template from `$HUTCH_TEST_TEMPLATES`
(default `/var/cache/hutch-test/templates`). At the end every sandbox is deleted through the
API, the server gets SIGTERM, and the state directory is removed unless something is still
mounted under it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Server:
    url: str
    key: str
    state_dir: Path


def _mounted_under(path: Path) -> List[str]:
    prefix = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                mnt = fields[4].replace("\\040", " ")
                if mnt == prefix or mnt.startswith(prefix + "/"):
                    found.append(mnt)
    return found


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    binary = Path(os.environ.get("HUTCH_BIN") or REPO / "target" / "debug" / "hutch")
    if not binary.exists():
        raise RuntimeError(f"{binary} is missing: run `cargo build -p hutch` first")
    templates = os.environ.get("HUTCH_TEST_TEMPLATES", "/var/cache/hutch-test/templates")
    state = Path(tempfile.mkdtemp(prefix="hutch-sdk-py-", dir="/tmp"))
    os.chmod(state, 0o755)
    log = open(state.parent / f"{state.name}.log", "w+", encoding="utf-8")
    env = dict(os.environ, HUTCH_LOG="warn")
    env.pop("HUTCH_API_KEY", None)
    proc = subprocess.Popen(
        [
            str(binary),
            "serve",
            "--listen",
            "127.0.0.1:0",
            # Browser links on the API origin: the preview origin's `*.localhost` host names
            # resolve in browsers, not in httpx (the Rust tests cover it with Chromium).
            "--preview-listen",
            "off",
            "--network",
            "off",
            "--state-dir",
            str(state),
            "--templates-dir",
            templates,
            "--no-build-base",
            "--default-template",
            "minimal",
            # Usage metered every half second, so usage tests see it soon.
            "--usage-interval-seconds",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    url = None
    ready = threading.Event()
    found: List[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not found and line.startswith("hutch listening on "):
                found.append(line.split("hutch listening on ", 1)[1].strip())
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    saved = {k: os.environ.get(k) for k in ("HUTCH_URL", "HUTCH_API_KEY")}
    try:
        ready.wait(60)
        if not found:
            log.seek(0)
            raise RuntimeError(f"hutch serve did not start:\n{log.read()[-4000:]}")
        url = found[0]
        key = (state / "admin.key").read_text(encoding="utf-8").strip()
        os.environ["HUTCH_URL"] = url
        os.environ["HUTCH_API_KEY"] = key
        yield Server(url=url, key=key, state_dir=state)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if url is not None and proc.poll() is None:
            try:
                with httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
                ) as c:
                    for sb in c.get("/v1/sandboxes").json().get("sandboxes", []):
                        c.delete(f"/v1/sandboxes/{sb['id']}")
            except Exception as e:  # noqa: BLE001 - teardown goes on regardless
                print(f"teardown: could not delete sandboxes: {e}")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        mounts = _mounted_under(state)
        if mounts:
            print(f"teardown: leaving {state}: still mounted: {mounts}")
        else:
            shutil.rmtree(state, ignore_errors=True)
            os.unlink(log.name)


def sandbox_ids(server: Server) -> List[str]:
    """Every sandbox id on the server, read without the SDK."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.key}"}, timeout=30
    ) as c:
        r = c.get("/v1/sandboxes")
        r.raise_for_status()
        return [s["id"] for s in r.json()["sandboxes"]]


def wait_for(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()
