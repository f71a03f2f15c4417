//! Typed payloads: a payload document (raw BSON) written as the Avro datum its schema declares,
//! by the BSON -> Avro mapping of relay/avro/mapping.py (schemas/README.md), in the bytes
//! fastavro writes for the datum that mapping gives.
//!
//! The schema arrives compiled by relay.avro.native_program into a flat list of nodes (records
//! refer to their fields, and may refer to themselves, by index). Writing a value either
//! succeeds, or fails with `Miss` (the Python mapping refuses this value for this type: a union
//! tries its next branch) or `Decline` (not handled here: the whole event goes to the Python
//! path, which also raises the poison error naming the field path). Anything not certain to
//! match the Python path exactly is a `Decline`.

use crate::avro::{write_long, write_string};
use bson::spec::BinarySubtype;
use bson::{RawArray, RawBsonRef, RawDocument};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Python's datetime range (years 1 to 9999) in milliseconds: outside, the Python path sees a
/// DatetimeMS and refuses it.
const DATE_RANGE: std::ops::RangeInclusive<i64> = crate::MIN_DATETIME_MS..=crate::MAX_DATETIME_MS;
const DAY_MS: i64 = 86_400_000;

pub enum Fail {
    Miss,
    Decline,
}

type Written = Result<(), Fail>;

/// What a record does for a field the payload lacks.
enum Missing {
    Refuse,       // required: no default, not nullable
    Decline,      // a default other than null: fastavro writes it; left to the Python path
    Null(i64),    // the union's null branch (nullable, or default null)
}

enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Enum(Vec<String>),
    Fixed(usize),
    Array(usize),
    Map(usize),
    Record(Vec<(String, usize, Missing)>),
    /// The null branch's index (or none), then each other branch: the index fastavro writes for
    /// it (the first branch of its name; None: left to the Python path) and its node.
    Union(Option<i64>, Vec<(Option<i64>, usize)>),
    Decimal { precision: u32, scale: u32, fixed: Option<usize> },
    Uuid,
    TimestampMillis,
    TimestampMicros,
    Date,
    Declined,
}

/// One node as relay.avro.native_program sends it: (kind, a, b, children, names, extra).
pub type NodeArg = (String, i64, i64, Vec<usize>, Vec<String>, Vec<i64>);

pub struct Program {
    nodes: Vec<Node>,
    root: usize,
}

impl Program {
    pub fn new(root: usize, nodes: Vec<NodeArg>) -> PyResult<Self> {
        let count = nodes.len();
        let bad = |what: &str| PyValueError::new_err(format!("typed payload program: {what}"));
        let mut out = Vec::with_capacity(count);
        for (kind, a, b, children, names, extra) in nodes {
            if children.iter().any(|&c| c >= count) {
                return Err(bad("a child index is out of range"));
            }
            let child = || children.first().copied().ok_or_else(|| bad("a container without its item node"));
            out.push(match kind.as_str() {
                "null" => Node::Null,
                "boolean" => Node::Boolean,
                "int" => Node::Int,
                "long" => Node::Long,
                "float" => Node::Float,
                "double" => Node::Double,
                "bytes" => Node::Bytes,
                "string" => Node::String,
                "enum" => Node::Enum(names),
                "fixed" => Node::Fixed(a as usize),
                "array" => Node::Array(child()?),
                "map" => Node::Map(child()?),
                "record" => {
                    if names.len() != children.len() || extra.len() != children.len() {
                        return Err(bad("a record's names, nodes and missing-field rules differ in length"));
                    }
                    let fields = names.into_iter().zip(children).zip(extra)
                        .map(|((name, node), missing)| (name, node, match missing {
                            -1 => Missing::Refuse,
                            k if k >= 0 => Missing::Null(k),
                            _ => Missing::Decline,
                        }))
                        .collect();
                    Node::Record(fields)
                }
                "union" => {
                    if extra.len() != children.len() {
                        return Err(bad("a union's write indexes and nodes differ in length"));
                    }
                    let branches = extra.into_iter().map(|i| if i >= 0 { Some(i) } else { None })
                        .zip(children).collect();
                    Node::Union(if a >= 0 { Some(a) } else { None }, branches)
                }
                "decimal" if (1..=38).contains(&a) && (0..=a).contains(&b) => Node::Decimal {
                    precision: a as u32,
                    scale: b as u32,
                    fixed: extra.first().and_then(|&s| if s > 0 { Some(s as usize) } else { None }),
                },
                "decimal" | "declined" => Node::Declined,
                "uuid" => Node::Uuid,
                "timestamp-millis" => Node::TimestampMillis,
                "timestamp-micros" => Node::TimestampMicros,
                "date" => Node::Date,
                other => return Err(bad(&format!("unknown node kind {other:?}"))),
            });
        }
        if root >= count {
            return Err(bad("the root index is out of range"));
        }
        Ok(Program { nodes: out, root })
    }

