//! `ChangeReader.read(changes)`: the change stream's raw change events (the raw BSON of each
//! `RawBSONDocument` of a getMore reply) as `relay.core.change.Change` values, in one pass over
//! each event, decoding nothing into Python but what the value holds (relay.mongo.codecs.read_changes).
//!
//! For each insert: the outbox document's event id (its `_id` as text: an ObjectId's hex, a
//! string as it is; any other `_id`, a missing one or a repeated key is left to the Python
//! function given, relay.core.message.event_id_of over the decoded document), the change's resume
//! token as a plain dict (`{"_data": ...}`; a token with other fields is decoded by the Python
//! function given), its cluster time (`clusterTime`; without one, the token's, as
//! relay.core.positions.token_cluster_time reads it), its wall time (Unix ms, -1 without one) and
//! the outbox document's bytes. Reading stops at the first change that is not an insert (a drop,
//! rename or invalidate ends the stream): its index is returned beside the values (-1: none).
//! Given a list `routes`, each insert's route is appended to it: the integer the stream's pipeline
//! computed in its top-level field `r` (which scope of a shared stream it belongs to,
//! relay.mongo.pipeline), -1 without one.
//!
//! The top-level fields are found by their BSON sizes alone (`Walk`: a few nanoseconds a field;
//! only the fields read are decoded). An event the walk does not take is read again with the
//! bson crate, which names what is wrong with it.

use bson::{RawBsonRef, RawDocument};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyString, PyTuple, PyType};

/// The fields of relay.core.change.Change and relay.core.positions.ClusterTime, in order: the
/// values are built as tuples of these (checked when a reader is made).
pub(crate) const CHANGE_FIELDS: [&str; 5] = ["event_id", "position", "cluster_time", "wall_ms", "document"];
pub(crate) const POSITION: usize = 1;
pub(crate) const CLUSTER_TIME: usize = 2;
pub(crate) const DOCUMENT: usize = 4;
const CLUSTER_TIME_FIELDS: [&str; 2] = ["time", "inc"];

/// Raises unless `class` is a named tuple with exactly `expected` fields, in that order.
pub(crate) fn check_fields(class: &Bound<'_, PyType>, expected: &[&str]) -> PyResult<()> {
    if !class.is_subclass_of::<PyTuple>()? {
        return Err(PyTypeError::new_err(format!("{} is not a named tuple", class.name()?)));
    }
    let fields: Vec<String> = class.getattr(intern!(class.py(), "_fields"))?.extract()?;
    if fields != expected {
        return Err(PyValueError::new_err(format!("{} has fields {fields:?}, not {expected:?}", class.name()?)));
    }
    Ok(())
}

#[pyclass(module = "relay._native", frozen)]
pub(crate) struct ChangeReader {
    change: Py<PyType>,
    cluster_time: Py<PyType>,
    event_id: Py<PyAny>,
    token: Py<PyAny>,
}

/// What one raw change event holds, borrowed from its bytes (`token`, `document`: BSON documents).
struct Raw<'a> {
    insert: bool,
    token: Option<&'a [u8]>,
    cluster_time: Option<(u32, u32)>,
    wall_ms: i64,
    document: Option<&'a [u8]>,
    route: i64,
}

#[pymethods]
impl ChangeReader {
    /// `change`: relay.core.change.Change; `cluster_time`: relay.core.positions.ClusterTime;
    /// `event_id(document_bytes) -> str` and `token(token_bytes) -> dict`: the Python readers of
    /// what this one leaves to them.
    #[new]
    fn new(change: Bound<'_, PyType>, cluster_time: Bound<'_, PyType>, event_id: Py<PyAny>, token: Py<PyAny>)
           -> PyResult<Self> {
        check_fields(&change, &CHANGE_FIELDS)?;
        check_fields(&cluster_time, &CLUSTER_TIME_FIELDS)?;
        Ok(ChangeReader { change: change.unbind(), cluster_time: cluster_time.unbind(), event_id, token })
    }

