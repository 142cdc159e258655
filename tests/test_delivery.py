"""Delivery reports: ``on_delivery=fn`` called fn(error, appended) as confluent-kafka does;
the older ``callback=fn``, fn(appended, error), still works and warns."""

from __future__ import annotations

import re
import warnings

import pytest

import kl


@pytest.mark.parametrize("linger_ms", [None, 5])
def test_on_delivery_gets_no_error_then_where_the_message_landed(root, topic, linger_ms):
    told = []
    with kl.Producer(root, linger_ms=linger_ms) as producer:
        producer.send(topic, b"a", on_delivery=lambda err, appended: told.append((err, appended)))
        producer.send(topic, b"bb", key=b"k", on_delivery=lambda err, appended: told.append((err, appended)))
    assert [err for err, _ in told] == [None, None]
    assert [appended.offset for _, appended in told] == [0, told[0][1].next_offset]


@pytest.mark.parametrize("linger_ms", [None, 5])
def test_on_delivery_gets_the_error_first(root, linger_ms):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=64))
    told = []
    with kl.Producer(root, linger_ms=linger_ms) as producer:
        with pytest.raises(kl.MessageTooLarge):
            producer.send("small", b"x" * 100, on_delivery=lambda err, appended: told.append((err, appended)))
    if linger_ms is None:  # sync mode tells and raises; async mode raises before queueing
        assert [(type(err), appended) for err, appended in told] == [(kl.MessageTooLarge, None)]


def test_callback_still_works_and_warns_once_per_call_site(root, topic):
    told = []
    with kl.Producer(root) as producer, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for value in (b"a", b"b"):
            producer.send(topic, value, callback=lambda appended, err: told.append((appended.offset, err)))
    assert [(w.category, w.filename, str(w.message)) for w in caught] == [
        (DeprecationWarning, __file__, "send(callback=fn) is deprecated: pass on_delivery=fn, called fn(error, appended)")
    ]
    assert [err for _, err in told] == [None, None]
    with kl.Producer(root, linger_ms=5) as producer, pytest.warns(DeprecationWarning, match="pass on_delivery=fn"):
        producer.send(topic, b"c", callback=lambda appended, err: told.append((appended.offset, err)))
    assert len(told) == 3


def test_on_delivery_and_callback_together_are_refused(root, topic):
    with kl.Producer(root) as producer:
        both = "send() takes on_delivery= or callback=, not both: pass on_delivery= alone"
        with pytest.raises(TypeError, match=re.escape(both)):
            producer.send(topic, b"a", callback=lambda a, e: None, on_delivery=lambda e, a: None)
    assert kl.Consumer(root).latest_offset(topic, 0) == 0
