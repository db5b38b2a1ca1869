"""Records that carry their upstream's W3C ``traceparent`` to the agent's operator, unseen by the user's functions.

The packaged Kafka input (``records_from_kafka``) sends a record on as a
:func:`~flink_agents_replay.core.events.traced_input` (a tagged tuple) only when its Kafka record had a
``traceparent`` header. The stream it returns, a :class:`TracedRecords`, shows every function of the user the
record itself:

* ``key_by(selector)`` runs the selector on the record (the elements stay wrapped), and the keyed stream it returns
  (:class:`TracedKeyedRecords`) hands :func:`~flink_agents_replay.flink.pipeline.connect_to_agent` the wrapped
  records (:func:`traced_keyed_stream`): the agent's operator takes the traceparent off, into the run's state and its
  trace's link, and gives the agent the record;
* every other method that takes a function or sends the records on (``map``, ``filter``, ``process``, sinks,
  ``union``...) works on the stream of the records themselves: a map after the parse (chained to it, uid
  ``untraced-<uid>``), made once, when first asked for. On the keyed stream likewise: the records themselves keyed
  by the same selector.

So a header appearing upstream changes nothing a job's own functions see.
"""

from __future__ import annotations

from typing import Any

from pyflink.common import Types
from pyflink.datastream import DataStream, KeyedStream, KeySelector

from flink_agents_replay.core.events import untraced

__all__ = ["TracedKeyedRecords", "TracedRecords", "traced_keyed_stream"]

#: What a DataStream does with its elements (the rest configures its operator, or asks about it).
_ON_RECORDS = ("add_sink", "assign_timestamps_and_watermarks", "broadcast", "cache", "connect", "execute_and_collect",
               "filter", "flat_map", "forward", "map", "partition_custom", "print", "process", "project", "rebalance",
               "rescale", "shuffle", "sink_to", "union", "window_all")
_ON_KEYED_RECORDS = (*_ON_RECORDS, "count_window", "key_by", "max", "max_by", "min", "min_by", "reduce", "sum",
                     "window")


class _UntracedKey(KeySelector):
    """The user's key selector (a function or a ``KeySelector``), given the record itself."""

    def __init__(self, selector):
        self.selector = selector

    def open(self, runtime_context) -> None:
        if isinstance(self.selector, KeySelector):
            self.selector.open(runtime_context)

    def close(self) -> None:
        if isinstance(self.selector, KeySelector):
            self.selector.close()

    def get_key(self, value):
        value = untraced(value)
        return self.selector.get_key(value) if isinstance(self.selector, KeySelector) else self.selector(value)


class TracedRecords(DataStream):
    """The parsed records of a Kafka input, some as a ``traced_input`` (see the module's docstring). Methods that
    configure the stream (``uid``, ``name``, ``set_parallelism``...) configure the parse operator."""

    def __init__(self, stream: DataStream, uid: str):
        super().__init__(stream._j_data_stream)
        self._uid = uid
        self._untraced: DataStream | None = None

    def untraced(self) -> DataStream:
        """The records themselves (a chained map after the parse, made once)."""
        if self._untraced is None:
            parallelism = self._j_data_stream.getParallelism()
            self._untraced = (DataStream(self._j_data_stream).map(untraced, output_type=Types.PICKLED_BYTE_ARRAY())
                              .name(f"untraced {self._uid}").uid(f"untraced-{self._uid}")
                              .set_parallelism(parallelism))
        return self._untraced

    def key_by(self, key_selector, key_type=None) -> TracedKeyedRecords:
        """Keyed by ``key_selector``, which sees the record itself; the agent's operator gets the traceparent."""
        keyed = DataStream(self._j_data_stream).key_by(_UntracedKey(key_selector), key_type)
        return TracedKeyedRecords(keyed, self, key_selector, key_type)


class TracedKeyedRecords(KeyedStream):
    """A :class:`TracedRecords` keyed: :func:`~flink_agents_replay.flink.pipeline.connect_to_agent` takes the
    wrapped records; every other method works on the records themselves, keyed alike."""

    def __init__(self, keyed: KeyedStream, origin: TracedRecords, key_selector, key_type):
        super().__init__(keyed._j_data_stream, keyed._original_data_type_info, keyed._origin_stream)
        self._origin = origin
        self._key = (key_selector, key_type)
        self._untraced: KeyedStream | None = None

    def untraced(self) -> KeyedStream:
        """The records themselves, keyed by the same selector (made once)."""
        if self._untraced is None:
            self._untraced = self._origin.untraced().key_by(*self._key)
        return self._untraced

    def traced(self) -> KeyedStream:
        """The keyed stream as it is, traced inputs and all: for the agent's operator only."""
        return KeyedStream(self._j_data_stream, self._original_data_type_info, self._origin_stream)


def traced_keyed_stream(keyed_stream: KeyedStream) -> KeyedStream:
    """What the agent's operator reads: the wrapped records of a :class:`TracedKeyedRecords`, else the stream."""
    return keyed_stream.traced() if isinstance(keyed_stream, TracedKeyedRecords) else keyed_stream


def _plain(value: Any) -> Any:
    """An argument as the untraced stream's method takes it (another traced stream: its records themselves)."""
    return value.untraced() if isinstance(value, (TracedRecords, TracedKeyedRecords)) else value


def _on_records(name: str):
    def method(self, *args, **kwargs):
        return getattr(self.untraced(), name)(*map(_plain, args), **{k: _plain(v) for k, v in kwargs.items()})

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``{name}`` on the records themselves (see :mod:`flink_agents_replay.flink.traced_input`)."
    return method


for _name in _ON_RECORDS:
    setattr(TracedRecords, _name, _on_records(_name))
for _name in _ON_KEYED_RECORDS:
    setattr(TracedKeyedRecords, _name, _on_records(_name))
