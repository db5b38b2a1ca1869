/*
 * Checkpoint bridge of flink-agents-replay: gives a Python KeyedProcessFunction running in PyFlink's
 * thread (embedded) mode the checkpoint callbacks PyFlink does not offer.
 *
 * This class relies on PyFlink internals (apache-flink 2.3.0): the protected `interpreter` of the
 * embedded operators, the global `operation` that openPythonInterpreter() creates in it, and the
 * closure variable `user_defined_func` of the head operation's `_open_func`. The Python package's
 * bridge smoke test fails loudly when an upgrade changes any of them.
 */
package io.github.flinkagentsreplay.bridge;

import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.python.PythonOptions;
import org.apache.flink.runtime.execution.SuppressRestartsException;
import org.apache.flink.runtime.state.VoidNamespace;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.runtime.event.WatermarkEvent;
import org.apache.flink.streaming.api.functions.python.DataStreamPythonFunctionInfo;
import org.apache.flink.streaming.api.operators.InternalTimer;
import org.apache.flink.streaming.api.operators.Output;
import org.apache.flink.streaming.api.operators.TimerHeapInternalTimer;
import org.apache.flink.streaming.api.operators.TimestampedCollector;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.LatencyMarker;
import org.apache.flink.streaming.runtime.streamrecord.RecordAttributes;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.streaming.runtime.tasks.StreamTask;
import org.apache.flink.runtime.taskmanager.Task;
import org.apache.flink.streaming.runtime.watermarkstatus.WatermarkStatus;
import org.apache.flink.util.OutputTag;
import org.apache.flink.streaming.api.operators.python.embedded.AbstractEmbeddedDataStreamPythonFunctionOperator;
import org.apache.flink.streaming.api.operators.python.embedded.EmbeddedPythonKeyedProcessOperator;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.function.BooleanSupplier;

/**
 * PyFlink's thread-mode keyed process operator plus four checkpoint hooks for the Python function, and completion
 * wake-ups ({@link CompletionWakeups}: work ending on another thread fires the function's {@code on_timer} for its
 * key, from the mailbox, with no timer registered).
 *
 * <p>The Python function may define {@code restored_checkpoint(checkpoint_id)} (called before
 * {@code initialize_state} when the attempt restored a checkpoint or savepoint), {@code initialize_state(values)},
 * {@code snapshot_state(checkpoint_id, timestamp_ms)} (the checkpoint's trigger time, JobManager clock),
 * {@code notify_checkpoint_complete(checkpoint_id)} and {@code notify_checkpoint_aborted(checkpoint_id)}.
 * The bytes {@code snapshot_state} returns are this subtask's single entry in a union list state; on
 * restore every subtask receives every entry of the snapshot (all old subtasks), so rescaling works.
 *
 * <p>All hooks run on the task thread. An exception raised by a hook fails the task with the Python
 * message and traceback. Hooks reach the Python function from the end of {@link #open()} (where
 * {@code initialize_state} runs, after the function's own {@code open()}) until {@link #close()}. At the end
 * of a bounded input PyFlink would run the function's {@code close()} before Flink's final checkpoint; this
 * operator defers it to {@link #close()}, so the final snapshot sees a live function and {@code close()}
 * is always the last call. The operator always runs embedded, whatever {@code python.execution-mode} says.
 */
public class CheckpointBridgeOperator<K, IN, OUT> extends EmbeddedPythonKeyedProcessOperator<K, IN, OUT> {

    private static final long serialVersionUID = 1L;

    /**
     * In the message of a Python error that restarting cannot cure (the same input fails the same way): such a
     * failure ends the job instead of looping through the restart strategy. Keep equal to
     * flink_agents_replay.core.errors.NO_RESTART_MARKER.
     */
    static final String NO_RESTART_MARKER = "[flink-agents-replay: not restarted]";

    /** Name of the union list state; part of the savepoint format, never change it. */
    public static final String STATE_NAME = "flink-agents-replay.checkpoint-bridge";

    private static final String BRIDGE = "_flink_agents_replay_checkpoint_bridge";

