"""kl for asyncio: ``AsyncProducer``, ``AsyncConsumer`` and ``AsyncGroupConsumer``.

async with kl.aio.AsyncProducer(root) as producer:
    appended = await producer.send("events", b"hello")
async with kl.aio.AsyncConsumer(root, "events") as consumer:
    async for record in consumer:
        print(record.offset, record.value)

Each object wraps its sync twin (``kl.Producer``, ``kl.Consumer``, ``kl.GroupConsumer``;
``kl.RemoteProducer`` and ``kl.RemoteConsumer`` for a ``kl.net.remote.RemoteRoot``) and
runs every call of it on a thread of its own, one call after the other in the order they
were made: file locks, appends, fsyncs, reads and follow waits never block the event loop,
and one producer's sends append in call order.  Waiting for new messages happens on that
thread too (``kl.follow.Watch``: inotify, or polling on NFS and over the network), which
hands each message to the loop as it comes: one waiting thread rather than
``loop.add_reader`` on the inotify descriptor, so that the follow is the sync API's own
(recreated topics, added partitions, the NFS fallback) and a long fetch or fsync stalls no
other task.  Closing ends the wait within a poll interval.

Cancellation never tears or loses anything: a send, once called, is appended whole (or
fails) whether or not its caller still waits; a cancelled wait for the next message keeps
the message fetched meanwhile for the next one.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from kl.errors import InvalidConfig, ProducerClosed

if TYPE_CHECKING:
    from kl.consumer import Batch, Consumer, Start
    from kl.group import GroupConsumer, MessageStream, Record
    from kl.net.remote import RemoteRoot
    from kl.producer import Appended, Producer
    from kl.serde import Deserializer
    from kl.topic import Root

__all__ = ["AsyncConsumer", "AsyncGroupConsumer", "AsyncProducer"]

T = TypeVar("T")

POLL_SLICE = 0.2
"""Seconds a group member's thread waits for a message before it looks whether it is closed
(and lets a ``commit`` queued behind the wait run)."""


class _Thread:
    """The one thread an async object runs its sync twin's calls on, in call order."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    def submit(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """Start ``call`` after every call submitted before; its result on the running loop."""
        return asyncio.wrap_future(self._executor.submit(call, *args, **kwargs), loop=asyncio.get_running_loop())

    async def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call``'s result; a cancelled caller stops waiting, the call still runs to its end."""
        return await asyncio.shield(self.submit(call, *args, **kwargs))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)


def _remote(root: object) -> bool:
    from kl.net.remote import RemoteRoot

    return isinstance(root, RemoteRoot)


