"""What the read socket's stall deadline costs each write of a response body.

Every write of a body (a streamed flush of up to 256 KiB, a planned response's piece) runs
under :func:`sidecar._sendfile.progressing`: a deadline and a look at the bytes not yet taken
every quarter of it. This times a write that completes at once, with and without it, side by
side in one process (CPU time per write), on uvloop as the daemon runs.

    .venv/bin/python tests/bench/bench_write_deadline.py [--writes N] [--rounds R]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import uvloop

from sidecar._sendfile import progressing


class _Transport:
    """A transport whose buffer is always empty (the peer keeps up), with no socket."""

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> Any:
        return None


async def _written() -> None:
    """A write that completes without waiting (below the transport's high-water mark)."""


async def _main(writes: int, rounds: int) -> None:
    transport: Any = _Transport()
    for round_ in range(rounds):
        started = time.process_time()
        for _ in range(writes):
            await _written()
        bare = time.process_time() - started
        started = time.process_time()
        for _ in range(writes):
            await progressing(transport, _written(), 60.0)
        guarded = time.process_time() - started
        print(
            f"round {round_ + 1}: bare {bare / writes * 1e6:.2f} us, under the deadline"
            f" {guarded / writes * 1e6:.2f} us CPU per write; extra"
            f" {(guarded - bare) / writes * 1e6:.2f} us"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uvloop.run(_main(args.writes, args.rounds))


if __name__ == "__main__":
    main()
