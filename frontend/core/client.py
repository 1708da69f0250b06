"""CoreClient: the frontend's DEALER socket to the engine core, and the demultiplexer of replies."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import Any

import msgspec
import zmq
import zmq.asyncio
import zmq.auth
import zmq.utils.monitor

from frontend.core.progress import CoreProgress
from frontend.core.request_stream import RequestStream, rejection_error, unavailable
from shared import protocol
from shared.core_link import NO_KEYS, CurveKeys, check_protected
from shared.errors import ErrorCode, ServingError
from shared.protocol import (
    Abort,
    Accepted,
    Busy,
    Bye,
    Embed,
    Embedded,
    FinishReason,
    GetStats,
    Heartbeat,
    Hello,
    Rejected,
    Shutdown,
    ShutdownCore,
    Stats,
    Step,
    Submit,
    ToCore,
    TokenEvent,
    Welcome,
)

log = logging.getLogger(__name__)

# what the connection's monitor reports: the core hung up, or refused our CURVE handshake
_MONITORED = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_REFUSED = _MONITORED & ~zmq.EVENT_DISCONNECTED


def _close(socket: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket, linger_ms: int) -> None:
    """Close a connection's socket and its monitor, the monitor stopped first. zmq's I/O
    thread sends a monitor's events blocking, under a lock: one sent after our end of the
    monitor closed (the lost core's DISCONNECTED, late on a loaded host) waits for a reader
    for good, and every socket of the context with it: each later connection sat without a
    single event, its Hello queued, and the frontend never handshook again (CI: stop 47
    and 6bc2d40; reproduced ~1 in 15 beside a cold numba compile)."""
    socket.disable_monitor()
    monitor.close(linger=0)
    socket.close(linger=linger_ms)


def curve_options(keys: CurveKeys) -> dict[int, bytes]:
    """The DEALER's CURVE client options: the core's public key and our own key pair."""
    if not keys.enabled:
        return {}
    try:
        core_public, _ = zmq.auth.load_certificate(keys.core)
        public, secret = zmq.auth.load_certificate(keys.frontend) if keys.frontend else (b"", None)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the CURVE certificates: {e}") from e
    if secret is None:
        raise ValueError(
            f"curve_frontend_key {keys.frontend!r} must be this frontend's secret certificate"
        )
    return {
        zmq.CURVE_SERVERKEY: core_public,
        zmq.CURVE_PUBLICKEY: public,
        zmq.CURVE_SECRETKEY: secret,
    }


def _check_endpoint(context: zmq.Context[Any], address: str) -> None:
    """Refuse at start an address zmq cannot parse (a tcp:// one without a numeric port):
    the link's task would otherwise meet it at each connection, with no core ever."""
    probe = context.socket(zmq.DEALER)
    try:
        probe.connect(address)
        return
    except zmq.ZMQError as e:
        error = e
    finally:
        probe.close(linger=0)
    context.term()
    raise ValueError(f"cannot connect to the engine core at {address!r}: {error}")


class CoreClient:
    """Requests out over one DEALER; Welcome, Step, Rejected, Embedded and Stats routed back.

    The core never answers a Heartbeat, so silence is probed with GetStats, which it always
    answers between steps; inside a long step it says Busy every second instead. A core
    whose connection closes, or silent for `silence_s`, or that says Shutdown, is lost:
    every open request fails with 503 engine_unavailable and the socket is replaced by a new
    one that says Hello (a new identity: a successor on the same address knows neither the
    old one nor its requests, and nothing queued for the dead core reaches it).
    """

    def __init__(
        self,
        address: str,
        *,
        keys: CurveKeys = NO_KEYS,
        heartbeat_s: float = 1.0,
        silence_s: float = 10.0,
    ) -> None:
        check_protected(address, keys, "frontend")
        self._curve = curve_options(keys)
        self._refused_logged = False
        self.address = address
        self._heartbeat_s = heartbeat_s
        self._silence_s = silence_s
        self._context = zmq.asyncio.Context()
        _check_endpoint(self._context, address)
        self._encoder = protocol.encoder()
        self._decoder = protocol.frontend_decoder()
        self._connections = itertools.count()
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._embeds: dict[str, asyncio.Future[Embedded]] = {}
        self._stats: list[asyncio.Future[Stats]] = []
        self._welcome: Welcome | None = None
        self._welcomed = asyncio.Event()
        self._lost = asyncio.Event()
        self._last_heard = 0.0
        self._progress = CoreProgress(0.0)
        self._unready_since = 0.0  # when the core was last lost (or the client started)
        self._closing = False
        self._core_stopping = False  # ShutdownCore sent: its Shutdown is no surprise
        self._linger_ms = 0
        self._task: asyncio.Task[None] | None = None
        self._io: list[asyncio.Task[None]] = []  # the current connection's reader, writer, monitor
        self.identity = ""
        self.last_welcome: Welcome | None = None  # kept after a loss: which core pid handshook

    @property
    def ready(self) -> bool:
        return self._welcome is not None and not self._closing

    def require_welcome(self) -> Welcome:
        """The current core's Welcome; 503 engine_unavailable if there is no core."""
        if self._welcome is None or self._closing:
            raise ServingError(ErrorCode.ENGINE_UNAVAILABLE, "The engine core is not ready.")
        return self._welcome

    def stalled_for(self) -> float:
        """Seconds the core has gone without stepping or being idle (see CoreProgress)."""
        return self._progress.stalled_for(asyncio.get_running_loop().time())

    def unready_for(self) -> float:
        """Seconds without a core that has handshaken; 0 while there is one, or once the core
        was told to stop."""
        if self.ready or self._core_stopping:
            return 0.0
        return asyncio.get_running_loop().time() - self._unready_since

    async def start(self) -> None:
        assert self._task is None
        self._unready_since = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._run(), name="core-client")

    async def wait_ready(self, timeout: float | None = None) -> Welcome:
        while True:
            await asyncio.wait_for(self._welcomed.wait(), timeout)
            if self._welcome is not None:
                return self._welcome

    def submit(self, submits: list[Submit]) -> RequestStream:
        """Send the Submits of one HTTP request (one per prompt, n choices each); their
        answers come on one stream."""
        self.require_welcome()
        rids = [s.rid for s in submits]
        if any(rid in self._streams for rid in rids) or len(set(rids)) != len(rids):
            raise ServingError(
                ErrorCode.INVALID_VALUE, "This request id is in use.", "X-Request-Id"
            )
        stream = RequestStream(rids, submits[0].n)
        for submit in submits:
            self._streams[submit.rid] = stream
            self._send(submit)
        return stream

    def release(self, stream: RequestStream) -> None:
        """The handler is done with `stream`: abort it in the core if it is still running."""
        if not stream.closed:
            stream.closed = True
            for rid in stream.rids:
                self._streams.pop(rid, None)
            # synchronous: this runs in `finally` of a cancelled handler, and must not be lost
            self._send(Abort(list(stream.rids)))

    def abort_choice(self, stream: RequestStream, index: int) -> None:
        """The handler ended choice `index` (a stop string): the core stops generating it."""
        rid, local, done = stream.drop(index)
        if done:
            self._streams.pop(rid, None)
        self._send(Abort([rid], local))

    async def embed(self, rid: str, inputs: list[list[int]]) -> Embedded:
        self.require_welcome()
        future: asyncio.Future[Embedded] = asyncio.get_running_loop().create_future()
        self._embeds[rid] = future
        self._send(Embed(rid, inputs))
        try:
            return await future
        finally:
            if self._embeds.pop(rid, None) is not None:
                self._send(Abort([rid]))  # the client left before the vectors came

    async def stats(self, timeout: float) -> Stats | None:
        """The core's gauges and counters now; None if there is no core or it does not answer."""
        if not self.ready:
            return None
        future: asyncio.Future[Stats] = asyncio.get_running_loop().create_future()
        self._stats.append(future)
        self._send(GetStats())
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            if future in self._stats:
                self._stats.remove(future)

    def shutdown_core(self, token: str) -> None:
        """Ask the core to drain and exit; it obeys only the token its spawner gave it."""
        self._core_stopping = True
        self._send(ShutdownCore(token))

    def lose(self, reason: str) -> None:
        """The core is gone: fail everything waiting on it and connect afresh."""
        if self._welcome is not None and not self._closing:
            level = logging.INFO if self._core_stopping else logging.WARNING
            log.log(level, "engine core lost: %s", reason)
            self._unready_since = asyncio.get_running_loop().time()
        self._welcome = None
        self._welcomed.clear()
        for stream in set(self._streams.values()):
            stream.put(unavailable(reason))
        self._streams.clear()
        waiters: list[asyncio.Future[Any]] = [*self._embeds.values(), *self._stats]
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(unavailable(reason))
        self._embeds.clear()
        self._stats.clear()
        self._lost.set()

    async def close(self) -> None:
        """Say Bye, stop the tasks and close the socket."""
        self._closing = True
        if self._task is not None:
            if self._welcome is not None:
                self._send(Bye())
                try:
                    await asyncio.wait_for(self._outbox.join(), 1.0)
                except TimeoutError:
                    log.warning("engine core did not take Bye")
                self._linger_ms = 500  # Bye is in the socket: let it leave
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.lose("the frontend is closing")
        self._context.term()

    # ---- the connection ------------------------------------------------------------------

    def _send(self, message: ToCore) -> None:
        self._outbox.put_nowait(self._encoder.encode(message))

    def _connect(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        """A new DEALER with a new identity, connecting; and the PAIR its monitor reports on."""
        number = next(self._connections)
        socket = self._context.socket(zmq.DEALER)
        try:
            self.identity = f"fe-{os.getpid()}-{number}"
            socket.setsockopt(zmq.IDENTITY, self.identity.encode())
            socket.setsockopt(zmq.LINGER, 0)
            for option, value in self._curve.items():
                socket.setsockopt(option, value)
            # named by the connection, not by pyzmq's default (the socket's file descriptor):
            # a closed socket's descriptor is reused at once while its monitor's endpoint
            # stays bound until zmq reaps it, and then this bind fails
            monitor = socket.get_monitor_socket(_MONITORED, f"inproc://core-monitor-{number}")
        except zmq.ZMQError:
            socket.close(linger=0)
            raise
        try:
            socket.connect(self.address)
        except zmq.ZMQError:
            _close(socket, monitor, 0)
            raise
        return socket, monitor

    async def _run(self) -> None:
        """One connection after another: each lives until the core is lost. Nothing ends this
        task but close(): a frontend whose link died would stay unready for good, silently."""
        while True:
            try:
                socket, monitor = self._connect()
            except zmq.ZMQError as e:
                log.error("cannot connect to the engine core at %s: %s; retrying", self.address, e)
                await asyncio.sleep(self._heartbeat_s)
                continue
            try:
                await self._connection(socket, monitor)
            except Exception:
                log.exception(
                    "the link to the engine core at %s failed; reconnecting", self.address
                )
                self.lose("its link failed")
                await asyncio.sleep(self._heartbeat_s)
            if self._core_stopping:
                await asyncio.Event().wait()  # it was told to go: nobody to reconnect to

    async def _connection(self, socket: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        """Hello, then read, write and watch the monitor until the core is lost; a reader,
        writer or monitor task that fails loses it too (logged), so the next connection comes."""
        self._outbox = asyncio.Queue()  # what was meant for the lost core is dropped
        self._lost.clear()
        self._send(Hello(self.identity))
        io = [
            asyncio.create_task(self._read(socket), name="core-client-read"),
            asyncio.create_task(self._write(socket), name="core-client-write"),
            asyncio.create_task(self._hang_up(monitor), name="core-client-monitor"),
        ]
        self._io = io
        for task in io:
            task.add_done_callback(self._io_ended)
        try:
            await self._watch()
        finally:
            self._io = []
            for task in io:
                task.cancel()
            await asyncio.gather(*io, return_exceptions=True)
            _close(socket, monitor, self._linger_ms)

    def _io_ended(self, task: asyncio.Task[None]) -> None:
        if task not in self._io or task.cancelled() or task.exception() is None:
            return  # (a connection already ended: its failure is of no consequence)
        error = task.exception()
        log.error("%s failed: %r; reconnecting", task.get_name(), error, exc_info=error)
        self.lose(f"its link failed ({task.get_name()}: {error!r})")

    async def _watch(self) -> None:
        """Heartbeat every tick; probe a quiet core with GetStats; give up on a silent one."""
        loop = asyncio.get_running_loop()
        while not self._lost.is_set():
            try:
                await asyncio.wait_for(self._lost.wait(), self._heartbeat_s)
                return
            except TimeoutError:
                pass
            self._send(Heartbeat())
            if self._welcome is None:
                continue  # a starting core may compile for minutes before it answers Hello
            quiet = loop.time() - self._last_heard
            if quiet > self._silence_s:
                self.lose(f"no message for {quiet:.1f} s")
            elif quiet > self._heartbeat_s:
                self._send(GetStats())

    async def _hang_up(self, monitor: zmq.asyncio.Socket) -> None:
        """The core's end closed (it died, or exited), or it refused our CURVE handshake:
        lost now, not after `silence_s`."""
        event = zmq.utils.monitor.parse_monitor_message(await monitor.recv_multipart())
        refused = bool(event["event"] & _REFUSED)
        if refused and not self._refused_logged:
            log.error("the engine core at %s refused our CURVE key; retrying", self.address)
            self._refused_logged = True
        if self._welcome is None:  # no handshake yet: never spin on a peer that hangs up
            await asyncio.sleep(self._heartbeat_s)
        self.lose("it refused our key" if refused else "its connection closed")

    async def _write(self, socket: zmq.asyncio.Socket) -> None:
        outbox = self._outbox
        while True:
            data = await outbox.get()
            try:
                await socket.send(data)
            finally:
                outbox.task_done()

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frames = await socket.recv_multipart()
            self._last_heard = now = loop.time()
            try:
                message = self._decoder.decode(frames[-1])
            except msgspec.DecodeError as e:
                log.error("undecodable message from the engine core: %s", e)
                continue
            self._dispatch(message, now)

    def _dispatch(self, message: protocol.ToFrontend, now: float) -> None:
        match message:
            case Welcome():
                self._welcome = self.last_welcome = message
                self._welcomed.set()
                self._progress.restart(now)
                log.info("engine core ready: %s", message)
            case Accepted(rid=rid):
                stream = self._streams.get(rid)
                if stream is not None:
                    stream.admit(rid)
            case Step(events=events):
                self._progress.stepped(now)
                for event in events:
                    self._route(event)
            case Rejected():
                self._rejected(message)
            case Embedded(rid=rid):
                self._progress.stepped(now)
                future = self._embeds.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(message)
            case Stats():
                self._progress.stats(message, now)
                for waiter in self._stats:
                    if not waiter.done():
                        waiter.set_result(message)
                self._stats.clear()
            case Shutdown(reason=reason):
                self.lose(f"it shut down ({reason})")
            case Busy():
                # alive inside a long step (_read noted the time), but no progress: a wedged
                # step says Busy too, and CoreProgress must see that one stall
                pass

    def _rejected(self, message: Rejected) -> None:
        stream = self._streams.get(message.rid)
        if stream is not None:
            self._fail(stream, rejection_error(message))
        future = self._embeds.pop(message.rid, None)
        if future is not None and not future.done():
            future.set_exception(rejection_error(message))

    def _route(self, event: TokenEvent) -> None:
        stream = self._streams.get(event.rid)
        if stream is None:
            return  # aborted by us: its last tokens are of no use
        if event.finish is FinishReason.ABORT:
            self._fail(stream, unavailable("it aborted the request"))
        elif event.finish is FinishReason.ERROR:
            error = ServingError(ErrorCode.INTERNAL_ERROR, "The engine core failed the request.")
            self._fail(stream, error)
        elif stream.put(event):  # every choice of this Submit has finished
            del self._streams[event.rid]

    def _fail(self, stream: RequestStream, error: ServingError) -> None:
        """The whole request ends with `error`: its other Submits are of no use either."""
        stream.put(error)
        for rid in stream.rids:
            self._streams.pop(rid, None)
        if len(stream.rids) > 1:
            self._send(Abort(list(stream.rids)))