class AsyncProducer:
    """``kl.Producer`` (``kl.RemoteProducer`` for a ``RemoteRoot``) for asyncio; aiokafka's ``AIOKafkaProducer``.

    ``options`` are the sync producer's (``compression``, ``fsync``, ``partitioner``, ...),
    but not ``linger_ms``: every send is appended at once, in call order, on this
    producer's thread (send many and ``asyncio.gather`` them to keep the thread busy).

    ``send`` queues the append when it is called and returns an awaitable of its
    ``kl.Appended``: cancelling that await does not stop or undo the append (it is
    shielded), so a message whose send was called is in the log, whole and in its place,
    unless the send failed; ``await flush()`` waits for every send called before it (a
    cancelled caller learns where its message went by reading the log after that).
    """

    def __init__(self, root: Root | RemoteRoot | str | os.PathLike[str], **options: Any) -> None:
        if options.get("linger_ms") is not None:
            raise InvalidConfig("AsyncProducer appends every send at once: leave linger_ms unset and gather many sends")
        from kl.net.remote import RemoteProducer
        from kl.producer import Producer

        self.producer: Producer = RemoteProducer(root, **options) if _remote(root) else Producer(root, **options)  # type: ignore[arg-type]
        """The sync twin, used only from this producer's thread."""
        self._thread = _Thread("kl-aio-producer")
        self._closed = False

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
    ) -> asyncio.Future[Appended]:
        """Append one message (``kl.Producer.send``'s arguments, no callback): awaiting the
        result gives where it landed or raises the send's error.  Called only in a running
        loop; raises ``ProducerClosed`` after ``close``."""
        if self._closed:
            raise ProducerClosed("this AsyncProducer is closed: make a new one")
        sent = self._thread.submit(self.producer.send, topic, value, key, partition, timestamp, None, headers)
        return asyncio.shield(sent)  # type: ignore[arg-type]  # a sync producer's send gives Appended

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
    ) -> Appended:
        """``await send(...)``, under aiokafka's name."""
        return await self.send(topic, value, key, partition, timestamp, headers)

    async def flush(self) -> None:
        """Wait for every send called before, then fsync what they wrote (``kl.Producer.flush``)."""
        await self._thread.run(self.producer.flush)

    async def close(self) -> None:
        """Wait for the sends called before, flush and close the files; later sends raise ``ProducerClosed``."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._thread.run(self.producer.close)
        finally:
            self._thread.shutdown()

    stop = close
    """aiokafka's name for ``close``."""

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer:
    """``kl.Consumer.consume(follow=True)`` (``kl.RemoteConsumer``'s for a ``RemoteRoot``) as
    an async iterator of ``kl.Record``; aiokafka's ``AIOKafkaConsumer`` with partitions assigned
    and ``seek`` done (``start``).

    ``topic`` and ``partitions`` are ``consume``'s; ``options`` are its keyword arguments
    (``start``, ``until``, ``max_messages``, ``idle_timeout``, ``skip_corrupt``, ...; not
    ``values_only``: records carry their values); ``max_bytes`` and the deserializers are
    the sync consumer's.
    Iterating waits for new messages; it ends with ``consume`` (a bound, ``idle_timeout``)
    or ``close``.  ``start`` is resolved by the first ``__anext__`` ("latest": the end then).
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
        self._stopped = threading.Event()
        batches = self.consumer.consume(topic, partitions, start=start, follow=True, stopped=self._stopped, **options)
        self._batches = cast("Generator[Batch, None, None]", batches)
        self._thread = _Thread("kl-aio-consumer")
        self._next: asyncio.Future[Batch | None] | None = None
        """The fetch under way, kept across a cancelled ``__anext__``."""
        self._records: Iterator[Record] = iter(())
        self._closed = False

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Record:
        from kl.group import Record

        while (record := next(self._records, None)) is None:
            if self._next is None:
                if self._closed:
                    raise StopAsyncIteration
                self._next = self._thread.submit(next, self._batches, None)
            batch = await asyncio.shield(self._next)
            self._next = None
            if batch is None:
                raise StopAsyncIteration
            self._records = (Record(batch.topic, batch.partition, *message) for message in batch.messages)  # type: ignore[misc]
        return record

    async def close(self) -> None:
        """End the iteration (a wait under way ends within a poll interval) and close the files or connection."""
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        try:
            if self._next is not None:
                await asyncio.shield(self._next)
            await self._thread.run(self._finish)
        finally:
            self._thread.shutdown()

    def _finish(self) -> None:
        self._batches.close()
        close = getattr(self.consumer, "close", None)  # a RemoteConsumer's connection
        if close is not None:
            close()

    stop = close
    """aiokafka's name for ``close``."""

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncGroupConsumer:
    """``kl.GroupConsumer`` for asyncio: a member of ``group``; aiokafka's ``AIOKafkaConsumer``
    with a ``group_id`` (``async for``, ``commit``, ``assignment``, ``stop``).

    ``topics`` and ``options`` are ``GroupConsumer``'s (``pattern``, ``start``, ``auto_commit``,
    ``on_assign``, ...); it joins on its thread at ``start()`` (``async with`` or the first
    ``__anext__`` call it).  Any other public method of ``GroupConsumer`` is here as a
    coroutine taking the same arguments, run on the member's thread after the calls before
    it (``await member.commit(offsets)``, ``await member.seek(...)``, ``await member.pause(...)``
    where the sync member has them).  ``assignment()`` stays a plain call.  A cancelled
    ``__anext__`` loses nothing: the next one hands out the record it was waiting for.
    """

    def __init__(
        self, root: Root | str | os.PathLike[str], group: str, topics: list[str] | None = None, **options: Any
    ) -> None:
        self._arguments = (root, group, topics, options)
        self._thread = _Thread("kl-aio-group")
        self._member: GroupConsumer | None = None
        self._stream: MessageStream | None = None
        self._next: asyncio.Future[Record | None] | None = None
        """The poll under way, kept across a cancelled ``__anext__``."""
        self._closed = False

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
        from kl.group import GroupConsumer

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
                self._next = self._thread.submit(stream.poll, POLL_SLICE)
            record = await asyncio.shield(self._next)
            self._next = None
            if record is not None:
                return record

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

    async def close(self) -> None:
        """Leave the group (``GroupConsumer.close``: with auto-commit, commit what was consumed); iterating ends."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._member is not None:
                self._member.stop()  # thread-safe: the poll under way returns at once
                if self._next is not None:
                    await asyncio.shield(self._next)
                await self._thread.run(self._member.close)
        finally:
            self._thread.shutdown()

    stop = close
    """aiokafka's name for ``close``."""

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
