"""The code interpreter from the SDK: `run_code` on real kernels in a `code-interpreter`
sandbox (state across calls, a chart as PNG bytes, callbacks in order, errors, contexts),
sync and async."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Server

import hutch
from hutch import AsyncSandbox, Sandbox


def test_run_code_keeps_state_and_returns_rich_results(server: Server) -> None:
    with Sandbox.create(template="code-interpreter", metadata={"suite": "py-code"}) as sb:
        first = sb.run_code("x = 41")
        assert first.error is None
        assert first.results == []
        second = sb.run_code("x + 1")
        assert second.text == "42"
        assert second.results[0].is_main_result
        assert second.results[0].formats() == ["text"]
        assert second.context_id == "default-python"

        seen = []
        chart = sb.run_code(
            "import matplotlib.pyplot as plt\n"
            "print('drawing')\n"
            "plt.plot([1, 2, 3], [3, 1, 2])\n"
            "plt.show()",
            on_stdout=lambda t: seen.append(("stdout", t)),
            on_result=lambda r: seen.append(("result", r.formats())),
        )
        assert seen[0] == ("stdout", "drawing\n")
        assert seen[1][0] == "result" and "png" in seen[1][1], seen
        png = next(r.png for r in chart.results if r.png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert chart.logs.stdout == ["drawing\n"]

        failed = sb.run_code("1 / 0")
        assert failed.error is not None
        assert failed.error.name == "ZeroDivisionError"
        assert failed.error.traceback

        timed = sb.run_code("while True:\n    pass", timeout=1)
        assert timed.error is not None and timed.error.name == "TimeoutError"
        assert timed.error.timed_out
        assert sb.run_code("x").text == "41"


def test_code_contexts(server: Server) -> None:
    with Sandbox.create(template="code-interpreter", metadata={"suite": "py-code"}) as sb:
        a = sb.create_code_context()
        b = sb.create_code_context("python", cwd="/tmp")
        assert a.language == "python" and b.cwd == "/tmp"
        sb.run_code("v = 1", context=a)
        assert sb.run_code("'v' in globals()", context=b).text == "False"
        assert sb.run_code("v", context=a.id).text == "1"
        assert {c.id for c in sb.list_code_contexts()} >= {a.id, b.id}
        sb.restart_code_context(a)
        assert sb.run_code("'v' in globals()", context=a).text == "False"
        sb.delete_code_context(b)
        with pytest.raises(hutch.ContextNotFound):
            sb.run_code("1", context=b)
        bash = sb.run_code("n=5; echo $((n * 2))", language="bash")
        assert bash.logs.stdout == ["10\n"]
        with pytest.raises(hutch.InvalidRequest):
            sb.run_code("1", language="python", context=a)


def test_a_minimal_sandbox_has_no_interpreter(server: Server) -> None:
    with Sandbox.create(template="minimal", metadata={"suite": "py-code"}) as sb:
        with pytest.raises(hutch.NoInterpreter) as e:
            sb.run_code("1")
        assert "code-interpreter" in str(e.value)


def test_async_run_code(server: Server) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(template="code-interpreter", metadata={"suite": "py-code"})
        try:
            chunks = []

            async def collect(text: str) -> None:
                chunks.append(text)

            await sb.run_code("total = 40")
            run = await sb.run_code("print('hi')\ntotal + 2", on_stdout=collect)
            assert run.text == "42"
            assert chunks == ["hi\n"]
            ctx = await sb.create_code_context("javascript")
            await sb.run_code("var k = 6", context=ctx)
            assert (await sb.run_code("k * 7", context=ctx)).text == "42"
        finally:
            await sb.kill()
            await sb.close()

    asyncio.run(main())
