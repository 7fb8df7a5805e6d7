"""`hutch bench e2b`: the same work through E2B's published SDK (against Hutch's E2B API)
and through Hutch's own Python SDK, in one process, alternating, so both meet the same
machine. Prints one JSON object: {"series": {name: [ms, ...]}}.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY (the E2B listener), HUTCH_URL,
HUTCH_API_KEY (the API), BENCH_N (creates), BENCH_CODE (run_code round trips),
BENCH_CODE_TEMPLATE (a built code-interpreter template, or empty to skip).
"""

import json
import os
import sys
import time

import e2b
import hutch

n = int(os.environ.get("BENCH_N", "20"))
code_n = int(os.environ.get("BENCH_CODE", "100"))
code_template = os.environ.get("BENCH_CODE_TEMPLATE", "")
series = {k: [] for k in ["e2b_sdk_create_first_command", "hutch_sdk_create_first_exec",
                          "e2b_sdk_run_code_1plus1", "hutch_sdk_run_code_1plus1"]}


def ms(t0):
    return (time.perf_counter() - t0) * 1000.0


# One warm-up of each, not timed (imports, connection pools).
e2b.Sandbox.create(template="base", timeout=120).kill()
hutch.Sandbox.create(template="base", ttl_seconds=120).kill()

for _ in range(n):
    t0 = time.perf_counter()
    sb = e2b.Sandbox.create(template="base", timeout=120)
    sb.commands.run("true")
    series["e2b_sdk_create_first_command"].append(ms(t0))
    sb.kill()
    t0 = time.perf_counter()
    hs = hutch.Sandbox.create(template="base", ttl_seconds=120)
    hs.exec(["bash", "-l", "-c", "true"])
    series["hutch_sdk_create_first_exec"].append(ms(t0))
    hs.kill()

if code_template and code_n > 0:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    cs = CodeSandbox.create(template=code_template, timeout=600)
    hs = hutch.Sandbox.create(template=code_template, ttl_seconds=600)
    try:
        cs.run_code("1+1")
        hs.run_code("1+1")
        for _ in range(code_n):
            t0 = time.perf_counter()
            assert cs.run_code("1+1").text == "2"
            series["e2b_sdk_run_code_1plus1"].append(ms(t0))
            t0 = time.perf_counter()
            assert hs.run_code("1+1").text == "2"
            series["hutch_sdk_run_code_1plus1"].append(ms(t0))
    finally:
        cs.kill()
        hs.kill()

json.dump({"series": series}, sys.stdout)
