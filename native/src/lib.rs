//! `relay._native`: the relay's hot path in Rust, for the common case.
//!
//! `ChangeReader.read(changes)` (reader.rs) turns the change stream's raw change events into
//! `relay.core.change.Change` values in one pass over each. `Encoder.encode(changes,
//! fencing_token)` turns a batch of those values (the outbox document's raw BSON, its position and
//! cluster time) into the Kafka messages the Python path
//! (`relay.avro.encoding.MessageBuilder.build`) would build for them: the generic envelope
//! `io.outboxrelay.v1.OutboxEvent` (payload as relaxed Extended JSON, python_json.rs) or an event
//! type's typed envelope (payload by the BSON -> Avro mapping, typed.rs), in Avro single-object
//! encoding, the key, the CloudEvents headers and the fencing token. It returns one
//! `OutgoingMessage` per change, or `None` where it declines: anything it does not handle exactly
//! as the Python path does (a malformed document, a payload value the mapping refuses or that is
//! not written here, a message over the size limit, a value that is not a Change). The caller
//! builds those with the Python path, which also raises the poison-event errors, so the two
//! paths never disagree on what is published or on why something is not. tests/unit/test_native.py
//! and test_native_typed.py check byte equality on random documents and schemas.

mod avro;
mod python_json;
mod reader;
mod typed;

use bson::{RawBsonRef, RawDocument};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use std::collections::HashMap;
use std::fmt::Write;

/// The earliest and latest millisecond Python's datetime holds (years 1 to 9999): outside, the
/// Python path sees a DatetimeMS, which is not a date for `occurredAt`.
pub(crate) const MIN_DATETIME_MS: i64 = -62_135_596_800_000;
pub(crate) const MAX_DATETIME_MS: i64 = python_json::MAX_UTC_MS;

pub(crate) fn utc(ms: i64) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok()
}

/// One piece of the topic template: literal text, then (optionally) a field's value.
struct TemplatePart {
    literal: String,
    field: Option<Field>,
}

#[derive(Clone, Copy)]
enum Field {
    AggregateType,
    EventType,
}

/// What `encode` reads from an outbox document, borrowed from its raw bytes.
struct Event<'a> {
    id: String,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    event_type: &'a str,
    occurred_at_ms: i64,
    payload: &'a RawDocument,
    headers: Vec<(&'a str, &'a str)>,
    topic: Option<&'a str>,
}

#[pyclass(module = "relay._native", frozen)]
struct Encoder {
    field_aggregate_type: String,
    field_aggregate_id: String,
    field_event_type: String,
    field_payload: String,
    field_occurred_at: String,
    field_headers: String,
    field_topic: String,
    template: Vec<TemplatePart>,
    typed: HashMap<String, Typed>,
    prefix: Vec<u8>, // C3 01 and the generic envelope's fingerprint
    database: String,
    collection: String,
    max_bytes: usize,
    record_overhead: usize,
    message: Py<PyAny>,
    ce_source: Py<PyBytes>,
    names: Names,
    change: Py<PyType>, // relay.core.change.Change: what `encode` takes
}

/// The names and rules every record shares, given by relay.core.message (never retyped here):
/// header names, reserved prefixes, the trace-context headers and their CloudEvents copies,
/// CloudEvents' specversion, the Avro content type, and Kafka's topic rule.
struct Names {
    ce: [String; 6], // ce_id, ce_type, ce_source, ce_specversion, ce_time, ce_subject
    content_type: String,
    fencing: String,
    reserved: Vec<String>,
    trace: Vec<(String, String)>,
    specversion: Vec<u8>,
    avro: Vec<u8>,
    topic_max: usize,
    topic_punctuation: Vec<u8>,
}

/// A typed envelope: its single-object prefix (C3 01 and its fingerprint) and its payload's program.
struct Typed {
    prefix: Vec<u8>,
    payload: typed::Program,
}

