"""Serializers on producers and deserializers on plain consumers (kl.serde): bytes as they
are by default, a TypeError at once naming the fix, None a tombstone whatever the codec."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from test_remote import serve

import kl
from kl import serde

STR_VALUE = "value must be bytes, not str: pass value_serializer= (kl.serde.string_serializer)"


def read(root: kl.Root, topic: str, **deserializers: object) -> list[kl.Message]:
    consumer = kl.Consumer(root, **deserializers)  # type: ignore[arg-type]
    return [msg for batch in consumer.consume(topic) for msg in batch.messages]  # type: ignore[misc]


@pytest.fixture
def address(root: kl.Root) -> Iterator[str]:
    yield from serve(root, allow_produce=True)


@pytest.mark.parametrize("linger_ms", [None, 5])
def test_a_str_value_without_a_serializer_raises_at_once_and_nothing_is_written(root, topic, linger_ms):
    with kl.Producer(root, linger_ms=linger_ms) as producer:
        with pytest.raises(TypeError, match=re.escape(STR_VALUE)):
            producer.send(topic, "a string")
        str_key = "key must be bytes, not str: pass key_serializer= (kl.serde.string_serializer)"
        with pytest.raises(TypeError, match=re.escape(str_key)):
            producer.send(topic, b"v", key="k")
        dict_value = "value must be bytes, not dict: pass value_serializer= (kl.serde.json_serializer, or a function of yours)"
        with pytest.raises(TypeError, match=re.escape(dict_value)):
            producer.send(topic, {"a": 1})
        producer.flush()
    assert read(root, topic) == []


def test_a_serializer_that_gives_no_bytes_is_named(root, topic):
    with kl.Producer(root, value_serializer=str) as producer:  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="^value_serializer returned str, not bytes$"):
            producer.send(topic, 1)


@pytest.mark.parametrize("linger_ms", [None, 5])
def test_json_round_trip_through_a_topic_and_a_tombstone_stays_none(root, topic, linger_ms):
    docs = [{"id": 1, "name": "ä"}, [1, 2], "text"]
    serializers = {"key_serializer": serde.string_serializer, "value_serializer": serde.json_serializer}
    with kl.Producer(root, linger_ms=linger_ms, **serializers) as p:  # type: ignore[arg-type]
        for doc in docs:
            p.send(topic, doc, key="k")
        p.send(topic, None, key="k")
        p.flush()  # send_batch appends at once, ahead of the queue
        p.send_batch(topic, [{"b": 2}, None], keys=["x", None])
    raw = read(root, topic)
    assert [msg.value for msg in raw] == [b'{"id":1,"name":"\xc3\xa4"}', b"[1,2]", b'"text"', None, b'{"b":2}', None]
    got = read(root, topic, key_deserializer=serde.string_deserializer, value_deserializer=serde.json_deserializer)
    assert [(msg.key, msg.value) for msg in got] == [("k", d) for d in docs] + [("k", None), ("x", {"b": 2}), (None, None)]


def test_values_only_and_stream_are_deserialized_and_fetch_stays_raw(root, topic):
    with kl.Producer(root, value_serializer=serde.string_serializer) as producer:
        producer.send(topic, "a")
        producer.send(topic, "b")
    consumer = kl.Consumer(root, value_deserializer=serde.string_deserializer)
    assert [v for batch in consumer.consume(topic, values_only=True) for v in batch.messages] == ["a", "b"]
    assert [msg.value for msg in consumer.stream(topic, 0, 0, idle_timeout=0)] == ["a", "b"]
    assert [msg.value for msg in consumer.fetch(topic, 0, 0)] == [b"a", b"b"]


def test_headers_as_a_list_of_tuples_are_read_back_and_not_serialized(root, topic):
    with kl.Producer(root, value_serializer=serde.json_serializer) as producer:
        producer.send(topic, {"a": 1}, headers=[("trace", b"t1"), ("empty", None)])
        producer.send_batch(topic, [1], headers=[[("n", b"1")]])
    got = read(root, topic, value_deserializer=serde.json_deserializer)
    assert [(msg.value, list(msg.headers)) for msg in got] == [
        ({"a": 1}, [("trace", b"t1"), ("empty", None)]),
        (1, [("n", b"1")]),
    ]


@pytest.mark.parametrize("headers", [[("k", "text")], [(b"k", b"v")], [("k",)]])
def test_bad_headers_raise_one_line(root, topic, headers):
    with kl.Producer(root) as producer, pytest.raises(kl.InvalidHeaders) as raised:
        producer.send(topic, b"v", headers=headers)
    assert "\n" not in str(raised.value)
    assert read(root, topic) == []


def test_a_remote_producer_and_consumer_serialize(root, topic, address):
    with kl.RemoteProducer(address, value_serializer=serde.json_serializer) as producer:
        producer.send(topic, {"x": [1]})
        producer.send(topic, None)
        with pytest.raises(TypeError, match=re.escape("value_serializer returned")):
            kl.RemoteProducer(address, value_serializer=str).send(topic, 1)  # type: ignore[arg-type]
    with kl.RemoteConsumer(address, value_deserializer=serde.json_deserializer) as consumer:
        assert [msg.value for batch in consumer.consume(topic) for msg in batch.messages] == [{"x": [1]}, None]  # type: ignore[union-attr]