    /** Python exec'd once the interpreter holds {@code operation}; defines the bridge object Java calls. */
    private static final String BRIDGE_PYTHON = String.join("\n",
            "def _flink_agents_replay_make_checkpoint_bridge(operation):",
            "    import struct",
            "    import traceback",
            "    head = operation._operations[0]",
            "    open_func = getattr(head, '_open_func', None)",
            "    code = getattr(open_func, '__code__', None)",
            "    if code is None or 'user_defined_func' not in code.co_freevars:",
            "        raise RuntimeError('checkpoint bridge: the Python function is not reachable (PyFlink internals'",
            "                           ' changed: no user_defined_func in operation._operations[0]._open_func);'",
            "                           ' the bridge supports apache-flink 2.3.0')",
            "    func = open_func.__closure__[code.co_freevars.index('user_defined_func')].cell_contents",
            "",
            "    def hook(name):",
            "        method = getattr(func, name, None)",
            "        return method if callable(method) else None",
            "",
            "    def call(method, *args):",
            "        try:",
            "            return method(*args)",
            "        except Exception as error:",
            "            # pemja reports only type and message; keep the Python traceback in the task failure.",
            "            details = ''.join(traceback.format_exception(type(error), error, error.__traceback__))",
            "            raise RuntimeError('%s: %s\\n%s' % (type(error).__name__, error, details)) from None",
            "",
            "    class CheckpointBridge:",
            "        function_type = type(func).__qualname__",
            "        _restored = hook('restored_checkpoint')",
            "        _initialize = hook('initialize_state')",
            "        _snapshot = hook('snapshot_state')",
            "        _complete = hook('notify_checkpoint_complete')",
            "        _aborted = hook('notify_checkpoint_aborted')",
            "        _attach_wakeups = hook('attach_wakeups')",
            "        _attach_task_stop = hook('attach_task_stop')",
            "",
            "        def restored(self, checkpoint_id):",
            "            if self._restored is not None:",
            "                call(self._restored, int(checkpoint_id))",
            "",
            "        def initialize(self, packed):",
            "            data = bytes(packed) if packed is not None else b''",
            "            values, offset = [], 0",
            "            while offset < len(data):",
            "                (size,) = struct.unpack_from('>i', data, offset)",
            "                offset += 4",
            "                values.append(data[offset:offset + size])",
            "                offset += size",
            "            if self._initialize is not None:",
            "                call(self._initialize, values)",
            "",
            "        def snapshot(self, checkpoint_id, timestamp_ms):",
            "            if self._snapshot is None:",
            "                return None",
            "            value = call(self._snapshot, int(checkpoint_id), int(timestamp_ms))",
            "            if value is None:",
            "                return None",
            "            if not isinstance(value, (bytes, bytearray, memoryview)):",
            "                raise TypeError('%s.snapshot_state must return bytes or None, not %s'",
            "                                % (self.function_type, type(value).__name__))",
            "            return bytes(value)",
            "",
            "        def complete(self, checkpoint_id):",
            "            if self._complete is not None:",
            "                call(self._complete, int(checkpoint_id))",
            "",
            "        def aborted(self, checkpoint_id):",
            "            if self._aborted is not None:",
            "                call(self._aborted, int(checkpoint_id))",
            "",
            "        def attach_wakeups(self, wakeups):",
            "            if self._attach_wakeups is None:",
            "                return False",
            "            call(self._attach_wakeups, wakeups)",
            "            return True",
            "",
            "        def attach_task_stop(self, signal):",
            "            if self._attach_task_stop is None:",
            "                return False",
            "            call(self._attach_task_stop, signal)",
            "            return True",
            "",
            "    return CheckpointBridge()",
            "",
            BRIDGE + " = _flink_agents_replay_make_checkpoint_bridge(operation)",
            "del _flink_agents_replay_make_checkpoint_bridge",
            "");

    /** The base class keeps its input type package-private; copy() needs it. */
    private final TypeInformation<IN> bridgeInputTypeInfo;

