package io.github.flinkagentsreplay.bridge;

import java.nio.charset.StandardCharsets;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.types.Row;

/**
 * Serializes one field of a {@code Row} as UTF-8 text (null for a null field): with one for field 0 as
 * the key schema and one for field 1 as the value schema, Flink's {@code KafkaSink} writes
 * {@code Row(key, value)} elements as keyed records.
 *
 * <p>PyFlink's serialization schemas all take the whole element, for the key as for the value, so a
 * Python job cannot give a Kafka record a key apart from its value without a schema like this one.
 */
public final class RowFieldString implements SerializationSchema<Row> {

    private static final long serialVersionUID = 1L;

    private final int field;

    public RowFieldString(int field) {
        this.field = field;
    }

    @Override
    public byte[] serialize(Row row) {
        Object value = row.getField(field);
        return value == null ? null : value.toString().getBytes(StandardCharsets.UTF_8);
    }
}
