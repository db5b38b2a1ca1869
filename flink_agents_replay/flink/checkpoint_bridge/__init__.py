"""Checkpoint bridge: checkpoint callbacks for a Python ``KeyedProcessFunction`` in PyFlink.

Why it exists
-------------
PyFlink 2.3 gives Python functions ``open``/``close``/``process_element``/``on_timer`` and nothing else:
no ``snapshotState``, no ``notifyCheckpointComplete``, no operator (union list) state. A function that
must know what is durable (to release side effects only after a checkpoint completed, or to carry
its own bookkeeping across a restore or a rescale) cannot be written in Python alone. The bridge is a
small Java operator, ``io.github.flinkagentsreplay.bridge.CheckpointBridgeOperator`` (source under
``java/``), that subclasses PyFlink's thread-mode keyed process operator
(``EmbeddedPythonKeyedProcessOperator``) and forwards Flink's checkpoint callbacks to the Python
function living in the operator's embedded interpreter.

Usage::

    from flink_agents_replay.flink.checkpoint_bridge import CheckpointHooks, process_with_checkpoint_hooks

    class MyFunction(CheckpointHooks, KeyedProcessFunction):
        def restored_checkpoint(self, checkpoint_id): ...  # the restored checkpoint's id (not on a fresh start)
        def initialize_state(self, values): ...        # once, after open(), before the first element
        def snapshot_state(self, checkpoint_id, timestamp_ms): ...  # bytes for the union list state, or None
        def notify_checkpoint_complete(self, checkpoint_id): ...
        def notify_checkpoint_aborted(self, checkpoint_id): ...
        def process_element(self, value, ctx): ...

    stream = process_with_checkpoint_hooks(keyed_stream, MyFunction(), Types.STRING()).uid("my-operator")

Every hook is optional (a missing method is not called; :class:`CheckpointHooks` documents them with
no-op defaults). Hooks run on the task thread, never concurrently with elements or timers. An exception
raised by a hook fails the task, so Flink restarts the job by its restart strategy; the failure carries
the Python message and traceback.

What the operator does
----------------------
- ``initializeState``: registers a union ``ListState<byte[]>``; on restore it holds the entries of
  *all* subtasks of the snapshot, whatever the old and new parallelism (this is what makes rescaling
  work: each subtask keeps what its key groups need).
- ``open``: ``super.open()`` creates the interpreter, the global ``operation`` and runs the function's
  ``open()``; the bridge then finds the Python function object (the closure variable
  ``user_defined_func`` of ``operation._operations[0]._open_func``), exposes a small bridge object to
  Java, calls ``restored_checkpoint(checkpoint_id)`` when the attempt restored a checkpoint or savepoint, then
  ``initialize_state(values)`` (``[]`` on a fresh start).
- ``snapshotState``: ``snapshot_state(checkpoint_id, timestamp_ms)`` (``timestamp_ms``: when the JobManager
  triggered the checkpoint); the bytes become this subtask's single entry.
- ``notifyCheckpointComplete`` / ``notifyCheckpointAborted``: forwarded.
- ``copy``: PyFlink's optimizer fuses a following Python operator of equal parallelism into this one by
  calling ``copy()``; the override keeps the bridge (without it, it would silently disappear).
- completion wake-ups: after ``initialize_state``, ``attach_wakeups(wakeups)`` (optional) receives the Java
  half of :class:`~flink_agents_replay.flink.checkpoint_bridge.wakeups.CompletionWakeups`; a token woken from any
  thread fires ``on_timer`` for the key it was remembered under, from the task's mailbox.
- task stop: then ``attach_task_stop(signal)`` (optional) receives the Java half of
  :class:`~flink_agents_replay.flink.checkpoint_bridge.task_stop.TaskStop`: a thread reads the task's execution
  state (a private field of the runtime environment: CANCELING or FAILED) and the StreamTask's ``canceled`` and
  ``failing`` flags every 5 ms and writes one byte to a pipe once one says so, so the function's
  worker threads learn that the task is being cancelled or failed before its ``close()`` comes.

Observed call order (PyFlink 2.3.0, MiniCluster)
------------------------------------------------
``open()`` -> ``initialize_state(values)`` -> elements/timers, interleaved with ``snapshot_state(n)``
and ``notify_checkpoint_complete(n)`` (or ``notify_checkpoint_aborted(n)``; Flink may skip
notifications, a later completion covers earlier ones). Restore: the same from the top, with the
values of the restored checkpoint. Cancelling a job notifies in-flight checkpoints as aborted.

End of a bounded input (also ``stop-with-savepoint --drain``): PyFlink itself calls the Python
``close()`` at end of input, but Flink takes the final checkpoint *after* that. The bridge therefore
defers the Python ``close()`` to the operator's ``close()``: the final ``snapshot_state`` (which sees
every element) and its ``notify_checkpoint_complete`` reach the live function, and ``close()`` is
always the function's last call. Nothing is forwarded after ``close()``. Stop-with-savepoint without
drain and cancellation never call the Python ``close()`` (as in plain PyFlink).

Process mode
------------
The bridge always runs the function embedded, also when the job is configured with
``python.execution-mode: process``: the operator sets the mode to ``thread`` in its own configuration
before starting the interpreter (PyFlink's embedded environment manager refuses any other value), and
the rest of the job keeps running in process mode. Verified on the MiniCluster: the hooked function
runs in the TaskManager JVM process while the job's other Python operators run in the Beam worker.
A hooked operator's keyed state therefore stays where it is whatever mode the job uses (switching the
mode across a savepoint would otherwise lose it).

How the jar gets to Flink
-------------------------
:func:`bridge_jar` compiles the Java sources with ``javac --release 11`` against the installed
PyFlink's ``lib/flink-dist-*.jar`` and ``opt/flink-python-*.jar`` into
``<home>/bridge/<digest>/`` (``$FLINK_AGENTS_REPLAY_HOME``, outside the repository; the digest covers
the sources and the PyFlink version); a JDK is needed on first use. :func:`process_with_checkpoint_hooks`
adds the jar to py4j's context class loader (to instantiate the operator in the client) and appends
it to the environment's ``pipeline.jars`` (jars configured earlier stay), so it ships with the job.
Setting ``pipeline.jars`` again *after* wiring would drop it.

Limits
------
It relies on PyFlink internals: the protected ``interpreter`` field, the ``operation`` global, the
closure variable name ``user_defined_func``, the package-private input type of the base operator, the
``copy()`` contract of the fusion optimizer and the embedded-mode check. The package pins
``apache-flink==2.3.0``; ``tests/integration/test_checkpoint_bridge.py`` is the smoke test that must
stay green before any upgrade. Only keyed process functions are bridged (the operator is the head of
its fused chain, so the hooked function is always ``operation._operations[0]``). Values are opaque
bytes: their format, and which entries a subtask keeps after a rescale, are the function's business.
"""

from flink_agents_replay.flink.checkpoint_bridge.build import bridge_jar
from flink_agents_replay.flink.checkpoint_bridge.wiring import CheckpointHooks, process_with_checkpoint_hooks

__all__ = ["CheckpointHooks", "bridge_jar", "process_with_checkpoint_hooks"]