    /// The payload document as the Avro datum of the root type.
    pub fn write(&self, out: &mut Vec<u8>, payload: &RawDocument) -> Written {
        self.value(out, self.root, RawBsonRef::Document(payload))
    }

    fn value(&self, out: &mut Vec<u8>, node: usize, value: RawBsonRef<'_>) -> Written {
        use RawBsonRef as B;
        // BSON types the Python decoder turns into something another type would accept
        // (a symbol is a str, undefined is None): never decided here.
        if matches!(value, B::Symbol(_) | B::Undefined) {
            return Err(Fail::Decline);
        }
        match (&self.nodes[node], value) {
            (Node::Declined, _) => return Err(Fail::Decline),
            (Node::Null, B::Null) => {}
            (Node::Boolean, B::Boolean(b)) => out.push(b as u8),
            (_, B::Int32(n)) if !matches!(self.nodes[node], Node::Union(..)) => return self.integer(out, node, n as i64),
            (_, B::Int64(n)) if !matches!(self.nodes[node], Node::Union(..)) => return self.integer(out, node, n),
            (Node::Double, B::Double(f)) => out.extend_from_slice(&f.to_le_bytes()),
            (Node::Float, B::Double(f)) => write_float(out, f)?,
            (Node::Bytes, B::Binary(b)) if plain_binary(b.subtype) => {
                write_long(out, b.bytes.len() as i64);
                out.extend_from_slice(b.bytes);
            }
            (Node::String, B::String(s)) => write_string(out, s),
            (Node::String, B::ObjectId(oid)) => write_string(out, &oid.to_hex()),
            (Node::Enum(symbols), B::String(s)) => {
                let index = symbols.iter().position(|x| x == s).ok_or(Fail::Miss)?;
                write_long(out, index as i64);
            }
            (Node::Fixed(size), B::ObjectId(oid)) => fixed(out, &oid.bytes(), *size)?,
            (Node::Fixed(size), B::Binary(b)) if plain_binary(b.subtype) => fixed(out, b.bytes, *size)?,
            (Node::Array(item), B::Array(items)) => self.array(out, *item, items)?,
            (Node::Map(values), B::Document(d)) => self.map(out, *values, d)?,
            (Node::Record(fields), B::Document(d)) => self.record(out, fields, d)?,
            (Node::Union(null, branches), v) => return self.union(out, *null, branches, v),
            (Node::Decimal { .. }, B::Decimal128(d)) => {
                let (negative, coefficient, exponent) = decimal128(d.bytes())?;
                return self.decimal(out, node, negative, coefficient, exponent);
            }
            (Node::Uuid, B::Binary(b)) if b.subtype == BinarySubtype::Uuid && b.bytes.len() == 16 => {
                write_string(out, &uuid_text(b.bytes));
            }
            (Node::Uuid, B::String(s)) => write_string(out, &uuid_from_text(s)?),
            (Node::TimestampMillis | Node::TimestampMicros | Node::Date, B::DateTime(t)) => {
                let ms = t.timestamp_millis();
                if !DATE_RANGE.contains(&ms) {
                    return Err(Fail::Decline);
                }
                match self.nodes[node] {
                    Node::TimestampMillis => write_long(out, ms),
                    Node::TimestampMicros => write_long(out, ms * 1000),
                    _ if ms.rem_euclid(DAY_MS) == 0 => write_long(out, ms.div_euclid(DAY_MS)),
                    _ => return Err(Fail::Miss),
                }
            }
            // Binary of other subtypes (pymongo's Binary, a bytes subclass): not decided here.
            (_, B::Binary(b)) if !plain_binary(b.subtype) => return Err(Fail::Decline),
            _ => return Err(Fail::Miss),
        }
        Ok(())
    }

