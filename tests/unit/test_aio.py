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

    async def test_a_cancellation_the_task_was_not_sent_is_an_error(self):
        """A CancelledError from a future the root task awaited (cancelled by someone else)
        ends the task as cancelled, which a TaskGroup drops without a word: the component
        would be gone while the daemon runs on. It is an error that requests shutdown."""
        stopping = asyncio.Event()

        async def awaits_a_cancelled_future() -> None:
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future

        with pytest.raises(ExceptionGroup) as caught:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(guard(awaits_a_cancelled_future(), name="reader", stopping=stopping))
        assert [type(e) for e in caught.value.exceptions] == [RootTaskExitedError]
        assert "reader" in str(caught.value.exceptions[0])
        assert stopping.is_set()

    async def test_a_cancelled_task_stays_cancelled(self):
        """Cancelling the root task itself (the task group stopping) propagates as is."""
        stopping = asyncio.Event()
        started = asyncio.Event()

        async def waits() -> None:
            started.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(guard(waits(), name="waiter", stopping=stopping))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not stopping.is_set()


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
