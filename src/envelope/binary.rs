//! The binary layout's reader and its compression (LZ4 above [`COMPRESS_ABOVE`]): the part of
//! the envelope that reads bytes from Redis as untrusted input. The layout itself is
//! [`super::layout`]; the writer is `Envelope::encode_made_at`.

use super::*;

/// Values of at least this many bytes are stored LZ4-compressed when that saves an eighth or more
/// (`bench/redis-cost.js --large`: a 100 KB HTML page took about a quarter of the bytes in Redis
/// and read no slower). `STAMPEDE_CACHE_NO_COMPRESS=1` turns it off for a process (to measure).
pub const COMPRESS_ABOVE: usize = 16 * 1024;

fn compression_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("STAMPEDE_CACHE_NO_COMPRESS").is_none_or(|v| v != "1"))
}

/// `value` compressed (its length, 4 bytes, then an LZ4 block), if that pays (see
/// [`COMPRESS_ABOVE`]).
pub(super) fn compressed(value: &[u8]) -> Option<Vec<u8>> {
    if value.len() < COMPRESS_ABOVE || value.len() > u32::MAX as usize || !compression_on() {
        return None;
    }
    let c = lz4_flex::block::compress_prepend_size(value);
    (c.len() <= value.len() - value.len() / 8).then_some(c)
}

/// What [`compressed`] wrote, decompressed; `None` for anything else. The length it declares is
/// untrusted: it must be one LZ4 can reach from that many bytes (at most 255 times as many), so a
/// short reply cannot make a large allocation.
fn decompressed(b: &[u8]) -> Option<Vec<u8>> {
    let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
    if len > (b.len() - 4).saturating_mul(255) || len > 512 * 1024 * 1024 {
        return None;
    }
    let out = lz4_flex::block::decompress(&b[4..], len).ok()?;
    (out.len() == len).then_some(out)
}

/// Reads the binary layout (see [`layout`]); `None` for anything that does not hold together.
pub(super) fn decode_binary(b: &[u8]) -> Option<Decoded<'_>> {
    use layout::*;
    let made_at = match b.first() {
        Some(&MAGIC) => 0,
        Some(&MAGIC_TIMED) => u48(b, MADE_AT)?,
        _ => return None,
    };
    if b.len() < FIXED {
        return None;
    }
    let flags = b[1];
    let mark = u64::from_be_bytes(b[MARK..MARK + 8].try_into().ok()?);
    let compute_us = u32::from_be_bytes(b[COMPUTE..COMPUTE + 4].try_into().ok()?);
    let mut envelope = Envelope {
        fresh_until: u48(b, FRESH)? as f64,
        hard_until: u48(b, HARD)? as f64,
        compute_ms: f64::from(compute_us) / 1_000.0,
        negative: flags & NEGATIVE != 0,
        retry_after: 0.0,
        born: u48(b, BORN)?,
    };
    if envelope.hard_until < envelope.fresh_until {
        return None;
    }
    let mut at = if made_at > 0 { TIMED_FIXED } else { FIXED };
    if flags & RETRY != 0 {
        envelope.retry_after = u48(b, at)? as f64;
        at += 6;
    }
    let mut tags = Vec::new();
    if flags & TAGGED != 0 {
        let len = u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        tags = serde_json::from_slice(b.get(at..at.checked_add(len)?)?).ok()?;
        at += len;
    }
    let fmt = Fmt::from_code(u32::from(flags >> FMT_SHIFT));
    let marker = flags & MARKER != 0;
    let value: Cow<'_, str> = if flags & COMPRESSED != 0 {
        Cow::Owned(String::from_utf8(decompressed(&b[at..])?).ok()?)
    } else {
        Cow::Borrowed(std::str::from_utf8(&b[at..]).ok()?)
    };
    let undefined = flags & UNDEFINED != 0;
    let value_json = if marker || undefined {
        None
    } else if value.is_empty()
        || (fmt != Fmt::Json && !envelope.negative && !value.starts_with('"'))
    {
        // A value in another format is a JSON string (base64, or the serializer's text).
        return None;
    } else {
        Some(value)
    };
    Some(Decoded {
        envelope,
        generation: &b[GENERATION..GENERATION + 8],
        value_json,
        tags,
        fmt,
        key_mark: Some(KeyMark::Bits(mark)),
        marker,
        made_at,
    })
}
