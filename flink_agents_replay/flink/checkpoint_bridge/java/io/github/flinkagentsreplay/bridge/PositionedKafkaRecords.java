package io.github.flinkagentsreplay.bridge;

import java.io.Serializable;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * A Kafka source deserializer that keeps where each record came from: every record becomes a
 * {@code Row(topic, partition, offset, timestamp, value, traceparent)} with the value's raw bytes (null
 * for a tombstone), so a job can send a record it cannot parse to a dead-letter topic with its position;
 * {@code traceparent} is the value of the record's last {@code traceparent} header (W3C trace context),
 * null when it has none or its value is not UTF-8, so that the run of the record links to its upstream.
 *
 * <p>PyFlink's {@code KafkaSource} only offers value-only deserializers, which drop the position. The
 * connector's {@code KafkaRecordDeserializationSchema} takes a {@code ConsumerRecord}, whose class is
 * relocated in {@code flink-sql-connector-kafka} and not in {@code flink-connector-kafka}: a class
 * compiled against either would fail with the other. So the schema is a {@link Proxy} of the
 * interface as the job's class loader has it, and the record's fields are read by name. The proxy is
 * serializable (this handler is, and Flink resolves proxy classes with the user class loader).
 */
public final class PositionedKafkaRecords implements InvocationHandler, Serializable {

    private static final long serialVersionUID = 1L;

    static final String SCHEMA_INTERFACE =
            "org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema";

    private static final TypeInformation<Row> PRODUCED_TYPE =
            Types.ROW_NAMED(
                    new String[] {"topic", "partition", "offset", "timestamp", "value", "traceparent"},
                    Types.STRING,
                    Types.INT,
                    Types.LONG,
                    Types.LONG,
                    PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO,
                    Types.STRING);

    /** The W3C trace context header a record's upstream span travels in. */
    static final String TRACEPARENT = "traceparent";

    private transient Method topic;
    private transient Method partition;
    private transient Method offset;
    private transient Method timestamp;
    private transient Method value;
    private transient Method headers;
    private transient Class<?> headersType;
    private transient Method lastHeader;
    private transient Class<?> headerType;
    private transient Method headerValue;

    /** The deserializer, for {@code KafkaSourceBuilder.setDeserializer}; the connector must be loadable. */
    public static Object deserializer() throws ClassNotFoundException {
        ClassLoader loader = Thread.currentThread().getContextClassLoader();
        Class<?> schema = Class.forName(SCHEMA_INTERFACE, false, loader);
        return Proxy.newProxyInstance(loader, new Class<?>[] {schema}, new PositionedKafkaRecords());
    }

    /** The type of the rows it produces. */
    public static TypeInformation<Row> producedType() {
        return PRODUCED_TYPE;
    }

    @Override
    public Object invoke(Object proxy, Method method, Object[] args) throws Throwable {
        switch (method.getName()) {
            case "deserialize":
                emit(args[0], args[1]);
                return null;
            case "getProducedType":
                return PRODUCED_TYPE;
            case "open":
                return null;
            case "hashCode":
                return System.identityHashCode(proxy);
            case "equals":
                return proxy == args[0];
            case "toString":
                return "PositionedKafkaRecords";
            default:
                throw new UnsupportedOperationException(method.toString());
        }
    }

    @SuppressWarnings("unchecked")
    private void emit(Object record, Object collector) throws ReflectiveOperationException {
        if (topic == null) {
            Class<?> type = record.getClass();
            topic = type.getMethod("topic");
            partition = type.getMethod("partition");
            offset = type.getMethod("offset");
            timestamp = type.getMethod("timestamp");
            value = type.getMethod("value");
            headers = type.getMethod("headers");
        }
        ((Collector<Row>) collector)
                .collect(
                        Row.of(
                                topic.invoke(record),
                                partition.invoke(record),
                                offset.invoke(record),
                                timestamp.invoke(record),
                                value.invoke(record),
                                traceparent(headers.invoke(record))));
    }

    /** The last {@code traceparent} header's value as UTF-8 text, or null (none, or not UTF-8). */
    private String traceparent(Object recordHeaders) throws ReflectiveOperationException {
        if (recordHeaders == null) {
            return null;
        }
        if (recordHeaders.getClass() != headersType) {
            lastHeader = accessible(recordHeaders.getClass().getMethod("lastHeader", String.class));
            headersType = recordHeaders.getClass();
        }
        Object header = lastHeader.invoke(recordHeaders, TRACEPARENT);
        if (header == null) {
            return null;
        }
        if (header.getClass() != headerType) {
            headerValue = accessible(header.getClass().getMethod("value"));
            headerType = header.getClass();
        }
        byte[] bytes = (byte[]) headerValue.invoke(header);
        if (bytes == null) {
            return null;
        }
        try {
            return StandardCharsets.UTF_8
                    .newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(bytes))
                    .toString();
        } catch (CharacterCodingException notUtf8) {
            return null;
        }
    }

    /** A public method of a class that may not be public itself (an implementation of a public interface). */
    private static Method accessible(Method method) {
        if (!java.lang.reflect.Modifier.isPublic(method.getDeclaringClass().getModifiers())) {
            method.setAccessible(true);
        }
        return method;
    }
}
