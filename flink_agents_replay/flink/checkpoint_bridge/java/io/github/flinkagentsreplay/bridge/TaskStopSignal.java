/*
 * Task-stop signal of flink-agents-replay: tells the Python function's worker threads, without a call into Java,
 * that the task is being cancelled or failed, so its agent runs make no new call from that moment on.
 */
package io.github.flinkagentsreplay.bridge;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.FileOutputStream;
import java.io.IOException;
import java.util.function.BooleanSupplier;

/**
 * Watches the task for cancellation or failure and writes one byte to a pipe Python reads.
 *
 * <p>When Flink cancels a task, or fails it from outside ("Attempting to fail task externally": a TaskManager that
 * lost its JobManager, a failover elsewhere), the task's execution state turns CANCELING or FAILED at once, and a
 * canceler thread then sets the StreamTask's {@code canceled} flag; a failure on the task thread sets {@code failing}
 * before the operators close. The operator's close (which
 * stops the Python runs) comes only when the task thread gets there, tens of milliseconds later or more, and
 * meanwhile the runs went on calling. None of them has a listener (the task's cancelables are closed only once the
 * task has ended), so a daemon thread here reads them every {@code intervalMs} and, when one is set, writes the byte
 * {@code 1} to the pipe whose write end Python handed over ({@link #listen}), then stops. Python's worker threads
 * read the pipe without blocking before every call and action: they cannot call into Java, and no Java thread but
 * the task thread may call into the embedded interpreter.
 *
 * <p>Public, with public methods: Python calls them through pemja.
 */
public final class TaskStopSignal {

    private static final Logger LOG = LoggerFactory.getLogger(TaskStopSignal.class);

    /** The byte written when the task is being cancelled or failed. */
    static final int STOPPING = 1;

    private final BooleanSupplier stopping;
    private final long intervalMs;
    private final boolean executionState;
    private final String name;
    private volatile boolean closed;
    private transient Thread watcher;

    TaskStopSignal(BooleanSupplier stopping, long intervalMs, boolean executionState, String name) {
        this.stopping = stopping;
        this.intervalMs = intervalMs;
        this.executionState = executionState;
        this.name = name;
    }

    /** How often the task's flags are read, in milliseconds. */
    public long intervalMs() {
        return intervalMs;
    }

    /** Whether the TaskManager task's execution state is read too (else only the StreamTask's flags). */
    public boolean watchesExecutionState() {
        return executionState;
    }

    /** Start watching; the byte goes to the pipe whose write end is the process's file descriptor {@code fd}. */
    public void listen(long fd) throws IOException {
        FileOutputStream pipe = new FileOutputStream("/proc/self/fd/" + fd);
        watcher = new Thread(() -> watch(pipe), name);
        watcher.setDaemon(true);
        watcher.start();
    }

    private void watch(FileOutputStream pipe) {
        try (FileOutputStream out = pipe) {
            while (!closed) {
                if (stopping.getAsBoolean()) {
                    out.write(STOPPING);
                    out.flush();
                    LOG.info("{}: the task is being cancelled or failed; its agent runs make no new call", name);
                    return;
                }
                Thread.sleep(intervalMs);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();  // closed
        } catch (IOException e) {
            if (!closed) {
                LOG.warn("{} stopped: {}", name, e.toString());
            }
        }
    }

    /** Stop watching (the operator closes: Python has stopped its runs already). */
    void close() throws InterruptedException {
        closed = true;
        Thread thread = watcher;
        if (thread != null) {
            thread.interrupt();
            thread.join(1000);
        }
    }
}