type NamesArg = (Vec<String>, String, String, Vec<String>, Vec<(String, String)>, Vec<u8>, Vec<u8>, usize, String);

#[pymethods]
impl Encoder {
    /// `fields`: the outbox field names (aggregateType, aggregateId, eventType, payload,
    /// occurredAt, headers, topic); `template`: the topic template as (literal, field or None)
    /// pairs; `typed`: for each event type with a typed envelope, (event type, the envelope's
    /// fingerprint, its payload program's root and nodes: relay.avro.native_program); `fingerprint`: the generic
    /// envelope's 8-byte CRC-64-AVRO fingerprint; `message`: the class of the messages returned;
    /// `names`: relay.avro.encoding.NATIVE_NAMES (from relay.core.message); `change`: the class of
    /// the values encoded (relay.core.change.Change, whose fields are checked).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, fields: (String, String, String, String, String, String, String),
           template: Vec<(String, Option<String>)>, typed: Vec<(String, Vec<u8>, usize, Vec<typed::NodeArg>)>, fingerprint: &[u8], database: String,
           collection: String, ce_source: &[u8], max_bytes: usize, record_overhead: usize,
           message: Py<PyAny>, names: NamesArg, change: Bound<'_, PyType>) -> PyResult<Self> {
        reader::check_fields(&change, &reader::CHANGE_FIELDS)?;
        if fingerprint.len() != 8 {
            return Err(PyValueError::new_err("the fingerprint must be 8 bytes"));
        }
        let (ce, content_type, fencing, reserved, trace, specversion, avro, topic_max, punctuation) = names;
        let ce: [String; 6] = ce.try_into().map_err(|_| PyValueError::new_err("six CloudEvents header names"))?;
        let names = Names { ce, content_type, fencing, reserved, trace, specversion, avro, topic_max,
                            topic_punctuation: punctuation.into_bytes() };
        let mut parts = Vec::new();
        for (literal, field) in template {
            let field = match field.as_deref() {
                None => None,
                Some("aggregateType") => Some(Field::AggregateType),
                Some("eventType") => Some(Field::EventType),
                Some(other) => return Err(PyValueError::new_err(format!("unknown template field {other:?}"))),
            };
            parts.push(TemplatePart { literal, field });
        }
        let single_object = |fingerprint: &[u8]| [&[0xC3, 0x01], fingerprint].concat();
        let prefix = single_object(fingerprint);
        let mut envelopes = HashMap::new();
        for (event_type, fingerprint, root, nodes) in typed {
            if fingerprint.len() != 8 {
                return Err(PyValueError::new_err(format!("the fingerprint of {event_type}'s envelope must be 8 bytes")));
            }
            let payload = typed::Program::new(root, nodes)?;
            envelopes.insert(event_type, Typed { prefix: single_object(&fingerprint), payload });
        }
        Ok(Encoder {
            field_aggregate_type: fields.0, field_aggregate_id: fields.1, field_event_type: fields.2,
            field_payload: fields.3, field_occurred_at: fields.4, field_headers: fields.5, field_topic: fields.6,
            template: parts, typed: envelopes, prefix, database, collection, max_bytes,
            record_overhead, message, ce_source: PyBytes::new(py, ce_source).unbind(), names,
            change: change.unbind(),
        })
    }

    /// The message for each Change, or None where the Python path must build it.
    fn encode<'py>(&self, py: Python<'py>, changes: &Bound<'py, PyList>, fencing_token: i64)
                   -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let fencing = PyBytes::new(py, fencing_token.to_string().as_bytes());
        let n = &self.names;
        let constants = Constants {
            ce_id: PyString::new(py, &n.ce[0]), ce_type: PyString::new(py, &n.ce[1]),
            ce_source: PyString::new(py, &n.ce[2]), ce_specversion: PyString::new(py, &n.ce[3]),
            ce_time: PyString::new(py, &n.ce[4]), ce_subject: PyString::new(py, &n.ce[5]),
            content_type: PyString::new(py, &n.content_type), fencing_name: PyString::new(py, &n.fencing),
            specversion: PyBytes::new(py, &n.specversion), avro: PyBytes::new(py, &n.avro),
            source: self.ce_source.bind(py).clone(), fencing,
            trace: n.trace.iter().map(|(from, to)| (from.as_str(), PyString::new(py, to))).collect(),
        };
        let mut value = Vec::with_capacity(512);
        let mut payload = String::with_capacity(256);
        let class = self.change.bind(py);
        for change in changes.iter() {
            let message = match change_fields(py, class, &change) {
                Some((document, position, cluster_time)) => match position.to_str() {
                    Ok(position) => self.message(py, document.as_bytes(), position, cluster_time, &constants,
                                                 &mut value, &mut payload)?,
                    Err(_) => None,
                },
                None => None,
            };
            match message {
                Some(message) => out.append(message)?,
                None => out.append(py.None())?,
            }
        }
        Ok(out)
    }
}