    /// An integer (BSON int32 or int64) for any node but a union: int, long, double, float or
    /// decimal take it by the mapping's rules, any other node refuses it.
    fn integer(&self, out: &mut Vec<u8>, node: usize, n: i64) -> Written {
        match self.nodes[node] {
            Node::Int if i32::try_from(n).is_ok() => write_long(out, n),
            Node::Int => return Err(Fail::Miss),
            Node::Long => write_long(out, n),
            Node::Double | Node::Float => {
                let f = n as f64;
                if f as i128 != n as i128 {
                    return Err(Fail::Miss); // not exact in a double
                }
                if matches!(self.nodes[node], Node::Double) {
                    out.extend_from_slice(&f.to_le_bytes());
                } else {
                    write_float(out, f)?;
                }
            }
            Node::Decimal { .. } => return self.decimal(out, node, n < 0, n.unsigned_abs() as u128, 0),
            _ => return Err(Fail::Miss),
        }
        Ok(())
    }

    fn array(&self, out: &mut Vec<u8>, item: usize, items: &RawArray) -> Written {
        let values: Vec<RawBsonRef<'_>> = items.into_iter().collect::<Result<_, _>>().map_err(|_| Fail::Decline)?;
        if !values.is_empty() {
            write_long(out, values.len() as i64);
            for v in values {
                self.value(out, item, v)?;
            }
        }
        write_long(out, 0);
        Ok(())
    }

    fn map(&self, out: &mut Vec<u8>, values: usize, doc: &RawDocument) -> Written {
        let entries = entries(doc)?;
        if !entries.is_empty() {
            write_long(out, entries.len() as i64);
            for (key, v) in entries {
                write_string(out, key);
                self.value(out, values, v)?;
            }
        }
        write_long(out, 0);
        Ok(())
    }

    fn record(&self, out: &mut Vec<u8>, fields: &[(String, usize, Missing)], doc: &RawDocument) -> Written {
        let entries = entries(doc)?;
        let mut present = 0;
        for (name, node, missing) in fields {
            match entries.iter().find(|(k, _)| k == name) {
                Some((_, v)) => {
                    present += 1;
                    self.value(out, *node, *v)?;
                }
                None => match missing {
                    Missing::Null(index) => write_long(out, *index),
                    Missing::Refuse => return Err(Fail::Miss),
                    Missing::Decline => return Err(Fail::Decline),
                },
            }
        }
        if present != entries.len() {
            return Err(Fail::Miss); // a field the record does not declare
        }
        Ok(())
    }

    /// Null takes the null branch; any other value the first branch, in schema order, that takes it.
    fn union(&self, out: &mut Vec<u8>, null: Option<i64>, branches: &[(Option<i64>, usize)],
             value: RawBsonRef<'_>) -> Written {
        if let RawBsonRef::Null = value {
            write_long(out, null.ok_or(Fail::Miss)?);
            return Ok(());
        }
        let mark = out.len();
        for (index, node) in branches {
            let Some(index) = index else { return Err(Fail::Decline) };
            write_long(out, *index);
            match self.value(out, *node, value) {
                Ok(()) => return Ok(()),
                Err(Fail::Miss) => out.truncate(mark),
                Err(Fail::Decline) => return Err(Fail::Decline),
            }
        }
        Err(Fail::Miss)
    }

    /// A decimal (sign, coefficient, exponent) at the node's scale, as fastavro writes the
    /// Decimal the Python mapping gives: exact only (no rounding), at most `precision` digits.
    fn decimal(&self, out: &mut Vec<u8>, node: usize, negative: bool, coefficient: u128, exponent: i32) -> Written {
        let Node::Decimal { precision, scale, fixed } = self.nodes[node] else { return Err(Fail::Decline) };
        let shift = exponent as i64 + scale as i64;
        let unscaled = if shift >= 0 {
            // More than 38 digits cannot fit the precision (at most 38 here).
            10u128.checked_pow(shift as u32).and_then(|p| coefficient.checked_mul(p)).ok_or(Fail::Miss)?
        } else if -shift > 38 {
            if coefficient != 0 {
                return Err(Fail::Miss); // places beyond the scale
            }
            0
        } else {
            let p = 10u128.pow((-shift) as u32);
            if coefficient % p != 0 {
                return Err(Fail::Miss);
            }
            coefficient / p
        };
        if digits(unscaled) > precision {
            return Err(Fail::Miss);
        }
        let bits = 128 - unscaled.leading_zeros() as usize;
        let signed = if negative { -(unscaled as i128) } else { unscaled as i128 };
        let be = signed.to_be_bytes();
        match fixed {
            Some(size) => {
                if bits >= 8 * size {
                    return Err(Fail::Miss);
                }
                let fill = if signed < 0 { 0xFF } else { 0x00 };
                let keep = size.min(16);
                out.extend(std::iter::repeat_n(fill, size - keep));
                out.extend_from_slice(&be[16 - keep..]);
            }
            None => {
                // fastavro: (bit_length + 8) // 8 bytes of the magnitude, two's complement.
                let n = bits / 8 + 1;
                write_long(out, n as i64);
                out.extend_from_slice(&be[16 - n..]);
            }
        }
        Ok(())
    }
}

