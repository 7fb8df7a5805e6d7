"""The scripts in examples/ run end to end against the test server and leave no sandbox."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, Server, sandbox_ids


@pytest.mark.parametrize(
    "script, expected",
    [
        ("agent_loop.py", "answer: The total of the sales figures is 500."),
        ("best_of_n.py", "best answer: '3 7 19 23 42 88'"),
    ],
)
def test_example(server: Server, script: str, expected: str) -> None:
    before = set(sandbox_ids(server))
    # The test server runs with --network off, where only egress "none" exists.
    env = dict(
        os.environ, HUTCH_URL=server.url, HUTCH_API_KEY=server.key, HUTCH_EXAMPLE_EGRESS="none"
    )
    env.pop("HUTCH_TEMPLATE", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expected in proc.stdout
    assert set(sandbox_ids(server)) <= before
