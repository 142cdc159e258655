"""kl.serde: the codecs, and the errors that name the argument and the fix."""

from __future__ import annotations

import pytest

from kl import serde


def test_bytes_pass_and_none_stays_none_whatever_the_codec():
    assert serde.serialize(None, memoryview(b"ab"), "value") == b"ab"
    assert serde.serialize(serde.json_serializer, None, "value") is None
    assert serde.deserialize(serde.json_deserializer, None) is None
    assert serde.deserialize(None, b"x") == b"x"


def test_codecs_round_trip():
    value = {"order": 1, "name": "café"}
    assert serde.deserialize(serde.json_deserializer, serde.serialize(serde.json_serializer, value, "value")) == value
    assert serde.serialize(serde.json_serializer, value, "value") == '{"order":1,"name":"café"}'.encode()
    assert serde.deserialize(serde.string_deserializer, serde.serialize(serde.string_serializer, "ü", "key")) == "ü"


def test_a_str_without_a_serializer_names_the_argument_and_the_fix():
    with pytest.raises(TypeError, match=r"^key must be bytes, not str: pass key_serializer= \(kl.serde.string_serializer\)$"):
        serde.serialize(None, "a", "key")
    with pytest.raises(TypeError, match=r"^value must be bytes, not dict: pass value_serializer= \(kl.serde.json_serializer"):
        serde.serialize(None, {}, "value")
    with pytest.raises(TypeError, match=r"^value_serializer returned str, not bytes$"):
        serde.serialize(str, 1, "value")