/// The entries of a document, in order; a repeated key (the Python dict keeps the last value) or
/// a `$` key (the Python decoder may turn the document into a DBRef) is not decided here.
fn entries(doc: &RawDocument) -> Result<Vec<(&str, RawBsonRef<'_>)>, Fail> {
    let mut out: Vec<(&str, RawBsonRef<'_>)> = Vec::with_capacity(8);
    for element in doc.iter() {
        let (key, value) = element.map_err(|_| Fail::Decline)?;
        let key = key.as_str();
        if key.starts_with('$') || out.iter().any(|(k, _)| *k == key) {
            return Err(Fail::Decline);
        }
        out.push((key, value));
    }
    Ok(out)
}

/// Binary the Python decoder gives as `bytes` or `Binary` of subtype 4 (both written as their data).
fn plain_binary(subtype: BinarySubtype) -> bool {
    matches!(subtype, BinarySubtype::Generic | BinarySubtype::Uuid)
}

fn fixed(out: &mut Vec<u8>, data: &[u8], size: usize) -> Written {
    if data.len() != size {
        return Err(Fail::Miss);
    }
    out.extend_from_slice(data);
    Ok(())
}

/// A float node: exact in 32 bits only (infinities too); NaN is left to the Python path.
fn write_float(out: &mut Vec<u8>, f: f64) -> Written {
    if f.is_nan() {
        return Err(Fail::Decline);
    }
    let single = f as f32;
    if single as f64 != f {
        return Err(Fail::Miss);
    }
    out.extend_from_slice(&single.to_le_bytes());
    Ok(())
}

fn digits(n: u128) -> u32 {
    if n == 0 { 1 } else { n.ilog10() + 1 }
}

/// A Decimal128 (IEEE 754-2008 decimal, binary integer significand, as BSON stores it) as
/// (negative, coefficient, exponent), read as pymongo's `Decimal128.to_decimal` reads it. NaN and
/// infinities are refused (no Avro decimal holds them); a non-canonical significand (above
/// 10^34 - 1, which pymongo rounds) is not decided here.
fn decimal128(bytes: [u8; 16]) -> Result<(bool, u128, i32), Fail> {
    const BIAS: i64 = 6176;
    let raw = u128::from_le_bytes(bytes);
    let high = (raw >> 64) as u64;
    let negative = high >> 63 == 1;
    if high & 0x7800_0000_0000_0000 == 0x7800_0000_0000_0000 {
        return Err(Fail::Miss); // NaN or an infinity
    }
    if high & 0x6000_0000_0000_0000 == 0x6000_0000_0000_0000 {
        // The significand would start with 100: above 10^34 - 1, so zero; pymongo reads it so too.
        let exponent = ((high & 0x1FFF_E000_0000_0000) >> 47) as i64 - BIAS;
        return Ok((negative, 0, exponent as i32));
    }
    let exponent = ((high & 0x7FFF_8000_0000_0000) >> 49) as i64 - BIAS;
    let coefficient = raw & ((1u128 << 113) - 1);
    if coefficient >= 10u128.pow(34) {
        return Err(Fail::Decline);
    }
    Ok((negative, coefficient, exponent as i32))
}

fn uuid_text(b: &[u8]) -> String {
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from_digit((byte >> 4) as u32, 16).unwrap());
        s.push(char::from_digit((byte & 0xF) as u32, 16).unwrap());
    }
    s
}

/// A UUID given as text, read as Python's `uuid.UUID(text)` reads it ("urn:" and "uuid:"
/// removed, braces stripped from both ends, hyphens removed, then 32 hexadecimal digits), in
/// canonical form. Text that is not 32 characters then is refused; 32 characters that are not
/// all hexadecimal digits (Python's `int(text, 16)` also takes some of those) are not decided here.
fn uuid_from_text(text: &str) -> Result<String, Fail> {
    let text = text.replace("urn:", "").replace("uuid:", "");
    let hex = text.trim_matches(|c| c == '{' || c == '}').replace('-', "");
    if hex.chars().count() != 32 {
        return Err(Fail::Miss);
    }
    if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(Fail::Decline);
    }
    let hex = hex.to_ascii_lowercase();
    Ok([&hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]].join("-"))
}
