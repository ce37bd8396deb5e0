"""Root-task guard and signal capture."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from sidecar._aio import RootTaskExitedError, capture_signals, guard


class TestGuard:
    async def test_early_exit_is_an_error(self):
        """A root task returning before shutdown raises and requests shutdown."""
        stopping = asyncio.Event()

        async def quits() -> None:
            return None

        with pytest.raises(RootTaskExitedError, match="quitter"):
            await guard(quits(), name="quitter", stopping=stopping)
        assert stopping.is_set()

    async def test_exit_after_stop_is_fine(self):
        """A root task that returns after shutdown was requested ends quietly."""
        stopping = asyncio.Event()

        async def waits() -> None:
            await stopping.wait()

        task = asyncio.create_task(guard(waits(), name="waiter", stopping=stopping))
        stopping.set()
        await task

    async def test_failure_requests_shutdown(self):
        """A failing root task sets the stopping event and re-raises."""
        stopping = asyncio.Event()

        async def fails() -> None:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await guard(fails(), name="failer", stopping=stopping)
        assert stopping.is_set()


class TestCaptureSignals:
    async def test_first_sigterm_sets_the_event_second_cancels(self):
        """SIGTERM once asks for a graceful stop; twice cancels the main task."""
        stopping = asyncio.Event()

        async def main() -> None:
            with capture_signals(stopping):
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.wait_for(stopping.wait(), 5)
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)  # cancelled by the second signal

        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(main())
        assert stopping.is_set()
