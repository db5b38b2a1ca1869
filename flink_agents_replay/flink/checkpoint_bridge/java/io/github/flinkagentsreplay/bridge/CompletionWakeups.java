/*
 * Completion wake-ups of flink-agents-replay: bring the task thread back to a key when one of its agent runs can be
 * applied, instead of every key with a run in flight polling on a processing-time timer.
 */
package io.github.flinkagentsreplay.bridge;

import org.apache.flink.api.common.operators.MailboxExecutor;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileInputStream;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.RejectedExecutionException;
import java.util.function.Supplier;

/**
 * Where Python's agent runs report "this run can be applied now", and the mail that brings the task thread back to
 * the run's key.
 *
 * <p>Python's worker threads cannot call into Java (they are not attached to the JVM) and no Java thread but the task
 * thread may call into the embedded interpreter, so the two sides meet at a pipe. On the task thread, Python registers
 * a run's token with {@link #remember(long)}, which keeps the current key. When the run's outputs may leave, Python
 * writes the token (8 bytes, big-endian: one atomic pipe write) from whatever thread it is on. A reader thread here
 * takes it and posts a mail; the mail, on the task thread, hands the key to the wake-up action. A token written
 * after the operator closed, or never remembered, wakes nothing. Python closes the pipe's write end when its function
 * closes; the reader then sees the end of the stream and stops.
 *
 * <p>Public, with public methods: Python calls them through pemja.
 */
public final class CompletionWakeups<K> {

    private static final Logger LOG = LoggerFactory.getLogger(CompletionWakeups.class);

    /** What a wake-up does with its key, on the task thread. */
    @FunctionalInterface
    interface KeyAction<K> {
        void run(K key) throws Exception;
    }

    private final MailboxExecutor mailbox;
    private final Supplier<K> currentKey;
    private final KeyAction<K> action;
    private final String name;
    /** token -> key of the run; touched on the task thread only (remember, forget, the mails). */
    private final Map<Long, K> keys = new HashMap<>();
    private volatile boolean closed;
    private transient Thread reader;
    /** Set by Python when it wants no input for now (task thread only); see {@link #awaitInputRelease}. */
    private boolean inputHeld;
    private long holdTimeoutMs;
    /** Counts holds: a mail that releases the input and holds it again (a run ended, the next started) restarts
     * the hold's deadline, so the timeout bounds the wait for progress, not a whole drain of queued runs. */
    private long holds;

    CompletionWakeups(MailboxExecutor mailbox, Supplier<K> currentKey, KeyAction<K> action, String name) {
        this.mailbox = mailbox;
        this.currentKey = currentKey;
        this.action = action;
        this.name = name;
    }

    /** Start reading tokens from the pipe whose read end is the process's file descriptor {@code fd}. */
    public void listen(long fd) throws IOException {
        FileInputStream pipe = new FileInputStream("/proc/self/fd/" + fd);
        reader = new Thread(() -> readTokens(pipe), name);
        reader.setDaemon(true);
        reader.start();
    }

    /** Keep the current key under {@code token} (task thread, while the key's run is submitted). */
    public void remember(long token) {
        keys.put(token, currentKey.get());
    }

    /** Drop {@code token} (task thread): its run was applied without a wake-up. */
    public void forget(long token) {
        keys.remove(token);
    }

    /**
     * Take no input until {@link #releaseInput()} (task thread): Python holds back inputs it would only queue. The
     * operator then runs mails (wake-ups, timers) in its processElement instead, so runs are applied and inputs
     * leave the queue; the source is backpressured. {@code timeoutMs}: how long the hold may last before the
     * task fails (a call that hangs).
     */
    public void holdInput(long timeoutMs) {
        inputHeld = true;
        holdTimeoutMs = timeoutMs;
        holds++;
    }

    /** Take input again (task thread). */
    public void releaseInput() {
        inputHeld = false;
    }

    /** Whether input is held (task thread). */
    boolean inputHeld() {
        return inputHeld;
    }

    /**
     * Run the task's mails (wake-ups and timers of this operator, never a checkpoint: those have a lower priority
     * than an operator's mails) until Python releases the input.
     */
    void awaitInputRelease() throws Exception {
        long deadline = System.currentTimeMillis() + holdTimeoutMs;
        long hold = holds;
        while (inputHeld && !closed) {
            if (holds != hold) {
                hold = holds;
                deadline = System.currentTimeMillis() + holdTimeoutMs;
            }
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("flink-agents-replay: no queued input could start within "
                        + holdTimeoutMs + " ms (slot_wait_timeout_s): a call may hang");
            }
            mailbox.yield();
        }
    }

    private void readTokens(FileInputStream pipe) {
        try (DataInputStream in = new DataInputStream(new BufferedInputStream(pipe))) {
            while (!closed) {
                long token = in.readLong();
                mailbox.execute(() -> wake(token), "flink-agents-replay: wake the key of a finished run");
            }
        } catch (EOFException e) {
            // Python closed its end: the function closed.
        } catch (RejectedExecutionException e) {
            // The task is ending (stop, cancel, failover) and its mailbox closed before the function: an ordinary
            // stop, not a warning. Nothing is lost: the runs' outputs leave with a restore, which resubmits them.
            LOG.info("{} stopped with the task's mailbox: {}", name, e.toString());
        } catch (IOException e) {
            if (!closed) {
                LOG.warn("{} stopped: {}", name, e.toString());
            }
        }
    }

    private void wake(long token) throws Exception {
        K key = keys.remove(token);
        if (key != null && !closed) {
            action.run(key);
        }
    }

    /** No wake-up runs from now on; waits briefly for the reader, which Python's close has ended. */
    void close() throws InterruptedException {
        closed = true;
        keys.clear();
        if (reader != null) {
            reader.join(1000);
            if (reader.isAlive()) {
                LOG.warn("{}: the Python side did not close its pipe; the reader thread is left blocked", name);
            }
        }
    }
}
