//! The payload document as relaxed Extended JSON, byte for byte as the Python path writes it.
//!
//! The Python path (`relay.avro.encoding.relaxed_json`) is `json.dumps(payload, default=json_util.default,
//! allow_nan=False)` over the document pymongo decoded: separators ", " and ": ", every character
//! outside ' '..'~' escaped (`ensure_ascii`), floats as Python's `repr`, and json_util's relaxed
//! forms for ObjectId, dates and binary. This module writes the same text for the BSON types below
//! and declines every other value (NaN and infinities, Decimal128, regular expressions, code,
//! timestamps, min/max keys, deprecated types, binary subtypes other than 0 and 4) and documents
//! with a repeated key (Python keeps the last value at the first position): the caller then uses the
//! Python path, so the text never depends on which path wrote it. The property tests in
//! tests/unit/test_native.py compare the two on random documents.

use base64::Engine;
use bson::spec::BinarySubtype;
use bson::{RawArray, RawBsonRef, RawDocument};
use std::fmt::Write;

/// The value holds something only the Python path writes exactly.
#[derive(Debug)]
pub struct Decline;

/// The last millisecond of year 9999: json_util writes dates up to it as ISO-8601 text.
pub const MAX_UTC_MS: i64 = 253_402_300_799_999;

pub fn write_document(out: &mut String, doc: &RawDocument) -> Result<(), Decline> {
    let mut keys: Vec<&str> = Vec::new();
    out.push('{');
    for (i, element) in doc.iter().enumerate() {
        let (key, value) = element.map_err(|_| Decline)?;
        let key = key.as_str();
        if keys.contains(&key) {
            return Err(Decline);
        }
        keys.push(key);
        if i > 0 {
            out.push_str(", ");
        }
        write_str(out, key);
        out.push_str(": ");
        write_value(out, value)?;
    }
    out.push('}');
    Ok(())
}

fn write_array(out: &mut String, array: &RawArray) -> Result<(), Decline> {
    out.push('[');
    for (i, value) in array.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_value(out, value.map_err(|_| Decline)?)?;
    }
    out.push(']');
    Ok(())
}

fn write_value(out: &mut String, value: RawBsonRef<'_>) -> Result<(), Decline> {
    match value {
        RawBsonRef::Double(f) if f.is_finite() => write_float(out, f),
        RawBsonRef::String(s) => write_str(out, s),
        RawBsonRef::Document(d) => write_document(out, d)?,
        RawBsonRef::Array(a) => write_array(out, a)?,
        RawBsonRef::Boolean(b) => out.push_str(if b { "true" } else { "false" }),
        RawBsonRef::Null => out.push_str("null"),
        RawBsonRef::Int32(n) => write!(out, "{n}").unwrap(),
        RawBsonRef::Int64(n) => write!(out, "{n}").unwrap(),
        RawBsonRef::ObjectId(oid) => {
            out.push_str("{\"$oid\": \"");
            out.push_str(&oid.to_hex());
            out.push_str("\"}");
        }
        RawBsonRef::DateTime(dt) => write_date(out, dt.timestamp_millis())?,
        RawBsonRef::Binary(b) => {
            let subtype = match b.subtype {
                BinarySubtype::Generic => "00",
                BinarySubtype::Uuid => "04",
                _ => return Err(Decline),
            };
            out.push_str("{\"$binary\": {\"base64\": \"");
            base64::engine::general_purpose::STANDARD.encode_string(b.bytes, out);
            out.push_str("\", \"subType\": \"");
            out.push_str(subtype);
            out.push_str("\"}}");
        }
        _ => return Err(Decline),
    }
    Ok(())
}

/// json_util's relaxed date: ISO-8601 from 1970 to 9999 ("Z", milliseconds only when not 0),
/// else the canonical `{"$numberLong": ...}` form.
fn write_date(out: &mut String, ms: i64) -> Result<(), Decline> {
    if (0..=MAX_UTC_MS).contains(&ms) {
        let t = crate::utc(ms).ok_or(Decline)?;
        write!(out, "{{\"$date\": \"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", t.year(), u8::from(t.month()), t.day(),
               t.hour(), t.minute(), t.second()).unwrap();
        let millis = ms.rem_euclid(1000);
        if millis != 0 {
            write!(out, ".{millis:03}").unwrap();
        }
        out.push_str("Z\"}");
    } else {
        write!(out, "{{\"$date\": {{\"$numberLong\": \"{ms}\"}}}}").unwrap();
    }
    Ok(())
}

/// A JSON string as Python's `json.dumps` writes it with `ensure_ascii`: the short escapes for
/// quote, backslash, \b \f \n \r \t; `\uXXXX` (lower-case hex, surrogate pairs above U+FFFF) for
/// every other character outside ' '..'~'.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    if needs_no_escape(s.as_bytes()) {
        out.push_str(s);
    } else {
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                ' '..='~' => out.push(c),
                _ => {
                    let n = c as u32;
                    if n < 0x10000 {
                        write!(out, "\\u{n:04x}").unwrap();
                    } else {
                        let n = n - 0x10000;
                        write!(out, "\\u{:04x}\\u{:04x}", 0xd800 | (n >> 10), 0xdc00 | (n & 0x3ff)).unwrap();
                    }
                }
            }
        }
    }
    out.push('"');
}

/// Every byte is in ' '..'~' and is neither a quote nor a backslash. Checked a block at a time with
/// no early exit inside a block (a byte at or above 0x80 is negative as an i8), which the compiler
/// turns into compares of many bytes at once: a 20 KB payload string took 246,000 instructions
/// with a test and a branch per byte, 18,600 this way (callgrind).
fn needs_no_escape(bytes: &[u8]) -> bool {
    bytes.chunks(256).all(|block| {
        !block.iter().fold(false, |bad, &b| bad | ((b as i8) < 0x20) | (b == 0x7f) | (b == b'"') | (b == b'\\'))
    })
}

/// A finite double as Python's `repr`: the shortest digits that read back to the same double (ryu
/// finds them, as Python's dtoa does), in fixed notation when the decimal exponent is from -4 to
/// 15 (with ".0" for integral values), else as d.ddde±XX.
pub fn write_float(out: &mut String, f: f64) {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(f);
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match body.find('e') {
        Some(i) => (&body[..i], body[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (body, 0),
    };
    let (whole, fraction) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    let all: String = [whole, fraction].concat();
    let trimmed = all.trim_start_matches('0');
    // Digits before the decimal point when the value is written as 0.ddd x 10^decpt ... that is,
    // Python's `decpt`: the value is d1.d2d3... x 10^(decpt - 1).
    let decpt = whole.len() as i32 + exponent - (all.len() - trimmed.len()) as i32;
    let digits = trimmed.trim_end_matches('0');
    if negative {
        out.push('-');
    }
    if digits.is_empty() {
        out.push_str("0.0");
        return;
    }
    let n = digits.len() as i32;
    if (-3..=16).contains(&decpt) {
        if decpt <= 0 {
            out.push_str("0.");
            for _ in 0..-decpt {
                out.push('0');
            }
            out.push_str(digits);
        } else if decpt >= n {
            out.push_str(digits);
            for _ in 0..decpt - n {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()).unwrap();
    }
}
