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

use bson::{RawBsonRef, RawDocument};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
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
    tuple_new: Py<PyAny>,
    event_id: Py<PyAny>,
    token: Py<PyAny>,
}

/// What one raw change event holds, borrowed from its bytes.
struct Raw<'a> {
    insert: bool,
    token: Option<&'a RawDocument>,
    cluster_time: Option<(u32, u32)>,
    wall_ms: i64,
    document: Option<&'a RawDocument>,
}

#[pymethods]
impl ChangeReader {
    /// `change`: relay.core.change.Change; `cluster_time`: relay.core.positions.ClusterTime;
    /// `event_id(document_bytes) -> str` and `token(token_bytes) -> dict`: the Python readers of
    /// what this one leaves to them.
    #[new]
    fn new(py: Python<'_>, change: Bound<'_, PyType>, cluster_time: Bound<'_, PyType>, event_id: Py<PyAny>,
           token: Py<PyAny>) -> PyResult<Self> {
        check_fields(&change, &CHANGE_FIELDS)?;
        check_fields(&cluster_time, &CLUSTER_TIME_FIELDS)?;
        let tuple_new = py.get_type::<PyTuple>().getattr(intern!(py, "__new__"))?.unbind();
        Ok(ChangeReader { change: change.unbind(), cluster_time: cluster_time.unbind(), tuple_new, event_id, token })
    }

    /// (the inserts before the first other change, as Change values; that change's index or -1).
    fn read<'py>(&self, py: Python<'py>, changes: &Bound<'py, PyList>) -> PyResult<(Bound<'py, PyList>, i64)> {
        let out = PyList::empty(py);
        for (i, change) in changes.iter().enumerate() {
            let raw = change.getattr(intern!(py, "raw"))
                .map_err(|_| PyTypeError::new_err(format!("change {i} has no raw BSON")))?;
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
            out.append(self.value(py, &fields).map_err(|e| match e {
                Problem::Python(err) => err,
                Problem::Shape(what) => PyValueError::new_err(format!("change {i}: {what}")),
            })?)?;
        }
        Ok((out, -1))
    }
}

enum Problem {
    Python(PyErr),
    Shape(&'static str),
}

impl From<PyErr> for Problem {
    fn from(err: PyErr) -> Self {
        Problem::Python(err)
    }
}

/// One pass over the change event's top-level fields.
fn scan(bytes: &[u8]) -> Result<Raw<'_>, String> {
    let change = RawDocument::from_bytes(bytes).map_err(|e| format!("not BSON: {e}"))?;
    let mut raw = Raw { insert: false, token: None, cluster_time: None, wall_ms: -1, document: None };
    for element in change.iter() {
        let (key, value) = element.map_err(|e| e.to_string())?;
        match (key.as_str(), value) {
            ("_id", RawBsonRef::Document(token)) => raw.token = Some(token),
            ("operationType", RawBsonRef::String(op)) => raw.insert = op == "insert",
            ("clusterTime", RawBsonRef::Timestamp(ts)) => raw.cluster_time = Some((ts.time, ts.increment)),
            ("wallTime", RawBsonRef::DateTime(dt)) => raw.wall_ms = dt.timestamp_millis(),
            ("fullDocument", RawBsonRef::Document(doc)) => raw.document = Some(doc),
            _ => {}
        }
    }
    Ok(raw)
}

impl ChangeReader {
    fn value<'py>(&self, py: Python<'py>, raw: &Raw<'_>) -> Result<Bound<'py, PyAny>, Problem> {
        let token = raw.token.ok_or(Problem::Shape("an insert without a resume token (_id)"))?;
        let document = raw.document.ok_or(Problem::Shape("an insert without fullDocument"))?;
        let (position, data) = self.position(py, token)?;
        let cluster_time = match raw.cluster_time.or_else(|| data.and_then(token_cluster_time)) {
            Some((time, inc)) => {
                self.tuple(py, &self.cluster_time, [PyInt::new(py, time).into_any(), PyInt::new(py, inc).into_any()])?
            }
            None => py.None().into_bound(py),
        };
        let document_bytes = PyBytes::new(py, document.as_bytes());
        let event_id = match own_id(document) {
            Some(id) => id.into_any(py),
            None => self.event_id.bind(py).call1((&document_bytes,))?.cast_into::<PyString>()
                .map_err(PyErr::from)?.into_any(),
        };
        let wall_ms = PyInt::new(py, raw.wall_ms).into_any();
        Ok(self.tuple(py, &self.change, [event_id, position, cluster_time, wall_ms, document_bytes.into_any()])?)
    }

    /// The token as a plain dict, and its `_data` when that is all it holds.
    fn position<'py, 'a>(&self, py: Python<'py>, token: &'a RawDocument)
                         -> PyResult<(Bound<'py, PyAny>, Option<&'a str>)> {
        let mut elements = token.iter();
        if let (Some(Ok((key, RawBsonRef::String(data)))), None) = (elements.next(), elements.next()) {
            if key.as_str() == "_data" {
                let dict = PyDict::new(py);
                dict.set_item(intern!(py, "_data"), data)?;
                return Ok((dict.into_any(), Some(data)));
            }
        }
        let decoded = self.token.bind(py).call1((PyBytes::new(py, token.as_bytes()),))?;
        let data = match token.get("_data") {
            Ok(Some(RawBsonRef::String(s))) => Some(s),
            _ => None,
        };
        Ok((decoded, data))
    }

    /// A named tuple of `class` holding `items`, made as its `_make` makes it (tuple.__new__).
    fn tuple<'py, const N: usize>(&self, py: Python<'py>, class: &Py<PyType>, items: [Bound<'py, PyAny>; N])
                                  -> PyResult<Bound<'py, PyAny>> {
        self.tuple_new.bind(py).call1((class.bind(py), PyTuple::new(py, items)?))
    }
}

enum Id<'a> {
    Hex(String),
    Text(&'a str),
}

impl Id<'_> {
    fn into_any<'py>(self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            Id::Hex(hex) => PyString::new(py, &hex).into_any(),
            Id::Text(text) => PyString::new(py, text).into_any(),
        }
    }
}

/// The document's `_id` as event_id_of writes it, where that is plain: an ObjectId or a string,
/// appearing once. None leaves it to the Python reader (other types, no `_id`, a repeated key,
/// a document this reader cannot walk).
fn own_id(document: &RawDocument) -> Option<Id<'_>> {
    let mut id = None;
    for element in document.iter() {
        let (key, value) = element.ok()?;
        if key.as_str() == "_id" {
            if id.is_some() {
                return None; // repeated: Python's dict keeps the last one
            }
            id = Some(match value {
                RawBsonRef::ObjectId(oid) => Id::Hex(oid.to_hex()),
                RawBsonRef::String(s) => Id::Text(s),
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