    private transient ListState<byte[]> unionState;
    private transient List<byte[]> restoredValues;
    /** The id of the checkpoint this attempt restored (-1: a fresh start). */
    private transient long restoredCheckpointId;
    /** True while the Python function may receive hooks: from the end of open() to close(). */
    private transient boolean pythonLive;
    /** What snapshot_state returned last (null: no entry). */
    private transient byte[] lastSnapshot;
    /** Brings the task thread back to a key whose run can be applied (see {@link CompletionWakeups}). */
    private transient CompletionWakeups<K> wakeups;
    /** Tells the Python runs that the task is being cancelled or failed (see {@link TaskStopSignal}). */
    private transient TaskStopSignal taskStop;

    /** How often {@link TaskStopSignal} reads the task's cancelled and failing flags. */
    static final long TASK_STOP_INTERVAL_MS = 5;

    public CheckpointBridgeOperator(
            org.apache.flink.configuration.Configuration config,
            DataStreamPythonFunctionInfo pythonFunctionInfo,
            TypeInformation<IN> inputTypeInfo,
            TypeInformation<OUT> outputTypeInfo) {
        super(config, pythonFunctionInfo, inputTypeInfo, outputTypeInfo);
        this.bridgeInputTypeInfo = inputTypeInfo;
    }

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        unionState = context.getOperatorStateStore().getUnionListState(
                new ListStateDescriptor<>(STATE_NAME, PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
        List<byte[]> values = new ArrayList<>();
        restoredCheckpointId = -1; // set here: a transient field's initializer does not run on deserialization
        if (context.isRestored()) {
            restoredCheckpointId = context.getRestoredCheckpointId().orElse(-1);
            for (byte[] value : unionState.get()) {
                values.add(value);
            }
        }
        restoredValues = values;
    }

    @Override
    public void open() throws Exception {
        // The embedded interpreter refuses to start unless the configured mode is "thread". This operator
        // always runs embedded, whatever python.execution-mode the rest of the job uses.
        config.set(PythonOptions.PYTHON_EXECUTION_MODE, "thread");
        super.open();
        collector = new TimestampedCollector<>(new DrainTimestampEraser<>(output));
        try {
            interpreter.exec(BRIDGE_PYTHON);
        } catch (Exception e) {
            throw new IllegalStateException("checkpoint bridge: could not attach to the Python function: "
                    + e.getMessage(), e);
        }
        pythonLive = true;
        List<byte[]> values = restoredValues == null ? Collections.<byte[]>emptyList() : restoredValues;
        restoredValues = null;
        if (restoredCheckpointId >= 0) {
            callPython("restored", "restored_checkpoint(" + restoredCheckpointId + ")", restoredCheckpointId);
        }
        callPython("initialize", "initialize_state(<" + values.size() + " values>)", pack(values));
        attachWakeups();
        attachTaskStop();
    }

    /**
     * Offers the Python function the task-stop signal ({@code attach_task_stop(signal)}, optional): from the moment
     * Flink cancels or fails the task, its worker threads can tell, without calling into Java, and start nothing new.
     */
    private void attachTaskStop() throws CheckpointHookException {
        StreamTask<?, ?> task = getContainingTask();  // its flags are volatile: read from the signal's thread
        Task runtimeTask = runtimeTask(task);
        BooleanSupplier stopping = runtimeTask == null
                ? () -> task.isCanceled() || task.isFailing()
                : () -> runtimeTask.isCanceledOrFailed() || task.isCanceled() || task.isFailing();
        taskStop = new TaskStopSignal(stopping, TASK_STOP_INTERVAL_MS, runtimeTask != null,
                "flink-agents-replay task stop " + getOperatorName());
        callPython("attach_task_stop", "attach_task_stop()", taskStop);
    }

    /**
     * The TaskManager's {@link Task} running this operator, or null. Its execution state turns CANCELING or FAILED
     * the moment Flink cancels or fails it from outside, before the canceler thread it then starts sets the
     * StreamTask's {@code canceled} flag. Nothing public leads there; the runtime environment keeps it in a private
     * field (Flink 2.3), read once here. Without it the StreamTask's flags alone tell.
     */
    private static Task runtimeTask(StreamTask<?, ?> task) {
        Object environment = task.getEnvironment();
        try {
            java.lang.reflect.Field field = environment.getClass().getDeclaredField("containingTask");
            field.setAccessible(true);
            Object value = field.get(environment);
            return value instanceof Task ? (Task) value : null;
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    /**
     * Offers the Python function completion wake-ups ({@code attach_wakeups(wakeups)}, optional): a wake-up fires
     * the function's {@code on_timer} for the key at the current processing time, as a processing-time timer
     * would, but without one registered, so no key has to poll for the end of its run.
     */
    @SuppressWarnings("unchecked")
    private void attachWakeups() throws CheckpointHookException {
        wakeups = new CompletionWakeups<>(
                getContainingTask().getMailboxExecutorFactory().createExecutor(getOperatorConfig().getChainIndex()),
                () -> (K) getCurrentKey(), this::wake, "flink-agents-replay wake-ups " + getOperatorName());
        callPython("attach_wakeups", "attach_wakeups()", wakeups);
    }

    /** A wake-up's mail (task thread): the function's processing-time callback for {@code key}, now. */
    private void wake(K key) throws Exception {
        if (!pythonLive) {
            return;
        }
        setCurrentKey(key);
        long now = getProcessingTimeService().getCurrentProcessingTime();
        onProcessingTime(new TimerHeapInternalTimer<>(now, key, VoidNamespace.INSTANCE));
    }

    /**
     * The base class runs the Python function's close() here, but the final checkpoint (snapshotState and
     * notifyCheckpointComplete) only comes after the end of input. The Python close() is therefore deferred
     * to {@link #close()}, so the function stays live for the final snapshot and close() is its last call.
     */
    @Override
    public void endInput() {
        // Deferred: see close().
    }

    @Override
    public void snapshotState(StateSnapshotContext context) throws Exception {
        super.snapshotState(context);
        long checkpointId = context.getCheckpointId();
        long timestamp = context.getCheckpointTimestamp(); // the JobManager's clock when it triggered the checkpoint
        if (pythonLive) {
            Object value = callPython("snapshot", "snapshot_state(" + checkpointId + ", " + timestamp + ")",
                    checkpointId, timestamp);
            if (value != null && !(value instanceof byte[])) {
                throw new IllegalStateException("checkpoint bridge: snapshot_state(" + checkpointId
                        + ") returned a " + value.getClass().getName() + " to Java, expected bytes");
            }
            lastSnapshot = (byte[]) value;
        }
        // Not live: not reachable in Flink 2.3 (no snapshot before open() or after close()); the last value
        // stands. Never leave the restored union values in place: each would be stored once per subtask.
        if (lastSnapshot == null) {
            unionState.clear();
        } else {
            unionState.update(Collections.singletonList(lastSnapshot));
        }
    }

    @Override
    public void notifyCheckpointComplete(long checkpointId) throws Exception {
        super.notifyCheckpointComplete(checkpointId);
        if (pythonLive) {
            callPython("complete", "notify_checkpoint_complete(" + checkpointId + ")", checkpointId);
        }
    }

    @Override
    public void notifyCheckpointAborted(long checkpointId) throws Exception {
        super.notifyCheckpointAborted(checkpointId);
        if (pythonLive) {
            callPython("aborted", "notify_checkpoint_aborted(" + checkpointId + ")", checkpointId);
        }
    }

    /**
     * The Python function's close() runs here in every case: after the end of input (deferred from
     * endInput) and also on cancellation, failure and stop-with-savepoint, where PyFlink would never call
     * it. The function must get the chance to stop its background work (agent runs on worker threads)
     * before the next attempt of the task starts.
     */
    @Override
    public void close() throws Exception {
        boolean closePython = pythonLive;
        pythonLive = false;
        try {
            if (closePython) {
                super.endInput();  // runs the Python function's close(), as PyFlink does at the end of input
            }
        } finally {
            try {
                if (wakeups != null) {
                    wakeups.close();  // after the Python close(), which closed its end of the pipe
                }
                if (taskStop != null) {
                    taskStop.close();
                }
            } finally {
                super.close();
            }
        }
    }

    /**
     * Records emitted while the drain timer fires (an event-time timer at {@code Long.MAX_VALUE - 1}, which the
     * final watermark of a bounded input fires) would carry that timer's time as their timestamp, which sinks
     * such as Kafka reject. They leave without a timestamp instead; every other record is untouched.
     */
    static final class DrainTimestampEraser<T> implements Output<StreamRecord<T>> {
        static final long DRAIN_TIMER = Long.MAX_VALUE - 1;
        private final Output<StreamRecord<T>> delegate;

        DrainTimestampEraser(Output<StreamRecord<T>> delegate) {
            this.delegate = delegate;
        }

        @Override
        public void collect(StreamRecord<T> record) {
            if (record.hasTimestamp() && record.getTimestamp() == DRAIN_TIMER) {
                record.eraseTimestamp();
            }
            delegate.collect(record);
        }

        @Override
        public <X> void collect(OutputTag<X> outputTag, StreamRecord<X> record) {
            delegate.collect(outputTag, record);
        }

        @Override
        public void emitWatermark(Watermark mark) {
            delegate.emitWatermark(mark);
        }

        @Override
        public void emitWatermarkStatus(WatermarkStatus watermarkStatus) {
            delegate.emitWatermarkStatus(watermarkStatus);
        }

        @Override
        public void emitLatencyMarker(LatencyMarker latencyMarker) {
            delegate.emitLatencyMarker(latencyMarker);
        }

        @Override
        public void emitRecordAttributes(RecordAttributes recordAttributes) {
            delegate.emitRecordAttributes(recordAttributes);
        }

        @Override
        public void emitWatermark(WatermarkEvent watermark) {
            delegate.emitWatermark(watermark);
        }

        @Override
        public void close() {
            delegate.close();
        }
    }

    @Override
    public void processElement(StreamRecord<IN> element) throws Exception {
        try {
            if (wakeups != null && wakeups.inputHeld()) {
                wakeups.awaitInputRelease();
                setKeyContextElement(element);  // the mails run meanwhile set other keys
            }
            super.processElement(element);
        } catch (Exception e) {
            throw withoutRestartIfMarked(e);
        }
    }

    @Override
    public void onEventTime(InternalTimer<K, VoidNamespace> timer) throws Exception {
        try {
            super.onEventTime(timer);
        } catch (Exception e) {
            throw withoutRestartIfMarked(e);
        }
    }

    @Override
    public void onProcessingTime(InternalTimer<K, VoidNamespace> timer) throws Exception {
        try {
            super.onProcessingTime(timer);
        } catch (Exception e) {
            throw withoutRestartIfMarked(e);
        }
    }

    /** The failure as is, or wrapped so that Flink fails the job without restarting it (see NO_RESTART_MARKER). */
    static Exception withoutRestartIfMarked(Exception failure) {
        for (Throwable cause = failure; cause != null; cause = cause.getCause()) {
            String message = cause.getMessage();
            if (message != null && message.contains(NO_RESTART_MARKER)) {
                return new SuppressRestartsException(failure);
            }
        }
        return failure;
    }

    /** PyFlink's operator-fusion optimizer calls copy(); without this override the bridge would vanish. */
    @Override
    public <T> AbstractEmbeddedDataStreamPythonFunctionOperator<T> copy(
            DataStreamPythonFunctionInfo pythonFunctionInfo, TypeInformation<T> outputTypeInfo) {
        return new CheckpointBridgeOperator<K, IN, T>(config, pythonFunctionInfo, bridgeInputTypeInfo, outputTypeInfo);
    }

    private Object callPython(String method, String description, Object... arguments) throws CheckpointHookException {
        try {
            return interpreter.invokeMethod(BRIDGE, method, arguments);
        } catch (Exception e) {
            throw new CheckpointHookException(
                    "Python " + description + " failed in " + getOperatorName() + ": " + e.getMessage(), e);
        }
    }

    /** Frames the values as (4-byte big-endian length, bytes)*: one byte[] crosses into Python unchanged. */
    private static byte[] pack(List<byte[]> values) throws IOException {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        try (DataOutputStream out = new DataOutputStream(buffer)) {
            for (byte[] value : values) {
                out.writeInt(value.length);
                out.write(value);
            }
        }
        return buffer.toByteArray();
    }

    /** An exception raised by one of the Python function's checkpoint hooks. */
    public static final class CheckpointHookException extends Exception {
        private static final long serialVersionUID = 1L;

        CheckpointHookException(String message, Throwable cause) {
            super(message, cause);
        }
    }
}