/// A Change's document bytes, position (its token's `_data`) and cluster time as the envelope
/// writes it (`time << 32 | inc`, 0 when unknown); None for anything else (the Python path's).
fn change_fields<'py>(py: Python<'py>, class: &Bound<'py, PyType>, change: &Bound<'py, PyAny>)
                      -> Option<(Bound<'py, PyBytes>, Bound<'py, PyString>, i64)> {
    if !change.get_type().is(class) {
        return None;
    }
    let change = change.cast::<PyTuple>().ok()?;
    let document = change.get_item(reader::DOCUMENT).ok()?.cast_into::<PyBytes>().ok()?;
    let position = change.get_item(reader::POSITION).ok()?.cast_into::<PyDict>().ok()?;
    let position = position.get_item(intern!(py, "_data")).ok()??.cast_into::<PyString>().ok()?;
    let cluster_time = change.get_item(reader::CLUSTER_TIME).ok()?;
    let cluster_time = if cluster_time.is_none() {
        0
    } else {
        let (time, inc): (i64, i64) = cluster_time.extract().ok()?;
        // time << 32 | increment must fit Avro's long (the Python path fails to encode beyond).
        if !(0..1 << 31).contains(&time) || !(0..1 << 32).contains(&inc) {
            return None;
        }
        time << 32 | inc
    };
    Some((document, position, cluster_time))
}

struct Constants<'py, 'n> {
    ce_id: Bound<'py, PyString>,
    ce_type: Bound<'py, PyString>,
    ce_source: Bound<'py, PyString>,
    ce_specversion: Bound<'py, PyString>,
    ce_time: Bound<'py, PyString>,
    ce_subject: Bound<'py, PyString>,
    content_type: Bound<'py, PyString>,
    fencing_name: Bound<'py, PyString>,
    trace: Vec<(&'n str, Bound<'py, PyString>)>,
    specversion: Bound<'py, PyBytes>,
    avro: Bound<'py, PyBytes>,
    source: Bound<'py, PyBytes>,
    fencing: Bound<'py, PyBytes>,
}

