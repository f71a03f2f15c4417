import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.StringWriter;
import java.io.Writer;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.LocalDate;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.Map;
import java.util.UUID;
import org.apache.avro.Conversions;
import org.apache.avro.Schema;
import org.apache.avro.data.TimeConversions;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.SchemaStore;

/**
 * An independent decoder for the interop tests: Apache Avro Java's single-object decoder.
 *
 * <p>Usage: {@code java AvroDecode --reader A.avsc ... --writer B.avsc ...}. Every schema goes into a
 * {@link SchemaStore.Cache}; for each stdin line (a base64 value in Avro single-object encoding) the
 * writer schema is found by the fingerprint in the value's header and the value is decoded by a
 * {@link BinaryMessageDecoder} whose read schema is the reader schema of the same full name, with
 * the store as its resolver (so values written with an older schema resolve to the current one).
 * Logical types are converted (decimal, uuid, timestamp-millis/micros, date).
 *
 * <p>Each output line is JSON: {"writer": full name, "value": ...} or {"error": ...}. Values are
 * tagged where JSON is ambiguous: {"$double": Double.toString}, {"$bytes": base64},
 * {"$decimal": [unscaled, scale]}, {"$ts_us": micros}, {"$date": ISO}, {"$uuid": text}.
 */
public final class AvroDecode {
  private AvroDecode() {}

  public static void main(String[] args) throws IOException {
    GenericData model = new GenericData();
    model.addLogicalTypeConversion(new Conversions.DecimalConversion());
    model.addLogicalTypeConversion(new Conversions.UUIDConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimestampMillisConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimestampMicrosConversion());
    model.addLogicalTypeConversion(new TimeConversions.DateConversion());

    SchemaStore.Cache store = new SchemaStore.Cache();
    Map<String, Schema> readers = new HashMap<>();
    boolean reader = true;
    for (String arg : args) {
      if (arg.equals("--reader") || arg.equals("--writer")) {
        reader = arg.equals("--reader");
        continue;
      }
      Schema schema = new Schema.Parser().parse(new File(arg)); // one parser per file: names repeat
      store.addSchema(schema);
      if (reader) {
        readers.put(schema.getFullName(), schema);
      }
    }

    Map<String, BinaryMessageDecoder<GenericRecord>> decoders = new HashMap<>();
    JsonFactory json = new JsonFactory();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    Writer out = new OutputStreamWriter(System.out, StandardCharsets.UTF_8);
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      StringWriter buffer = new StringWriter();
      try (JsonGenerator gen = json.createGenerator(buffer)) {
        gen.writeStartObject();
        try {
          byte[] bytes = Base64.getDecoder().decode(line.trim());
          long fingerprint = ByteBuffer.wrap(bytes, 2, 8).order(ByteOrder.LITTLE_ENDIAN).getLong();
          Schema writer = store.findByFingerprint(fingerprint);
          if (writer == null) {
            throw new IllegalStateException("unknown fingerprint " + Long.toHexString(fingerprint));
          }
          Schema read = readers.getOrDefault(writer.getFullName(), writer);
          BinaryMessageDecoder<GenericRecord> decoder = decoders.computeIfAbsent(
              read.getFullName(), name -> new BinaryMessageDecoder<>(model, read, store));
          GenericRecord record = decoder.decode(bytes);
          gen.writeStringField("writer", writer.getFullName());
          gen.writeFieldName("value");
          write(gen, record);
        } catch (Exception e) {
          gen.writeStringField("error", e.toString());
        }
        gen.writeEndObject();
      }
      out.write(buffer.toString());
      out.write('\n');
    }
    out.flush();
  }

  private static void write(JsonGenerator gen, Object value) throws IOException {
    if (value == null) {
      gen.writeNull();
    } else if (value instanceof Boolean b) {
      gen.writeBoolean(b);
    } else if (value instanceof Integer i) {
      gen.writeNumber(i);
    } else if (value instanceof Long l) {
      gen.writeNumber(l);
    } else if (value instanceof Float f) {
      tagged(gen, "$double", Double.toString((double) f)); // exact widening
    } else if (value instanceof Double d) {
      tagged(gen, "$double", Double.toString(d));
    } else if (value instanceof CharSequence || value instanceof GenericEnumSymbol) {
      gen.writeString(value.toString());
    } else if (value instanceof ByteBuffer buf) {
      ByteBuffer copy = buf.duplicate();
      byte[] data = new byte[copy.remaining()];
      copy.get(data);
      tagged(gen, "$bytes", Base64.getEncoder().encodeToString(data));
    } else if (value instanceof GenericFixed fixed) {
      tagged(gen, "$bytes", Base64.getEncoder().encodeToString(fixed.bytes()));
    } else if (value instanceof BigDecimal d) {
      gen.writeStartObject();
      gen.writeFieldName("$decimal");
      gen.writeStartArray();
      gen.writeString(d.unscaledValue().toString());
      gen.writeNumber(d.scale());
      gen.writeEndArray();
      gen.writeEndObject();
    } else if (value instanceof Instant t) {
      long micros = Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L), t.getNano() / 1_000L);
      gen.writeStartObject();
      gen.writeNumberField("$ts_us", micros);
      gen.writeEndObject();
    } else if (value instanceof LocalDate d) {
      tagged(gen, "$date", d.toString());
    } else if (value instanceof UUID u) {
      tagged(gen, "$uuid", u.toString());
    } else if (value instanceof GenericRecord record) {
      gen.writeStartObject();
      for (Schema.Field field : record.getSchema().getFields()) {
        gen.writeFieldName(field.name());
        write(gen, record.get(field.pos()));
      }
      gen.writeEndObject();
    } else if (value instanceof Map<?, ?> map) {
      gen.writeStartObject();
      for (Map.Entry<?, ?> e : map.entrySet()) {
        gen.writeFieldName(e.getKey().toString());
        write(gen, e.getValue());
      }
      gen.writeEndObject();
    } else if (value instanceof Collection<?> items) {
      gen.writeStartArray();
      for (Object item : items) {
        write(gen, item);
      }
      gen.writeEndArray();
    } else {
      throw new IllegalStateException("unexpected datum type " + value.getClass().getName());
    }
  }

  private static void tagged(JsonGenerator gen, String tag, String text) throws IOException {
    gen.writeStartObject();
    gen.writeStringField(tag, text);
    gen.writeEndObject();
  }
}
