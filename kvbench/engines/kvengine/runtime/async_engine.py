"""The engine on a thread of its own, fed from asyncio: model compute never blocks the HTTP event loop.

Requests and aborts go in through a thread-safe inbox; each request's outputs come back on an asyncio queue
of the loop that asked (`loop.call_soon_threadsafe`). Torch releases the GIL in its kernels, so the event
loop keeps streaming while a step computes.

A failure of one request arrives as that request's error (see `Engine.step`). An exception out of the step
loop means the engine is broken: every stream gets the error, later calls raise, and `on_fatal(exc)` is called
on the engine thread, so that the server can exit (non-zero) rather than answer 503 forever.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.requests import GenerationRequest, StepOutput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Add:
    request: GenerationRequest
    deliver: Callable[[StepOutput], None]


@dataclass(frozen=True)
class _Abort:
    request_id: str
    reason: str


@dataclass(frozen=True)
class _Call:
    """Run `fn(engine)` on the engine thread between steps; its result goes to `deliver`."""

    fn: Callable[[Engine], object]
    deliver: Callable[[object], None]


class AsyncEngine:
    def __init__(self, engine: Engine, on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.on_fatal = on_fatal
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._deliver: dict[str, Callable[[StepOutput], None]] = {}
        self._thread = threading.Thread(target=self._loop, name="kvengine-steps", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        self.engine.close()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StepOutput]:
        """Stream a request's outputs; leaving the iteration early aborts the request. The request is one the
        server checked (`engine.limits.check`); one the engine refuses arrives as its error."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._send(_Add(request, lambda output: loop.call_soon_threadsafe(outputs.put_nowait, output)))
        finished = False
        try:
            while True:
                output = await outputs.get()
                if output.error is not None:
                    raise RuntimeError(output.error)
                finished = output.finished
                yield output
                if finished:
                    return
        finally:
            if not finished:
                self._post(_Abort(request.request_id, "abort"))  # never raises: the error above is the news

    def abort(self, request_id: str, reason: str) -> None:
        self._send(_Abort(request_id, reason))

    def park(self, request_id: str) -> None:
        """Set the request aside between steps (`Engine.park`: no slot, no device page) until `resume`."""
        self._send(_Call(lambda engine: engine.park(request_id), _ignore))

    def resume(self, request_id: str) -> None:
        self._send(_Call(lambda engine: engine.resume(request_id), _ignore))

    async def call(self, fn: Callable[[Engine], object]) -> object:
        """Run `fn(engine)` between two steps and return its result (e.g. a cache reset)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._send(_Call(fn, lambda result: loop.call_soon_threadsafe(_settle, future, result)))
        return await future

    def _send(self, message: object) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the engine stopped: {self.failure}")
        self._post(message)

    def _post(self, message: object) -> None:
        self._inbox.put(message)
        self._wake.set()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain()
                if not self.engine.has_work():
                    self.engine.step()  # idle: only keeps the KV tiers in order (TTL demotions)
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                for output in self.engine.step():
                    self._emit(output)
        except BaseException as exc:  # the engine is broken: fail every stream rather than hang it
            self.failure = exc
            error = f"engine failure: {type(exc).__name__}: {exc}"
            for request_id, deliver in list(self._deliver.items()):
                deliver(StepOutput(request_id, None, error=error))
            self._deliver.clear()
            self._fail_inbox(error)
            log.error("engine failure", exc_info=exc)
            if self.on_fatal is not None:
                self.on_fatal(exc)

    def _fail_inbox(self, error: str) -> None:
        """Answer what was sent but never taken: requests get the error, calls raise it."""
        for message in self._pending():
            if isinstance(message, _Add):
                message.deliver(StepOutput(message.request.request_id, None, error=error))
            elif isinstance(message, _Call):
                message.deliver(RuntimeError(error))

    def _pending(self) -> Iterator[object]:
        """The inbox's messages, taken one by one until it is empty."""
        while True:
            try:
                yield self._inbox.get_nowait()
            except queue.Empty:
                return

    def _drain(self) -> None:
        for message in self._pending():
            if isinstance(message, _Add):
                try:
                    self.engine.add(message.request)
                except ValueError as exc:
                    message.deliver(StepOutput(message.request.request_id, None, error=str(exc)))
                    continue
                self._deliver[message.request.request_id] = message.deliver
            elif isinstance(message, _Abort):
                output = self.engine.abort(message.request_id, message.reason)
                if output is not None:
                    self._emit(output)
            elif isinstance(message, _Call):
                try:
                    message.deliver(message.fn(self.engine))
                except Exception as exc:  # delivered to the caller, who raises it
                    message.deliver(exc)

    def _emit(self, output: StepOutput) -> None:
        deliver = self._deliver.get(output.request_id)
        if deliver is None:
            return
        if output.finished:
            del self._deliver[output.request_id]
        deliver(output)


def _ignore(result: object) -> None:
    """The answer of a call nobody waits for (an exception there is the request's own news, sent elsewhere)."""


def _settle(future: asyncio.Future, result: object) -> None:
    if future.done():
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
