#!/usr/bin/env python3
"""Best-of-N on Hutch: try N candidate solutions side by side and keep the best one.

The Hutch API has `POST /v1/sandboxes/{id}/explore`, which forks a prepared sandbox once per
candidate (live forks: each starts from the same memory and files), runs them in parallel,
scores them (exit 0 = 1.0) and keeps only the winner. This script uses it when the server
supports it.

**Until the server implements `explore`** (it answers 404 or 422 today), the script falls
back to doing the same by hand: it creates N fresh sandboxes, repeats the setup in each, runs
one candidate per sandbox concurrently, scores the results, keeps the best sandbox and
kills the others. Same result, minus the cheap forking.

    python3 examples/best_of_n.py
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

from hutch import AsyncClient, AsyncSandbox, InvalidRequest, NotFoundError

# The shared setup every candidate starts from: an input file.
SETUP_PATH = "/work/numbers.txt"
SETUP_DATA = "".join(f"{n}\n" for n in [42, 7, 19, 3, 88, 23])
EXPECTED = "3 7 19 23 42 88"

# N candidate solutions to "print the numbers sorted ascending on one line", as a model might
# propose them. Some are wrong on purpose.
SOLUTIONS = [
    f"sort {SETUP_PATH} | tr '\\n' ' ' | sed 's/ $//'",  # lexicographic sort: wrong order
    f"sort -n {SETUP_PATH} | tr '\\n' ' ' | sed 's/ $//'",  # correct
    f"sort -rn {SETUP_PATH} | tr '\\n' ' '",  # descending: wrong
    f"python3 -c \"print(*sorted(int(x) for x in open('{SETUP_PATH}')))\"",  # needs python3
]

# Each candidate command runs a solution and then checks it, so its exit code is its score:
# that is what `explore` ranks by (exit 0 = 1.0), and what the fallback uses too.
CANDIDATES = [
    f"{sol} > /tmp/answer; cat /tmp/answer; [ \"$(cat /tmp/answer)\" = '{EXPECTED}' ]"
    for sol in SOLUTIONS
]


@dataclass
class Outcome:
    index: int
    sandbox: AsyncSandbox
    exit_code: int
    stdout: str
    score: float


def score(exit_code: int) -> float:
    """The same rule as explore's default: 1.0 for exit 0, else 0.0."""
    return 1.0 if exit_code == 0 else 0.0


async def with_explore(client: AsyncClient, base: AsyncSandbox) -> Optional[str]:
    """The server-side way: one call; the losers are destroyed by the server."""
    result = await base.explore(CANDIDATES, timeout=60, keep="winner")
    for o in result.outcomes:
        print(f"  candidate {o.index}: exit {o.exit_code}, score {o.score}")
    if result.winner is None or result.winner.score <= 0:
        return None
    print(f"explore: winner is candidate {result.winner.index} in {result.winner.sandbox_id}")
    if result.winner.sandbox_id:
        # The winning fork is kept; in a real run you would go on working in it.
        winner = await AsyncSandbox.connect(result.winner.sandbox_id, client=client)
        await winner.kill()
        await winner.close()
    return result.winner.stdout


async def by_hand(client: AsyncClient, template: Optional[str]) -> Optional[str]:
    """The fallback: N sandboxes, each with the setup repeated, run concurrently."""

    async def attempt(i: int, cmd: str) -> Outcome:
        sb = await AsyncSandbox.create(
            template=template, client=client, ttl_seconds=300, metadata={"example": "best_of_n"}
        )
        await sb.files.write(SETUP_PATH, SETUP_DATA)
        r = await sb.exec(cmd, timeout=60)
        return Outcome(i, sb, r.exit_code, r.stdout, score(r.exit_code))

    outcomes: List[Outcome] = list(
        await asyncio.gather(*(attempt(i, c) for i, c in enumerate(CANDIDATES)))
    )
    for o in outcomes:
        print(
            f"  candidate {o.index}: exit {o.exit_code}, score {o.score},"
            f" stdout {o.stdout.strip()!r}"
        )
    best = max(outcomes, key=lambda o: (o.score, -o.index))
    if best.score <= 0:
        best_stdout: Optional[str] = None
    else:
        best_stdout = best.stdout
    # Keep the winner's sandbox (in a real run you would go on working in it); kill the rest.
    await asyncio.gather(*(o.sandbox.kill() for o in outcomes if o is not best))
    print(f"by hand: winner is candidate {best.index} in {best.sandbox.id}")
    try:
        return best_stdout
    finally:
        await best.sandbox.kill()  # this demo has nothing more to do with it
        for o in outcomes:
            await o.sandbox.close()


async def main() -> int:
    template = os.environ.get("HUTCH_TEMPLATE")
    async with AsyncClient() as client:
        async with AsyncSandbox.create(template=template, client=client) as base:
            await base.files.write(SETUP_PATH, SETUP_DATA)
            try:
                answer = await with_explore(client, base)
            except (NotFoundError, InvalidRequest) as e:
                # 404 (`Unsupported`) or 422: this server has no explore yet.
                print(f"explore is not available on this server ({e}); falling back to N sandboxes")
                answer = await by_hand(client, template)
    print(f"best answer: {answer!r}")
    return 0 if answer is not None and answer.strip() == EXPECTED else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
