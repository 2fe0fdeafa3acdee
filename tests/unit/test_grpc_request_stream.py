"""The replay buffer of streamed requests (A6 buffered RPCs), fed from an in-memory client stream."""

from __future__ import annotations

import asyncio

from sidecar.adapters.grpc.replay import EOF, RequestStream


class Client:
    """A client stream: the test puts messages (or EOF, or an exception to raise); the writers read them,
    one read at a time (grpc allows one receive operation in flight on a call)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reads = 0
        self.reading = False

    async def read(self) -> object:
        assert not self.reading, "two reads of the client at once"
        self.reading = True
        try:
            msg = await self.queue.get()
        finally:
            self.reading = False
        self.reads += 1
        if isinstance(msg, Exception):
            raise msg
        return msg

    def send(self, *msgs: object) -> None:
        for m in msgs:
            self.queue.put_nowait(m)


class Upstream:
    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.closed = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def write(self, m: bytes) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.got.append(m)

    async def done_writing(self) -> None:
        self.closed.set()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_each_message_goes_upstream_as_it_arrives_before_the_request_ends() -> None:
    c = Client()
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    c.send(b"hello")
    while up.got != [b"hello"]:  # an interactive client waits for an answer here: no window, no more reads
        await s._wait()
    assert not up.closed.is_set()
    c.send(b"again")
    while len(up.got) < 2:
        await s._wait()
    c.send(EOF)
    await t
    assert up.got == [b"hello", b"again"] and up.closed.is_set()
    s.close()


async def test_request_complete_once_the_whole_request_went_upstream() -> None:
    c = Client()
    completed: list[int] = []
    s = RequestStream(c.read, limit=1024, on_complete=lambda: completed.append(1))
    one, two = Upstream(), Upstream()
    one.gate = asyncio.Event()
    t1 = asyncio.create_task(s.feed(1, one.write, one.done_writing, lambda: None))
    c.send(b"a", EOF)
    await settle()
    assert completed == []  # the client is done, but the message has not gone upstream yet
    one.gate.set()
    await t1
    assert completed == [1]
    await s.feed(2, two.write, two.done_writing, lambda: None)  # a retry replays it: not complete again
    assert completed == [1] and two.got == [b"a"]
    s.close()


async def test_every_attempt_gets_the_whole_stream_buffered_and_live() -> None:
    c = Client()
    c.send(b"a", b"b")
    s = RequestStream(c.read, limit=1024)
    one, two = Upstream(), Upstream()
    t1 = asyncio.create_task(s.feed(1, one.write, one.done_writing, lambda: None))
    await settle()
    c.send(b"c")
    await settle()
    t2 = asyncio.create_task(s.feed(2, two.write, two.done_writing, lambda: None))  # a retry replays
    c.send(b"d", EOF)
    await asyncio.gather(t1, t2)
    assert one.got == two.got == [b"a", b"b", b"c", b"d"]
    assert one.closed.is_set() and two.closed.is_set()
    s.close()


async def test_overflow_during_an_attempt_seals_and_trims() -> None:
    c = Client()
    sealed: list[bool] = []
    overflows: list[int] = []
    s = RequestStream(c.read, limit=10, on_overflow=lambda: sealed.append(True))
    up = Upstream()
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: overflows.append(1)))
    c.send(b"123456", b"789012")
    await settle()
    assert not s.replayable and s.overflowed and sealed == [True] and overflows == [1]
    c.send(b"x" * 5, EOF)
    await t
    assert up.got == [b"123456", b"789012", b"xxxxx"]
    assert s.kept.pieces == [] and s.kept.size == 0  # nothing kept once sent
    s.close()


async def test_with_no_attempt_out_nothing_is_read() -> None:
    c = Client()
    s = RequestStream(c.read, limit=10)
    c.send(b"x" * 11, b"more", EOF)
    await settle()
    assert c.reads == 0 and s.replayable  # the client waits: the first attempt gets it all
    up = Upstream()
    await s.feed(1, up.write, up.done_writing, lambda: None)
    assert up.got == [b"x" * 11, b"more"] and up.closed.is_set() and not s.replayable
    s.close()


async def test_an_attempt_that_ends_while_its_writer_reads_loses_no_message() -> None:
    """The writer reading the client when its attempt ends finishes the read (a read abandoned half-way
    would lose the message): the next attempt gets every message, once each."""
    c = Client()
    s = RequestStream(c.read, limit=1024)
    one, two = Upstream(), Upstream()
    c.send(b"a")
    t1 = asyncio.create_task(s.feed(1, one.write, one.done_writing, lambda: None))
    while one.got != [b"a"]:
        await s._wait()
    await settle()
    assert c.reading  # attempt 1's writer waits for the client's next message
    s.stop(1, t1)  # attempt 1 ended (the upstream failed it early)
    assert not t1.done()
    t2 = asyncio.create_task(s.feed(2, two.write, two.done_writing, lambda: None))  # the retry
    await settle()
    assert two.got == [b"a"] and c.reads == 1  # replayed; the next message is still being read by t1
    c.send(b"b")
    await asyncio.wait_for(t1, 10)  # read "b", kept it, stopped: not sent to the ended attempt
    assert one.got == [b"a"] and not one.closed.is_set()
    c.send(EOF)
    await asyncio.wait_for(t2, 10)
    assert two.got == [b"a", b"b"] and two.closed.is_set() and c.reads == 3
    s.close()


async def test_a_writer_stopped_while_not_reading_is_cancelled() -> None:
    c = Client()
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    up.gate = asyncio.Event()  # in a write upstream
    c.send(b"a", b"b")
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    await settle()
    s.stop(1, t)
    await asyncio.wait((t,))
    assert t.cancelled() and c.reads == 1
    up2 = Upstream()
    c.send(EOF)
    await s.feed(2, up2.write, up2.done_writing, lambda: None)
    assert up2.got == [b"a", b"b"] and up2.closed.is_set()
    s.close()


async def test_a_broken_client_stream_is_read_once_and_never_half_closed() -> None:
    c = Client()
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    c.send(b"a", RuntimeError("the client's call ended"))
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    await settle()
    assert up.got == [b"a"] and c.reads == 2 and s.broken and not t.done()  # waits: no read again
    s.close()
    await asyncio.wait_for(t, 10)
    assert not up.closed.is_set()


async def test_a_read_out_when_the_call_ends_is_cancelled() -> None:
    c = Client()
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    await settle()
    assert c.reading
    s.close()
    await asyncio.wait((t,))
    assert t.cancelled() and not c.reading and not up.closed.is_set()


async def test_after_sealing_the_pump_waits_for_the_upstream_to_take_messages() -> None:
    c = Client()
    s = RequestStream(c.read, limit=10)
    up = Upstream()
    up.gate = asyncio.Event()  # the upstream is slow
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    s.seal()  # e.g. the response started: no more attempts
    c.send(*([b"y" * 4] * 10), EOF)
    await settle()
    assert c.reads <= 4  # backpressure: at most ~limit bytes wait
    up.gate.set()
    await t
    assert len(up.got) == 10
    s.close()


async def test_held_messages_count_against_the_shared_budget_and_reading_stops_while_it_is_full() -> None:
    from sidecar.buffer_budget import BufferBudget

    budget = BufferBudget(1000)
    c1, c2 = Client(), Client()
    s1 = RequestStream(c1.read, limit=10_000, budget=budget)
    s2 = RequestStream(c2.read, limit=10_000, budget=budget)
    up1, up2 = Upstream(), Upstream()
    t1 = asyncio.create_task(s1.feed(1, up1.write, up1.done_writing, lambda: None))
    t2 = asyncio.create_task(s2.feed(1, up2.write, up2.done_writing, lambda: None))
    c1.send(b"a" * 600, b"b" * 600, b"c" * 10)
    await settle()
    assert budget.used == 1200 and c1.reads == 2  # over by the message in hand, then no more reading
    c2.send(b"d" * 10)
    await settle()
    assert c2.reads == 0 and s2.kept.size == 0  # another call waits as well
    s1.close()  # the first call ends: its bytes go back, the second reads on
    await settle()
    assert c2.reads == 1 and budget.used == 10 and up2.got == [b"d" * 10]
    s2.close()
    assert budget.used == 0
    await asyncio.wait((t1, t2), timeout=10)
    assert t1.done() and t2.done()


async def test_a_write_in_flight_when_the_call_ends_sends_nothing_more() -> None:
    """The call ended (``close``: its messages let go) while an attempt's writer was still in a write: once
    that write returns, the writer stops. (It read the next message at a position let go: an IndexError,
    seen by the fuzzer as a traceback in about one run in three.)"""
    c = Client()
    c.send(b"a", b"b")
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    up.gate = asyncio.Event()  # the upstream takes "a" slowly
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    await settle()
    s.close()  # the call is over (its answer was given): the attempt's cancel has not reached the writer yet
    up.gate.set()
    await t
    assert up.got == [b"a"] and not up.closed.is_set()  # no further message, no half-close for half a request


async def test_a_writer_waiting_for_messages_when_the_call_ends_stops() -> None:
    c = Client()
    c.send(b"a")
    s = RequestStream(c.read, limit=1024)
    up = Upstream()
    t = asyncio.create_task(s.feed(1, up.write, up.done_writing, lambda: None))
    while up.got != [b"a"]:
        await s._wait()
    s.close()  # (it was reading the client's next message: the read is cancelled with the call)
    await asyncio.wait((t,), timeout=10)  # (a bound for the failure: it ends at once)
    assert t.done() and not up.closed.is_set()
    await s.feed(2, up.write, up.done_writing, lambda: None)  # an attempt after the end sends nothing
    assert up.got == [b"a"] and not up.closed.is_set()
