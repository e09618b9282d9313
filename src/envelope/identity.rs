//! A write's identity as the binary header holds it: the key's mark (bytes 2..10), then born,
//! freshUntil, hardUntil and computeMs (bytes 18..40). Every write makes new ones, so these
//! bytes tell one write of a key from another (the generation, 10..18, is left out: a load's
//! write-back and `expire` redraw it under an entry this instance may still hold as it was).
//! [`super::same_write`] compares a header with it here; a replayed set hands it to
//! `write.lua`, which compares the same bytes of what the key holds (see `envelope.lua`,
//! `envelope_as_expected`), so the Rust and Lua sides agree by construction.

use super::layout::{compute_us, ms, BORN, FIXED, MARK, MAX_U48};
use super::{key_mark_bits, Envelope};

/// Bytes in a write's identity: the key's mark (8), then the header's bytes from born to the
/// end of the fixed header (22).
pub const IDENTITY_BYTES: usize = 8 + (FIXED - BORN);

/// The identity of the write `held` was read or written with, at `value_key`: the bytes its
/// binary header holds at 2..10 and 18..40, as the encoder writes them.
pub fn write_identity(held: &Envelope, value_key: &str) -> [u8; IDENTITY_BYTES] {
    let mut out = [0u8; IDENTITY_BYTES];
    out[..8].copy_from_slice(&key_mark_bits(value_key).to_be_bytes());
    let times = [
        held.born.min(MAX_U48),
        ms(held.fresh_until.round()),
        ms(held.hard_until.round()),
    ];
    for (i, t) in times.into_iter().enumerate() {
        out[8 + i * 6..14 + i * 6].copy_from_slice(&t.to_be_bytes()[2..]);
    }
    out[26..].copy_from_slice(&compute_us(held.compute_ms).to_be_bytes());
    out
}

/// The identity a binary header (its first [`FIXED`] bytes or more) holds; `None` when too
/// short. The caller checks the first byte and the flags.
pub fn header_identity(header: &[u8]) -> Option<[u8; IDENTITY_BYTES]> {
    let header = header.get(..FIXED)?;
    let mut out = [0u8; IDENTITY_BYTES];
    out[..8].copy_from_slice(&header[MARK..MARK + 8]);
    out[8..].copy_from_slice(&header[BORN..FIXED]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    #[test]
    fn a_writes_identity_is_the_bytes_its_header_holds_and_another_writes_differ() {
        let e = Envelope {
            fresh_until: 1_796_000_000_123.4,
            hard_until: 1_796_000_600_123.0,
            compute_ms: 1.0856600000000185,
            negative: false,
            retry_after: 0.0,
            born: 42,
        };
        let tags = ["t".to_string()];
        let body = Body {
            value_json: Some("\"v\""),
            tags: &tags,
            fmt: Fmt::Json,
        };
        let key = "ns:v:{k}";
        let g = new_generation();
        for bytes in [
            e.encode(&body, &g, key),
            e.encode_made_at(&body, &g, key, 1_796_000_000_000),
        ] {
            let id = write_identity(&e, key);
            assert_eq!(header_identity(&bytes), Some(id));
            assert_eq!(&id[..8], &bytes[2..10]);
            assert_eq!(&id[8..], &bytes[18..40], "what write.lua compares");
            assert_eq!(header_identity(&bytes[..39]), None, "too short");
            assert_ne!(write_identity(&e, "ns:v:{other}"), id);
            assert_ne!(write_identity(&Envelope { born: 43, ..e }, key), id);
            let later = Envelope {
                hard_until: e.hard_until + 1.0,
                ..e
            };
            assert_ne!(write_identity(&later, key), id);
        }
    }
}