    /// (the inserts before the first other change, as Change values; that change's index or -1);
    /// each insert's route appended to `routes` when given.
    #[pyo3(signature = (changes, routes=None))]
    fn read<'py>(&self, py: Python<'py>, changes: &Bound<'py, PyList>, routes: Option<&Bound<'py, PyList>>)
                 -> PyResult<(Bound<'py, PyList>, i64)> {
        let out = PyList::empty(py);
        for (i, change) in changes.iter().enumerate() {
            // A change is its raw BSON (what `cursor_batch` splits a reply into) or holds it (`raw`).
            let raw = match change.cast::<PyBytes>() {
                Ok(_) => change.clone(),
                Err(_) => change.getattr(intern!(py, "raw"))
                    .map_err(|_| PyTypeError::new_err(format!("change {i} has no raw BSON")))?,
            };
            let copied;
            let bytes = match raw.cast::<PyBytes>() {
                Ok(b) => b.as_bytes(),
                Err(_) => {
                    copied = PyBuffer::<u8>::get(&raw)?.to_vec(py)?; // a memoryview (a slice of a reply)
                    &copied[..]
                }
            };
            let fields = scan(bytes).map_err(|e| PyValueError::new_err(format!("change {i}: {e}")))?;
            if !fields.insert {
                return Ok((out, i as i64));
            }
            let (Some(token), Some(document)) = (fields.token, fields.document) else {
                return Err(PyValueError::new_err(format!("change {i}: an insert without _id or fullDocument")));
            };
            out.append(self.value(py, &fields, token, document)?)?;
            if let Some(routes) = routes {
                routes.append(fields.route)?;
            }
        }
        Ok((out, -1))
    }
}

/// `cursor_batch(cursor)`: a change stream reply's `cursor` document (its raw BSON: an aggregate's
/// or a getMore's) as (the cursor id, the batch's change events each as its own bytes, the
/// post-batch token's bytes or None). The batch (`nextBatch`, else `firstBatch`) is split by the
/// events' BSON sizes alone (`Walk`), so a read costs one bytes object per event, not pymongo's
/// RawBSONDocument (relay.mongo.cursor). ValueError names what the reply lacks.
#[pyfunction]
pub(crate) fn cursor_batch<'py>(py: Python<'py>, cursor: &[u8])
                               -> PyResult<(i64, Bound<'py, PyList>, Option<Bound<'py, PyBytes>>)> {
    let not_bson = || PyValueError::new_err("the change stream reply's cursor is not BSON");
    let (mut id, mut batch, mut token) = (None, None, None);
    for element in Walk::new(cursor).ok_or_else(not_bson)? {
        let e = element.map_err(|_| not_bson())?;
        match (e.key, e.kind) {
            (b"id", 0x12) => id = Some(i64::from_le_bytes(e.value.try_into().map_err(|_| not_bson())?)),
            (b"id", 0x10) => id = Some(i64::from(i32::from_le_bytes(e.value.try_into().map_err(|_| not_bson())?))),
            (b"nextBatch", 0x04) => batch = Some(e.value),
            (b"firstBatch", 0x04) if batch.is_none() => batch = Some(e.value),
            (b"postBatchResumeToken", 0x03) => token = Some(e.value),
            _ => {}
        }
    }
    let id = id.ok_or_else(|| PyValueError::new_err("the change stream reply's cursor has no id"))?;
    let changes = PyList::empty(py);
    if let Some(batch) = batch {
        for (i, element) in Walk::new(batch).ok_or_else(not_bson)?.enumerate() {
            match element {
                Ok(Element { kind: 0x03, value, .. }) => changes.append(PyBytes::new(py, value))?,
                _ => return Err(PyValueError::new_err(format!("change {i} of the reply is not a document"))),
            }
        }
    }
    Ok((id, changes, token.map(|t| PyBytes::new(py, t))))
}

impl ChangeReader {
    fn value<'py>(&self, py: Python<'py>, raw: &Raw<'_>, token: &[u8], document: &[u8])
                  -> PyResult<Bound<'py, PyAny>> {
        let (position, data) = self.position(py, token)?;
        let cluster_time = match raw.cluster_time.or_else(|| data.and_then(token_cluster_time)) {
            Some((time, inc)) => {
                named_tuple(self.cluster_time.bind(py), [PyInt::new(py, time).into_any(), PyInt::new(py, inc).into_any()])?
            }
            None => py.None().into_bound(py),
        };
        let document_bytes = PyBytes::new(py, document);
        let event_id = match own_id(document) {
            Some(id) => id.into_any(py),
            None => self.event_id.bind(py).call1((&document_bytes,))?.cast_into::<PyString>()?.into_any(),
        };
        let wall_ms = PyInt::new(py, raw.wall_ms).into_any();
        named_tuple(self.change.bind(py), [event_id, position, cluster_time, wall_ms, document_bytes.into_any()])
    }

    /// The token as a plain dict, and its `_data` (when it is a string).
    fn position<'py, 'a>(&self, py: Python<'py>, token: &'a [u8]) -> PyResult<(Bound<'py, PyAny>, Option<&'a str>)> {
        let mut data = None;
        let mut only_data = true;
        for element in Walk::new(token).into_iter().flatten() {
            match element {
                Ok(Element { kind: 0x02, key: b"_data", value }) if data.is_none() => data = string(value),
                _ => only_data = false,
            }
        }
        if let (true, Some(data)) = (only_data, data) {
            let dict = PyDict::new(py);
            dict.set_item(intern!(py, "_data"), data)?;
            return Ok((dict.into_any(), Some(data)));
        }
        Ok((self.token.bind(py).call1((PyBytes::new(py, token),))?, data))
    }
}