impl Encoder {
    #[allow(clippy::too_many_arguments)]
    fn message<'py>(&self, py: Python<'py>, document: &[u8], position: &str, cluster_time: i64,
                    c: &Constants<'py, '_>, value: &mut Vec<u8>, payload: &mut String)
                    -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(event) = self.read(document) else { return Ok(None) };
        let topic = match event.topic {
            Some(t) => t.to_string(),
            None => self.topic(&event),
        };
        if !valid_topic(&topic, &self.names) {
            return Ok(None);
        }
        let envelope = self.typed.get(event.event_type);
        value.clear();
        value.extend_from_slice(envelope.map_or(&self.prefix, |t| &t.prefix));
        avro::write_string(value, &event.id);
        avro::write_string(value, event.aggregate_type);
        avro::write_string(value, event.aggregate_id);
        avro::write_string(value, event.event_type);
        avro::write_long(value, event.occurred_at_ms);
        match envelope {
            // Typed: the payload record by the BSON -> Avro mapping; a refusal is the Python
            // path's to report (it names the field path).
            Some(t) => {
                if t.payload.write(value, event.payload).is_err() {
                    return Ok(None);
                }
            }
            None => {
                payload.clear();
                if python_json::write_document(payload, event.payload).is_err() {
                    return Ok(None);
                }
                avro::write_string(value, payload);
            }
        }
        avro::write_string(value, &self.database);
        avro::write_string(value, &self.collection);
        avro::write_long(value, cluster_time);
        avro::write_string(value, position);
        let ce_time = rfc3339_millis(event.occurred_at_ms);
        let mut size = event.aggregate_id.len() + value.len() + self.record_overhead;
        let n = &self.names;
        size += n.ce[0].len() + event.id.len() + n.ce[1].len() + event.event_type.len();
        size += n.ce[2].len() + c.source.as_bytes().len() + n.ce[3].len() + n.specversion.len();
        size += n.ce[4].len() + ce_time.len() + n.ce[5].len() + event.aggregate_id.len();
        size += n.content_type.len() + n.avro.len() + n.fencing.len() + c.fencing.as_bytes().len();
        for (name, v) in &event.headers {
            size += name.len() + v.len();
        }
        let traced: Vec<(&Bound<'py, PyString>, &str)> = c.trace.iter()
            .filter_map(|(from, to)| event.headers.iter().find(|(h, _)| h == from).map(|(_, v)| (to, *v)))
            .collect();
        for (to, v) in &traced {
            size += to.to_str()?.len() + v.len();
        }
        if size > self.max_bytes {
            return Ok(None); // the Python path raises the poison error naming the size
        }
        let headers = PyList::empty(py);
        let pair = |name: &Bound<'py, PyString>, v: &Bound<'py, PyBytes>| PyTuple::new(py, [name.as_any(), v.as_any()]);
        headers.append(pair(&c.ce_id, &PyBytes::new(py, event.id.as_bytes()))?)?;
        headers.append(pair(&c.ce_type, &PyBytes::new(py, event.event_type.as_bytes()))?)?;
        headers.append(pair(&c.ce_source, &c.source)?)?;
        headers.append(pair(&c.ce_specversion, &c.specversion)?)?;
        headers.append(pair(&c.ce_time, &PyBytes::new(py, ce_time.as_bytes()))?)?;
        headers.append(pair(&c.ce_subject, &PyBytes::new(py, event.aggregate_id.as_bytes()))?)?;
        headers.append(pair(&c.content_type, &c.avro)?)?;
        headers.append(pair(&c.fencing_name, &c.fencing)?)?;
        for (name, v) in &event.headers {
            headers.append(pair(&PyString::new(py, name), &PyBytes::new(py, v.as_bytes()))?)?;
        }
        for (to, v) in traced {
            headers.append(pair(to, &PyBytes::new(py, v.as_bytes()))?)?;
        }
        let args = (PyString::new(py, &event.id), PyString::new(py, &topic),
                    PyBytes::new(py, event.aggregate_id.as_bytes()), PyBytes::new(py, value), headers);
        Ok(Some(self.message.bind(py).call1(args)?))
    }

    /// The outbox document as the Python path reads it; None when the Python path must look at
    /// it (it may be malformed, or not yet handled here).
    fn read<'a>(&self, raw: &'a [u8]) -> Option<Event<'a>> {
        let doc = RawDocument::from_bytes(raw).ok()?;
        // One pass over the document; a repeated key is left to the Python path (its dict keeps
        // the last value, this reader would see the first).
        let mut seen: Vec<&str> = Vec::with_capacity(10);
        let mut id = None;
        let (mut aggregate_type, mut aggregate_id, mut event_type) = (None, None, None);
        let (mut occurred_at_ms, mut payload, mut headers, mut topic) = (None, None, Vec::new(), None);
        for element in doc.iter() {
            let (key, value) = element.ok()?;
            let key = key.as_str();
            if seen.contains(&key) {
                return None;
            }
            seen.push(key);
            if key == "_id" {
                id = Some(match value {
                    RawBsonRef::ObjectId(oid) => oid.to_hex(),
                    RawBsonRef::String(s) if !s.is_empty() => s.to_string(),
                    _ => return None,
                });
            } else if key == self.field_aggregate_type {
                aggregate_type = Some(non_empty(value)?);
            } else if key == self.field_aggregate_id {
                aggregate_id = Some(non_empty(value)?);
            } else if key == self.field_event_type {
                event_type = Some(non_empty(value)?);
            } else if key == self.field_occurred_at {
                occurred_at_ms = match value {
                    RawBsonRef::DateTime(dt) if (MIN_DATETIME_MS..=MAX_DATETIME_MS).contains(&dt.timestamp_millis()) => {
                        Some(dt.timestamp_millis())
                    }
                    _ => return None,
                };
            } else if key == self.field_payload {
                payload = match value {
                    RawBsonRef::Document(d) => Some(d),
                    _ => return None,
                };
            } else if key == self.field_headers {
                match value {
                    RawBsonRef::Null => {}
                    RawBsonRef::Document(d) => {
                        for element in d.iter() {
                            let (name, v) = element.ok()?;
                            let name = name.as_str();
                            if headers.iter().any(|(n, _)| *n == name)
                                || self.names.reserved.iter().any(|r| name.starts_with(r.as_str())) {
                                return None;
                            }
                            match v {
                                RawBsonRef::String(s) => headers.push((name, s)),
                                _ => return None,
                            }
                        }
                    }
                    _ => return None,
                }
            } else if key == self.field_topic {
                topic = match value {
                    RawBsonRef::Null => None,
                    RawBsonRef::String(s) if !s.is_empty() => Some(s),
                    _ => return None,
                };
            }
        }
        Some(Event {
            id: id?, aggregate_type: aggregate_type?, aggregate_id: aggregate_id?, event_type: event_type?,
            occurred_at_ms: occurred_at_ms?, payload: payload?, headers, topic,
        })
    }

    fn topic(&self, event: &Event<'_>) -> String {
        let mut topic = String::with_capacity(64);
        for part in &self.template {
            topic.push_str(&part.literal);
            match part.field {
                Some(Field::AggregateType) => topic.push_str(event.aggregate_type),
                Some(Field::EventType) => topic.push_str(event.event_type),
                None => {}
            }
        }
        topic
    }
}

fn non_empty(value: RawBsonRef<'_>) -> Option<&str> {
    match value {
        RawBsonRef::String(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// Kafka's topic names (relay.core.message.valid_topic): 1 to TOPIC_MAX_LENGTH letters, digits
/// and TOPIC_PUNCTUATION, not "." or "..".
fn valid_topic(topic: &str, names: &Names) -> bool {
    !topic.is_empty() && topic.len() <= names.topic_max && topic != "." && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || names.topic_punctuation.contains(&b))
}

/// `ce_time`: UTC, milliseconds, "Z" (Python: isoformat(timespec="milliseconds") with "+00:00" as "Z").
fn rfc3339_millis(ms: i64) -> String {
    let mut out = String::with_capacity(24);
    if let Some(t) = utc(ms) {
        write!(out, "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", t.year(), u8::from(t.month()), t.day(), t.hour(),
               t.minute(), t.second(), ms.rem_euclid(1000)).unwrap();
    }
    out
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Encoder>()?;
    m.add_class::<reader::ChangeReader>()?;
    m.add_function(wrap_pyfunction!(reader::cursor_batch, m)?)?;
    m.add("MAX_UTC_MS", python_json::MAX_UTC_MS)?;
    Ok(())
}
