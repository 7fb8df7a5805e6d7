"""Configuration and the pure parts of the protocol (no server needed, except the last test)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from conftest import Server

import hutch
from hutch import _protocol as p
from hutch._config import default_state_dir, resolve


def test_resolve_prefers_arguments_then_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HUTCH_URL", "http://10.9.8.7:1234/")
    monkeypatch.setenv("HUTCH_API_KEY", "env-key")
    c = resolve()
    assert (c.url, c.api_key) == ("http://10.9.8.7:1234", "env-key")
    c = resolve("http://127.0.0.1:1", "arg-key")
    assert (c.url, c.api_key) == ("http://127.0.0.1:1", "arg-key")


def test_resolve_reads_admin_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HUTCH_URL", raising=False)
    monkeypatch.delenv("HUTCH_API_KEY", raising=False)
    monkeypatch.setenv("HUTCH_STATE_DIR", str(tmp_path))
    (tmp_path / "admin.key").write_text("file-key\n")
    c = resolve()
    assert (c.url, c.api_key) == (hutch.DEFAULT_URL, "file-key")
    assert c.key_source.endswith("admin.key")
    (tmp_path / "admin.key").unlink()
    assert resolve().api_key is None


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_STATE_DIR", "/somewhere")
    assert default_state_dir() == Path("/somewhere")
    monkeypatch.delenv("HUTCH_STATE_DIR")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert default_state_dir() == Path("/var/lib/hutch")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", "/xdg")
    assert default_state_dir() == Path("/xdg/hutch")


def test_key_file_used_by_sandbox(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HUTCH_API_KEY", raising=False)
    monkeypatch.setenv("HUTCH_STATE_DIR", str(server.state_dir))
    with hutch.Sandbox.create() as sb:
        assert sb.exec("echo ok").stdout == "ok\n"
    monkeypatch.setenv("HUTCH_STATE_DIR", "/nonexistent-hutch-dir")
    with pytest.raises(hutch.AuthError, match="unreadable"):
        hutch.Sandbox.list()


def test_sse_parser() -> None:
    parser = p.SSEParser()
    lines = [
        ": keep-alive",
        "",
        "event: stdout",
        'data: {"data":"a"}',
        "",
        "data: x",
        "data: y",
        "",
    ]
    out = [ev for ev in map(parser.feed, lines) if ev]
    assert out == [("stdout", '{"data":"a"}'), ("message", "x\ny")]


def test_stream_state_joins_split_utf8_and_flushes() -> None:
    st = p.ExecStreamState()
    euro = "€".encode()  # 3 bytes, split across two chunks

    def b64(b: bytes) -> str:
        return json.dumps({"data_b64": base64.b64encode(b).decode()})

    assert st.handle("start", '{"pid": 3}') == [("start", 3)]
    assert st.handle("stdout", b64(b"x" + euro[:2])) == [("stdout", "x")]
    assert st.handle("stdout", b64(euro[2:])) == [("stdout", "€")]
    assert st.handle("stderr", b64(b"\xe2")) == []
    acts = st.handle("exit", '{"exit_code": 1, "timed_out": false, "duration_ms": 1}')
    assert acts[0] == ("stderr", "\ufffd") and acts[-1][0] == "exit"
    with pytest.raises(hutch.SandboxFailed):
        p.ExecStreamState().handle("error", '{"code": "sandbox_failed", "message": "gone"}')


def test_error_classes() -> None:
    from hutch.errors import from_response

    assert isinstance(
        from_response(
            404,
            b'{"error":{"code":"not_found","message":"sandbox sbx_x does not exist"}}',
            kind="files",
        ),
        hutch.SandboxNotFound,
    )
    assert isinstance(
        from_response(
            404, b'{"error":{"code":"not_found","message":"open /x: No such file"}}', kind="files"
        ),
        hutch.FileNotFound,
    )
    assert isinstance(
        from_response(404, b'{"error":{"code":"not_found","message":"no such route"}}'),
        hutch.Unsupported,
    )
    assert isinstance(
        from_response(409, b'{"error":{"code":"sandbox_failed","message":"x"}}'),
        hutch.ConflictError,
    )
    assert isinstance(from_response(429, b""), hutch.QuotaExceeded)
    assert isinstance(from_response(502, b"bad gateway"), hutch.ServerError)
    assert isinstance(hutch.TimeoutError("t"), TimeoutError)
    e = from_response(422, b'{"error":{"code":"invalid_argument","message":"nope"}}')
    assert isinstance(e, hutch.InvalidRequest) and str(e) == "[422 invalid_argument] nope"


def test_exec_body() -> None:
    assert p.exec_body(["a", 1], env=None, cwd=None, stdin=b"\x00", timeout=None, user=None) == {
        "cmd": ["a", "1"],
        "stdin_b64": "AA==",
    }
    with pytest.raises(TypeError):
        p.exec_body(b"ls", env=None, cwd=None, stdin=None, timeout=None, user=None)  # type: ignore[arg-type]
    assert p.mode_text(0o755) == "0755" and p.mode_text("644") == "644"
    assert p.pty_url(
        "https://h:1", "sbx_1", cmd="top -b", cols=80, rows=24, user=None, cwd=None
    ) == ("wss://h:1/v1/sandboxes/sbx_1/pty?cols=80&rows=24&cmd=top+-b")


def test_lifecycle_models_and_bodies() -> None:
    from hutch.models import ExploreResult, SandboxInfo, Snapshot

    outcome = {
        "index": 0,
        "sandbox_id": "sbx_a",
        "exit_code": None,
        "timed_out": False,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": 3,
        "score": 0.0,
        "kept": True,
        "error": "could not start",
    }
    r = ExploreResult.from_json({"winner": outcome, "outcomes": [outcome]})
    assert r.winner.exit_code is None and not r.winner.ok and r.winner.error == "could not start"
    assert r.outcomes[0].kept and r.outcomes[0].sandbox_id == "sbx_a"
    # A winner missing from the answer is recovered from the kept outcome.
    assert ExploreResult.from_json({"outcomes": [outcome]}).winner.sandbox_id == "sbx_a"
    with pytest.raises(hutch.HutchError):
        ExploreResult.from_json({"outcomes": []})

    snap = Snapshot.from_json({"id": "snap_x", "name": "n", "used_by": ["sbx_b"]})
    assert snap.used_by == ["sbx_b"] and snap.name == "n"
    info = SandboxInfo.from_json({"id": "sbx_c", "woke_in_ms": 6, "forked_from": "sbx_p"})
    assert info.woke_in_ms == 6 and info.forked_from == "sbx_p" and info.snapshot is None

    assert p.explore_body(
        ["true", ["sh", "-c", "exit 1"]], timeout=None, keep="winner", score_regex=None
    ) == {"commands": ["true", ["sh", "-c", "exit 1"]], "keep": "winner"}
    with pytest.raises(TypeError):
        p.explore_body("true", timeout=None, keep="winner", score_regex=None)
    assert p.explore_read_timeout(None) is None and p.explore_read_timeout(10) == 70.0
    assert p.snapshot_path("snap_1") == "/v1/snapshots/snap_1"


def test_template_and_build_log_models() -> None:
    t = hutch.Template.from_json(
        {
            "name": "web",
            "start": {"cmd": "httpd"},
            "image": {"reference": "upload:1"},
            "tags": {"v2": 3, "bad": "x"},
        }
    )
    assert (t.start, t.image and t.image["reference"], t.tags) == (
        {"cmd": "httpd"},
        "upload:1",
        {"v2": 3},
    )
    bare = hutch.Template.from_json({"name": "web"})
    assert (bare.start, bare.image, bare.tags) == (None, None, {})
    line = hutch.BuildLogLine.from_json(
        {
            "seq": 4,
            "stream": "progress",
            "text": "layer 1/2 0123456789ab: download 1.5 KiB / 3.0 MiB",
            "progress": {
                "id": "sha256:0123",
                "label": "layer 1/2",
                "action": "download",
                "current": 1536,
                "total": 3 << 20,
            },
        }
    )
    assert line.progress == hutch.BuildProgress("sha256:0123", "layer 1/2", "download", 1536, 3 << 20)
    assert hutch.BuildLogLine.from_json({"seq": 1, "stream": "status", "text": "x"}).progress is None
