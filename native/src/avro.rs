//! Avro's binary encoding of the two primitive types the generic envelope uses: a long is a
//! zigzag varint (the `integer-encoding` crate's `VarInt` for i64, the same encoding as Avro's);
//! a string is its byte length as a long, then its UTF-8 bytes. A record is its fields in schema
//! order, with nothing between them (Avro specification, "Binary Encoding").

use integer_encoding::VarInt;

pub fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut buf = [0u8; 10];
    let used = n.encode_var(&mut buf);
    out.extend_from_slice(&buf[..used]);
}

pub fn write_string(out: &mut Vec<u8>, s: &str) {
    write_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}