/// One pass over the change event's top-level fields (`Walk`; the bson crate where the walk does
/// not take the event, to say what is wrong with it).
fn scan(bytes: &[u8]) -> Result<Raw<'_>, String> {
    let mut raw = Raw { insert: false, token: None, cluster_time: None, wall_ms: -1, document: None, route: -1 };
    let Some(walk) = Walk::new(bytes) else { return checked_scan(bytes) };
    for element in walk {
        let Ok(e) = element else { return checked_scan(bytes) };
        match (e.key, e.kind) {
            (b"_id", 0x03) => raw.token = Some(e.value),
            (b"operationType", 0x02) => raw.insert = string(e.value) == Some("insert"),
            (b"clusterTime", 0x11) => raw.cluster_time = Some((u32_at(e.value, 4), u32_at(e.value, 0))),
            (b"wallTime", 0x09) => raw.wall_ms = i64::from_le_bytes(e.value.try_into().map_err(|_| "wallTime")?),
            (b"fullDocument", 0x03) => raw.document = Some(e.value),
            (b"r", 0x10) => raw.route = i64::from(i32::from_le_bytes(e.value.try_into().map_err(|_| "r")?)),
            (b"r", 0x12) => raw.route = i64::from_le_bytes(e.value.try_into().map_err(|_| "r")?),
            _ => {}
        }
    }
    Ok(raw)
}

/// `scan` by the bson crate: the same fields, or the crate's account of what is wrong.
fn checked_scan(bytes: &[u8]) -> Result<Raw<'_>, String> {
    let change = RawDocument::from_bytes(bytes).map_err(|e| format!("not BSON: {e}"))?;
    let mut raw = Raw { insert: false, token: None, cluster_time: None, wall_ms: -1, document: None, route: -1 };
    for element in change.iter() {
        let (key, value) = element.map_err(|e| e.to_string())?;
        match (key.as_str(), value) {
            ("_id", RawBsonRef::Document(token)) => raw.token = Some(token.as_bytes()),
            ("operationType", RawBsonRef::String(op)) => raw.insert = op == "insert",
            ("clusterTime", RawBsonRef::Timestamp(ts)) => raw.cluster_time = Some((ts.time, ts.increment)),
            ("wallTime", RawBsonRef::DateTime(dt)) => raw.wall_ms = dt.timestamp_millis(),
            ("fullDocument", RawBsonRef::Document(doc)) => raw.document = Some(doc.as_bytes()),
            ("r", RawBsonRef::Int32(r)) => raw.route = i64::from(r),
            ("r", RawBsonRef::Int64(r)) => raw.route = r,
            _ => {}
        }
    }
    Ok(raw)
}

/// One element of a BSON document as `Walk` sees it: its type byte, its key, its value's bytes.
struct Element<'a> {
    kind: u8,
    key: &'a [u8],
    value: &'a [u8],
}

/// The top-level elements of a BSON document, found by their sizes alone (no value is decoded or
/// checked). Yields Err, then stops, where the bytes do not hold a next element.
struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Walk<'a> {
    /// None unless `bytes` starts with its own length and ends with the document's NUL.
    fn new(bytes: &'a [u8]) -> Option<Self> {
        let length = usize::try_from(i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)).ok()?;
        (length == bytes.len() && length >= 5 && bytes[length - 1] == 0).then_some(Walk { bytes, at: 4 })
    }
}

impl<'a> Iterator for Walk<'a> {
    type Item = Result<Element<'a>, ()>;

    fn next(&mut self) -> Option<Self::Item> {
        let end = self.bytes.len() - 1; // the document's NUL
        if self.at >= end {
            return None;
        }
        let (kind, key_at) = (self.bytes[self.at], self.at + 1);
        let next = self.bytes[key_at..end].iter().position(|&b| b == 0).and_then(|key_length| {
            let value_at = key_at + key_length + 1;
            let size = value_size(kind, &self.bytes[value_at..end])?;
            let value = &self.bytes[value_at..value_at + size];
            Some((Element { kind, key: &self.bytes[key_at..value_at - 1], value }, value_at + size))
        });
        let Some((element, after)) = next else {
            self.at = end;
            return Some(Err(()));
        };
        self.at = after;
        Some(Ok(element))
    }
}

