"""Python side of the checkpoint bridge: put a hooked keyed process operator into a PyFlink job.

:func:`process_with_checkpoint_hooks` is ``keyed_stream.process(func, output_type)`` with the Java
operator swapped for the bridge's subclass of PyFlink's thread-mode keyed process operator. Everything
else (function serialisation, types, configuration) is what PyFlink itself builds, taken from PyFlink's
own ``_get_one_input_stream_operator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyflink.common.typeinfo import TypeInformation
from pyflink.datastream import DataStream, KeyedProcessFunction, KeyedStream

from flink_agents_replay.flink.checkpoint_bridge.build import bridge_jar

__all__ = [
    "BRIDGE_OPERATOR_CLASS",
    "DEFAULT_OPERATOR_NAME",
    "CheckpointHooks",
    "process_with_checkpoint_hooks",
    "ship_bridge_jar",
]

BRIDGE_OPERATOR_CLASS = "io.github.flinkagentsreplay.bridge.CheckpointBridgeOperator"
DEFAULT_OPERATOR_NAME = "KEYED PROCESS (checkpoint hooks)"


class CheckpointHooks:
    """The checkpoint hooks (and the wake-up hook) a bridged ``KeyedProcessFunction`` may define, as no-op defaults.

    Mix it in (``class MyFn(CheckpointHooks, KeyedProcessFunction)``) for the signatures and
    documentation; a function that simply defines some of the methods works the same, and a missing
    method is never called. All hooks run on the Flink task thread, never concurrently with
    ``process_element``/``on_timer``; an exception raised by any of them fails the task (Flink then
    restarts it according to the job's restart strategy) with the Python message in the failure.
    """

    def restored_checkpoint(self, checkpoint_id: int) -> None:
        """Called once, before ``initialize_state``, when this attempt restored a checkpoint or a savepoint:
        its checkpoint id. Flink numbers the job's next checkpoints from ``checkpoint_id + 1``."""

    def initialize_state(self, values: list[bytes]) -> None:
        """Called exactly once per subtask attempt, after ``open()`` and before the first element or timer.

        ``values`` holds every entry of the operator's union list state in the snapshot the job
        restored from: the bytes ``snapshot_state`` returned in *each* subtask of that snapshot, in no
        particular order, whatever the parallelism then and now. It is empty on a fresh start. Keep
        what belongs to this subtask's key groups.
        """

    def snapshot_state(self, checkpoint_id: int, timestamp_ms: int) -> bytes | None:
        """Called at each checkpoint (synchronously, before the barrier moves on); the returned bytes
        become this subtask's single entry in the union list state. ``None`` stores no entry.

        ``timestamp_ms`` is when the JobManager triggered the checkpoint (epoch milliseconds, its clock): the
        same in every subtask, and later for every later checkpoint of the job, also across job lineages."""
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` (whose ``snapshot_state`` this subtask answered) is durable.

        Flink may skip notifications (a later one implies the earlier checkpoints completed)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was abandoned; its snapshot will never be restored."""

    def attach_wakeups(self, wakeups: Any) -> None:
        """Called once, right after ``initialize_state``, with the Java half of completion wake-ups.

        Wrap it in :class:`~flink_agents_replay.flink.checkpoint_bridge.wakeups.CompletionWakeups`: a token
        remembered on the task thread and woken from any thread later fires ``on_timer`` for the key it was
        remembered under, at the current processing time (``ctx.time_domain()`` is processing time) with no
        timer registered. Work finishing on other threads then needs no polling timer per key.
        """

    def attach_task_stop(self, signal: Any) -> None:
        """Called once, right after ``attach_wakeups``, with the Java half of the task-stop signal.

        Wrap it in :class:`~flink_agents_replay.flink.checkpoint_bridge.task_stop.TaskStop`: from the moment Flink
        cancels or fails the task (its execution state, the StreamTask's ``canceled`` or ``failing`` flag, read every
        5 ms), its
        ``stopping()`` says yes on any thread, well before ``close()`` reaches the function.
        """


def ship_bridge_jar(j_env) -> str:
    """Make the bridge jar loadable here (py4j's class loader) and ship it with the job of ``j_env``.

    ``j_env`` is the Java ``StreamExecutionEnvironment``. The jar is appended to ``pipeline.jars``; jars
    configured there before are kept. Returns the jar's URL.
    """
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import add_jars_to_context_class_loader, get_j_env_configuration

    url = Path(bridge_jar()).as_uri()
    add_jars_to_context_class_loader([url])
    jvm = get_gateway().jvm
    option = jvm.org.apache.flink.configuration.PipelineOptions.JARS
    j_conf = get_j_env_configuration(j_env)
    current = j_conf.getOptional(option)
    jars = [str(jar) for jar in current.get()] if current.isPresent() else []
    if not any(_same_url(jar, url) for jar in jars):
        j_list = jvm.java.util.ArrayList()
        for jar in [*jars, url]:
            j_list.add(jar)
        j_conf.set(option, j_list)
    return url


def _same_url(a: str, b: str) -> bool:
    from urllib.parse import urlparse

    pa, pb = urlparse(a), urlparse(b)
    return (pa.scheme or "file") == (pb.scheme or "file") and Path(pa.path) == Path(pb.path)


def _bridge_operator_class():
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import load_java_class

    gateway = get_gateway()
    # Fails with a clear Java ClassNotFoundException if the jar is not on py4j's context class loader.
    load_java_class(BRIDGE_OPERATOR_CLASS)
    j_class = gateway.jvm
    for part in BRIDGE_OPERATOR_CLASS.split("."):
        j_class = getattr(j_class, part)
    return j_class


def process_with_checkpoint_hooks(
    keyed_stream: KeyedStream,
    func: KeyedProcessFunction,
    output_type: TypeInformation | None = None,
    name: str = DEFAULT_OPERATOR_NAME,
) -> DataStream:
    """``keyed_stream.process(func, output_type)`` whose function receives checkpoint callbacks.

    ``func`` may define any of the :class:`CheckpointHooks` methods. The operator always runs the
    function embedded (PyFlink's thread mode), also in a job configured with
    ``python.execution-mode: process``. The bridge jar is built if needed, added to this client's class
    loader and appended to the environment's ``pipeline.jars``; the caller does nothing else. The
    returned stream takes ``.uid()``, ``.name()``, ``.set_parallelism()``, ``.set_max_parallelism()``
    like any other.
    """
    if not isinstance(keyed_stream, KeyedStream):
        raise TypeError(f"process_with_checkpoint_hooks needs a KeyedStream, not {type(keyed_stream).__name__}")
    if not isinstance(func, KeyedProcessFunction):
        raise TypeError(f"process_with_checkpoint_hooks needs a KeyedProcessFunction, not {type(func).__name__}")

    from pyflink.datastream.data_stream import _get_one_input_stream_operator
    from pyflink.fn_execution import flink_fn_execution_pb2

    j_keyed = keyed_stream._j_data_stream
    ship_bridge_jar(j_keyed.getExecutionEnvironment())

    # PyFlink's own operator for keyed_stream.process(func, output_type): its configuration, serialised
    # function and types go into the bridge operator unchanged. (In process mode PyFlink builds its
    # external operator here; only its parts are used, the bridge always runs embedded.)
    j_standard, j_output_type_info = _get_one_input_stream_operator(
        keyed_stream,
        func,
        flink_fn_execution_pb2.UserDefinedDataStreamFunction.KEYED_PROCESS,  # type: ignore[attr-defined]
        output_type,
    )
    j_input_type_info = j_keyed.getTransformation().getOutputType()
    j_bridge = _bridge_operator_class()(
        j_standard.getConfiguration(),
        j_standard.getPythonFunctionInfo(),
        j_input_type_info,
        j_output_type_info,
    )
    return DataStream(j_keyed.transform(name, j_output_type_info, j_bridge))
