"""kl for asyncio: ``AsyncProducer``, ``AsyncConsumer`` and ``AsyncGroupConsumer``.

async with kl.aio.AsyncProducer(root) as producer:
    appended = await producer.send("events", b"hello")
async with kl.aio.AsyncConsumer(root, "events") as consumer:
    async for record in consumer:
        print(record.offset, record.value)

Each object wraps its sync twin (``kl.Producer``, ``kl.Consumer``, ``kl.GroupConsumer``;
``kl.RemoteProducer`` and ``kl.RemoteConsumer`` for a ``kl.net.remote.RemoteRoot``) and
runs every call of it on a thread of its own, one call after the other in the order they
were made: file locks, appends, fsyncs and reads never block the event loop, and one
producer's sends append in call order.  A consumer that has caught up waits on the loop,
not on its thread: through ``loop.add_reader`` on its ``kl.follow.Watch``'s inotify
descriptor, woken as a writer publishes, and by a timer every poll interval, the backstop
and all there is on NFS and over the network (``Consumer.follow_steps``,
``MessageStream.poll_nowait``).  The follow is the sync API's own (recreated topics, added
partitions, rebalances), and closing ends a wait at once.

Cancellation never tears or loses anything: a send, once called, is appended whole (or
fails) whether or not its caller still waits; a cancelled wait for the next message keeps
the message fetched meanwhile for the next one.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kl.errors import InvalidConfig, ProducerClosed
from kl.follow import CaughtUp
from kl.group import GroupConsumer, Record

if TYPE_CHECKING:
    from kl.consumer import Batch, Consumer, Start
    from kl.group import MessageStream
    from kl.net.remote import RemoteRoot
    from kl.producer import Appended, Producer
    from kl.serde import Deserializer
    from kl.topic import Root

__all__ = ["AsyncConsumer", "AsyncGroupConsumer", "AsyncProducer"]

T = TypeVar("T")


class _Thread:
    """The one thread an async object runs its sync twin's calls on, in call order."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._shut = False

    def submit(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """Start ``call`` after every call submitted before; its result on the running loop.
        After ``shutdown`` (the object is closed: what the sync twin does then is quick)
        on the loop's default executor."""
        loop = asyncio.get_running_loop()
        if self._shut:
            return loop.run_in_executor(None, functools.partial(call, *args, **kwargs))
        return asyncio.wrap_future(self._executor.submit(call, *args, **kwargs), loop=loop)

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call``'s result; a cancelled caller stops waiting, the call still runs to its end."""
        return await asyncio.shield(self.submit(call, *args, **kwargs))

    def shutdown(self) -> None:
        self._shut = True
        self._executor.shutdown(wait=False)


async def _settled(pending: asyncio.Future[Any] | None) -> None:
    """Wait for ``pending`` to end, whatever it gives (its caller has the error, if any)."""
    if pending is not None:
        await asyncio.wait([pending])


class _Waiter:
    """Waits on the running loop for a ``CaughtUp``'s watch: until its inotify descriptor is
    readable (``loop.add_reader``) or the step's time is up (a timer), step after step of
    ``Watch.steps``.  ``close`` ends a wait under way at once; a closed waiter never touches
    a watch again, so the thread may close it."""

    def __init__(self) -> None:
        self._wake: asyncio.Future[None] | None = None
        self.closed = False

    async def wait(self, caught_up: CaughtUp) -> None:
        watch = caught_up.watch
        steps, fd = watch.steps(caught_up.timeout), watch.fileno()
        loop = asyncio.get_running_loop()
        try:
            seconds = next(steps)
            while not self.closed:
                self._wake = wake = loop.create_future()
                timer = loop.call_later(seconds, _wake, wake)
                if fd >= 0:
                    loop.add_reader(fd, _wake, wake)
                try:
                    await wake
                finally:
                    timer.cancel()
                    if fd >= 0:
                        loop.remove_reader(fd)
                    self._wake = None
                if not self.closed:
                    seconds = next(steps)
        except StopIteration:
            pass

    def close(self) -> None:
        self.closed = True
        if self._wake is not None:
            _wake(self._wake)


def _wake(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


def _remote(root: object) -> bool:
    from kl.net.remote import RemoteRoot

    return isinstance(root, RemoteRoot)


class _Closing:
    """What the three have alike: a thread, ``close`` (and aiokafka's ``stop``) once, ``async with``."""

    _thread: _Thread
    _closed = False

    async def close(self) -> None:
        """Close the sync twin (see the class); calls after the first do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._close()
        finally:
            self._thread.shutdown()

    _next: asyncio.Future[Any] | None = None
    """A consumer's fetch under way, kept across a cancelled ``__anext__``."""

    async def _fetched(self, pending: asyncio.Future[T]) -> T:
        """What the fetch ``pending`` gave or raised; a cancelled caller leaves it (under
        way or done) for the next call."""
        try:
            got = await asyncio.shield(pending)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._next = None
            raise
        self._next = None
        return got

    async def _close(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """aiokafka's name for ``close``."""
        await self.close()

    async def __aenter__(self: C) -> C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


C = TypeVar("C", bound=_Closing)


class AsyncProducer(_Closing):
    """``kl.Producer`` (``kl.RemoteProducer`` for a ``RemoteRoot``) for asyncio; aiokafka's ``AIOKafkaProducer``.

    ``options`` are the sync producer's (``compression``, ``fsync``, ``partitioner``,
    serializers, ...), but not ``linger_ms``: every send is appended at once, in call
    order, on this producer's thread (send many and ``asyncio.gather`` them to keep the
    thread busy).

    ``send`` queues the append when it is called and returns an awaitable of its
    ``kl.Appended``: cancelling that await does not stop or undo the append (it is
    shielded), so a message whose send was called is in the log, whole and in its place,
    unless the send failed; ``await flush()`` waits for every send called before it (a
    cancelled caller learns where its message went by reading the log after that).
    ``close`` waits for the sends called before, flushes and closes the files; later
    sends raise ``ProducerClosed``.
    """

    def __init__(self, root: Root | RemoteRoot | str | os.PathLike[str], **options: Any) -> None:
        if options.get("linger_ms") is not None:
            raise InvalidConfig("AsyncProducer appends every send at once: leave linger_ms unset and gather many sends")
        from kl.net.remote import RemoteProducer
        from kl.producer import Producer

        self.producer: Producer = RemoteProducer(root, **options) if _remote(root) else Producer(root, **options)  # type: ignore[arg-type]
        """The sync twin, used only from this producer's thread."""
        self._thread = _Thread("kl-aio-producer")

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
    ) -> asyncio.Future[Appended]:
        """Append one message (``kl.Producer.send``'s arguments, no callback; bytes or None
        unless the producer has serializers): awaiting the result gives where it landed or
        raises the send's error.  Called only in a running loop; raises ``ProducerClosed``
        after ``close``."""
        if self._closed:
            raise ProducerClosed("this AsyncProducer is closed: make a new one")
        sent = self._thread.submit(self.producer.send, topic, value, key, partition, timestamp, None, headers)
        return asyncio.shield(sent)  # type: ignore[arg-type]  # a sync producer's send gives Appended

    async def send_and_wait(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
    ) -> Appended:
        """``await send(...)``, under aiokafka's name."""
        return await self.send(topic, value, key, partition, timestamp, headers)

    async def flush(self) -> None:
        """Wait for every send called before, then fsync what they wrote (``kl.Producer.flush``)."""
        await self._thread.run(self.producer.flush)

    async def _close(self) -> None:
        await self._thread.run(self.producer.close)


class AsyncConsumer(_Closing):
    """``kl.Consumer.consume(follow=True)`` (``kl.RemoteConsumer``'s for a ``RemoteRoot``) as
    an async iterator of ``kl.Record``; aiokafka's ``AIOKafkaConsumer`` with partitions assigned
    and ``seek`` done (``start``).

    ``topic`` and ``partitions`` are ``consume``'s; ``options`` are its keyword arguments
    (``start``, ``until``, ``max_messages``, ``idle_timeout``, ``skip_corrupt``, ...; not
    ``values_only``: records carry their values); ``max_bytes`` and the deserializers are
    the sync consumer's.
    Iterating waits for new messages (on the loop); it ends with ``consume`` (a bound,
    ``idle_timeout``) or ``close``, which ends a wait at once and closes the files or the
    connection.  ``start`` is resolved by the first ``__anext__`` ("latest": the end then).
    A cancelled ``__anext__`` loses nothing: the next one hands out the message it was
    waiting for.
    """

    def __init__(
        self,
        root: Root | RemoteRoot | str | os.PathLike[str],
        topic: str | Sequence[str],
        partitions: Iterable[int] | Iterable[tuple[str, int]] | None = None,
        *,
        start: Start = "earliest",
        max_bytes: int | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        **options: Any,
    ) -> None:
        if "values_only" in options or "follow" in options:
            raise InvalidConfig("AsyncConsumer follows and hands out records: pass neither values_only nor follow")
        from kl.consumer import DEFAULT_MAX_BYTES, Consumer
        from kl.net.remote import RemoteConsumer

        twin = RemoteConsumer if _remote(root) else Consumer
        self.consumer: Consumer = twin(
            root,  # type: ignore[arg-type]
            max_bytes=max_bytes or DEFAULT_MAX_BYTES,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
        )
        """The sync twin, used only from this consumer's thread."""
        self._steps = self.consumer.follow_steps(topic, partitions, start=start, **options)
        self._thread = _Thread("kl-aio-consumer")
        self._waiter = _Waiter()
        self._next: asyncio.Future[Batch | CaughtUp | None] | None = None
        self._records: Iterator[Record] = iter(())

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Record:
        while (record := next(self._records, None)) is None:
            if self._next is None:
                if self._closed:
                    raise StopAsyncIteration
                self._next = self._thread.submit(next, self._steps, None)
            got = await self._fetched(self._next)
            if got is None:
                raise StopAsyncIteration
            if isinstance(got, CaughtUp):
                await self._waiter.wait(got)  # cancelled: the next __anext__ reads again
            else:
                self._records = (Record(got.topic, got.partition, *message) for message in got.messages)  # type: ignore[misc]
        return record

    async def _close(self) -> None:
        self._waiter.close()
        await _settled(self._next)
        await self._thread.run(self._finish)

    def _finish(self) -> None:
        cast("Generator[object, None, None]", self._steps).close()
        close = getattr(self.consumer, "close", None)  # a RemoteConsumer's connection
        if close is not None:
            close()


class AsyncGroupConsumer(_Closing):
    """``kl.GroupConsumer`` for asyncio: a member of ``group``; aiokafka's ``AIOKafkaConsumer``
    with a ``group_id`` (``async for``, ``commit``, ``assignment``, ``stop``).

    ``topics`` and ``options`` are ``GroupConsumer``'s (``pattern``, ``start``, ``auto_commit``,
    ``on_assign``, ...); it joins on its thread at ``start()`` (``async with`` or the first
    ``__anext__`` call it).  Any other public method of ``GroupConsumer`` is here as a
    coroutine taking the same arguments, run on the member's thread after the calls before
    it (``await member.commit(offsets)``, ``await member.seek(...)``, ``await member.pause(...)``
    where the sync member has them).  ``assignment()`` stays a plain call.  Iterating waits
    for new messages on the loop.  A cancelled ``__anext__`` loses nothing: the next one
    hands out the record it was waiting for.  ``close`` leaves the group
    (``GroupConsumer.close``: with auto-commit, commit what was consumed) and ends iterating.
    """

    def __init__(
        self, root: Root | str | os.PathLike[str], group: str, topics: list[str] | None = None, **options: Any
    ) -> None:
        self._arguments = (root, group, topics, options)
        self._thread = _Thread("kl-aio-group")
        self._waiter = _Waiter()
        self._member: GroupConsumer | None = None
        self._stream: MessageStream | None = None
        self._next: asyncio.Future[Record | CaughtUp | None] | None = None

    @property
    def member(self) -> GroupConsumer:
        """The sync twin (after ``start``)."""
        if self._member is None:
            raise InvalidConfig("this AsyncGroupConsumer has not joined yet: await start() or use async with")
        return self._member

    async def start(self) -> None:
        """Join the group (on the member's thread); nothing happens when joined already."""
        if self._member is None:
            self._member = await self._thread.run(self._join)

    def _join(self) -> GroupConsumer:
        if self._member is not None:  # a cancelled start that joined after all
            return self._member
        root, group, topics, options = self._arguments
        self._member = GroupConsumer(root, group, topics, **options)
        return self._member

    def __aiter__(self) -> AsyncGroupConsumer:
        return self

    async def __anext__(self) -> Record:
        if self._closed and self._next is None:
            raise StopAsyncIteration
        await self.start()
        if self._stream is None:
            self._stream = cast("MessageStream", iter(self.member))  # GroupConsumer.__iter__ gives its stream
        stream = self._stream
        while True:
            if self._next is None:
                if self._closed:
                    raise StopAsyncIteration
                self._next = self._thread.submit(stream.poll_nowait)
            got = await self._fetched(self._next)
            if got is None:
                raise StopAsyncIteration
            if not isinstance(got, CaughtUp):
                return got
            await self._waiter.wait(got)  # cancelled: the next __anext__ polls again

    def assignment(self) -> dict[str, list[int]]:
        """The partitions this member owns now, by topic (``GroupConsumer.assignment``)."""
        return self.member.assignment()

    async def commit(self, *args: Any, **kwargs: Any) -> None:
        """``GroupConsumer.commit`` with the same arguments, after the calls before it."""
        await self._thread.run(self.member.commit, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """A public method of the sync member as a coroutine run on the member's thread
        (any other public attribute of it as it is)."""
        member = self.__dict__.get("_member")
        if name.startswith("_") or member is None or not hasattr(member, name):
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r} (a GroupConsumer one, after start())")
        method = getattr(member, name)
        if not callable(method):
            return method

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._thread.run(method, *args, **kwargs)

        return call

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.start()
        return self

    async def _close(self) -> None:
        self._waiter.close()  # before the member closes the watch
        if self._member is not None:
            self._member.stop()  # thread-safe: a poll under way returns at once
            await _settled(self._next)
            await self._thread.run(self._member.close)