/// The size of a value of BSON type `kind` at the start of `rest` (the BSON specification's
/// element sizes); None for an unknown type or a size past `rest`.
fn value_size(kind: u8, rest: &[u8]) -> Option<usize> {
    let length = || usize::try_from(i32::from_le_bytes(rest.get(..4)?.try_into().ok()?)).ok();
    let c_string = |from: usize| Some(rest.get(from..)?.iter().position(|&b| b == 0)? + 1);
    let size = match kind {
        0x06 | 0x0A | 0x7F | 0xFF => 0,            // undefined, null, max key, min key
        0x08 => 1,                                  // boolean
        0x10 => 4,                                  // int32
        0x01 | 0x09 | 0x11 | 0x12 => 8,             // double, date, timestamp, int64
        0x07 => 12,                                 // ObjectId
        0x13 => 16,                                 // decimal128
        0x02 | 0x0D | 0x0E => 4 + length()?,        // string, code, symbol
        0x03 | 0x04 | 0x0F => length()?,            // document, array, code with scope
        0x05 => 5 + length()?,                      // binary: length, subtype, bytes
        0x0C => 4 + length()? + 12,                 // DBPointer: string, ObjectId
        0x0B => {                                   // regular expression: two C strings
            let pattern = c_string(0)?;
            pattern + c_string(pattern)?
        }
        _ => return None,
    };
    (size <= rest.len()).then_some(size)
}

/// A BSON string value's text (length, UTF-8 bytes, NUL); None if it is not one.
fn string(value: &[u8]) -> Option<&str> {
    match value.split_last() {
        Some((0, text)) if text.len() >= 4 => std::str::from_utf8(&text[4..]).ok(),
        _ => None,
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A named tuple of `class` holding `items`: what `class._make(items)` makes (tuple.__new__),
/// built as tuple.__new__ builds a tuple subclass (the type's allocation, then the items), without
/// a Python call per value. `class` is a named tuple with `N` fields (checked by ChangeReader::new).
fn named_tuple<'py, const N: usize>(class: &Bound<'py, PyType>, items: [Bound<'py, PyAny>; N])
                                    -> PyResult<Bound<'py, PyAny>> {
    let py = class.py();
    // SAFETY: `class` is a subclass of tuple (checked when the reader was made), so its instances
    // are tuples of N slots from PyType_GenericAlloc (NULL-filled, which the collector tolerates);
    // PyTuple_SetItem steals one reference to each item into a tuple only this function holds.
    unsafe {
        let tuple = ffi::PyType_GenericAlloc(class.as_type_ptr(), N as ffi::Py_ssize_t);
        let tuple = Bound::from_owned_ptr_or_err(py, tuple)?;
        for (i, item) in items.into_iter().enumerate() {
            if ffi::PyTuple_SetItem(tuple.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(tuple)
    }
}

enum Id<'a> {
    Hex([u8; 12]),
    Text(&'a str),
}

impl Id<'_> {
    fn into_any<'py>(self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            Id::Hex(oid) => PyString::new(py, &bson::oid::ObjectId::from_bytes(oid).to_hex()).into_any(),
            Id::Text(text) => PyString::new(py, text).into_any(),
        }
    }
}

/// The document's `_id` as event_id_of writes it, where that is plain: an ObjectId or a string,
/// appearing once. None leaves it to the Python reader (other types, no `_id`, a repeated key,
/// bytes the walk does not take).
fn own_id(document: &[u8]) -> Option<Id<'_>> {
    let mut id = None;
    for element in Walk::new(document)? {
        let e = element.ok()?;
        if e.key == b"_id" {
            if id.is_some() {
                return None; // repeated: Python's dict keeps the last one
            }
            id = Some(match e.kind {
                0x07 => Id::Hex(e.value.try_into().ok()?),
                0x02 => Id::Text(string(e.value)?),
                _ => return None,
            });
        }
    }
    id
}

/// relay.core.positions.token_cluster_time: "82", then the Timestamp's seconds and increment as
/// 8 hex digits each.
fn token_cluster_time(data: &str) -> Option<(u32, u32)> {
    if data.len() < 18 || !data.starts_with("82") || !data.is_char_boundary(18) {
        return None;
    }
    let hex = |s: &str| if s.bytes().all(|b| b.is_ascii_hexdigit()) { u32::from_str_radix(s, 16).ok() } else { None };
    Some((hex(&data[2..10])?, hex(&data[10..18])?))
}
