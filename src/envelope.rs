//! The envelope around a cached value: when it stops being fresh (soft TTL), when it is gone
//! (hard TTL), how long it took to compute (for XFetch), whether it is a not-found marker, until
//! when a failed refresh holds further refreshes back (errorBackoff), and the namespace clock it
//! was born at (a `clear` or `deleteByTag` at a later clock makes it dead, see `inbox.rs`).
//!
//! In Redis they travel as a fixed-width binary header (see [`layout`]) followed by the value's
//! serialized bytes as they are; envelopes written by earlier versions as JSON
//! (`{"sc":1,...}`) stay readable. `decode` treats anything it did not write as a miss.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

mod binary;
mod identity;
pub use binary::COMPRESS_ABOVE;
use binary::{compressed, decode_binary};
pub use identity::{write_identity, IDENTITY_BYTES};

/// Where an entry is in its life at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Before `fresh_until`: served as is.
    Fresh,
    /// Between `fresh_until` and `hard_until`: served at once while one worker refreshes.
    Stale,
    /// At or after `hard_until`: as good as absent.
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Envelope {
    /// Epoch ms until which the entry is fresh.
    pub fresh_until: f64,
    /// Epoch ms at which the entry is gone, stale included.
    pub hard_until: f64,
    /// How long the loader took, in ms; XFetch refreshes slow values earlier.
    pub compute_ms: f64,
    /// A cached "not found" (the loader returned null or undefined).
    pub negative: bool,
    /// Epoch ms before which no refresh may start (set after a failed refresh); 0 for none.
    pub retry_after: f64,
    /// The namespace clock when the load that made it began (or the set that wrote it): a
    /// `clear`, or a `deleteByTag` of one of its tags, at a later clock makes the entry dead.
    pub born: u64,
}

/// What a cache's serializer reads: an envelope written by another serializer is a miss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Serializer {
    #[default]
    Json,
    V8,
    Custom,
}

impl Serializer {
    pub fn parse(name: &str) -> Option<Serializer> {
        match name {
            "json" => Some(Serializer::Json),
            "v8" => Some(Serializer::V8),
            "custom" => Some(Serializer::Custom),
            _ => None,
        }
    }

    /// Whether an envelope whose value is in `fmt` is this serializer's.
    pub fn reads(self, fmt: Fmt) -> bool {
        matches!(
            (self, fmt),
            (Serializer::Json, Fmt::Json)
                | (Serializer::V8, Fmt::V8)
                | (Serializer::Custom, Fmt::Text | Fmt::Bytes)
        )
    }
}

/// How the value inside an envelope is written. `Json`: the value's JSON itself (no marker, as
/// before serializers existed). The others are JSON strings: `V8` base64 of node:v8 bytes,
/// `Text` a custom serializer's string, `Bytes` base64 of a custom serializer's bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Fmt {
    #[default]
    Json,
    V8,
    Text,
    Bytes,
}

impl Fmt {
    /// The facade's code for it (0 json, 1 v8, 2 custom string, 3 custom bytes).
    pub fn from_code(code: u32) -> Fmt {
        match code {
            1 => Fmt::V8,
            2 => Fmt::Text,
            3 => Fmt::Bytes,
            _ => Fmt::Json,
        }
    }

    pub const fn code(self) -> u32 {
        match self {
            Fmt::Json => 0,
            Fmt::V8 => 1,
            Fmt::Text => 2,
            Fmt::Bytes => 3,
        }
    }

    fn marker(self) -> Option<&'static str> {
        match self {
            Fmt::Json => None,
            Fmt::V8 => Some("v8"),
            Fmt::Text => Some("custom"),
            Fmt::Bytes => Some("custom-b64"),
        }
    }

    fn from_marker(marker: Option<&str>) -> Option<Fmt> {
        match marker {
            None | Some("json") => Some(Fmt::Json),
            Some("v8") => Some(Fmt::V8),
            Some("custom") => Some(Fmt::Text),
            Some("custom-b64") => Some(Fmt::Bytes),
            Some(_) => None,
        }
    }
}

/// What an envelope carries besides its times: the value as written (`None`: `undefined`), the
/// entry's tags, and the value's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Body<'a> {
    pub value_json: Option<&'a str>,
    pub tags: &'a [String],
    pub fmt: Fmt,
}

impl<'a> Body<'a> {
    /// A JSON value without tags.
    pub fn json(value_json: Option<&'a str>) -> Self {
        Body {
            value_json,
            tags: &[],
            fmt: Fmt::Json,
        }
    }
}

impl Envelope {
    /// An entry written at `now` that stays fresh for `ttl` ms and lives `hard_ttl` ms in all.
    /// Both ends are whole milliseconds (jittered TTLs are not), like `Date.now()`.
    pub fn new(now: f64, ttl: f64, hard_ttl: f64, compute_ms: f64, negative: bool) -> Self {
        Envelope {
            fresh_until: (now + ttl).round(),
            hard_until: (now + hard_ttl.max(ttl)).round(),
            compute_ms: compute_ms.max(0.0),
            negative,
            retry_after: 0.0,
            born: 0,
        }
    }

    /// The same envelope, born at `born` (see the field).
    pub fn born_at(mut self, born: u64) -> Self {
        self.born = born;
        self
    }

    #[inline]
    pub fn state(&self, now: f64) -> State {
        if now < self.fresh_until {
            State::Fresh
        } else if now < self.hard_until {
            State::Stale
        } else {
            State::Expired
        }
    }

    /// A refresh may start: no error backoff is in force.
    #[inline]
    pub fn refresh_allowed(&self, now: f64) -> bool {
        now >= self.retry_after
    }

    /// A caller served this entry, stale, should start its refresh: past fresh, and no error
    /// backoff in force.
    pub fn refresh_due(&self, now: f64) -> bool {
        now >= self.fresh_until && self.refresh_allowed(now)
    }

    /// Milliseconds the entry has left to live at `now`, rounded up, at least 1 (a Redis PX).
    pub fn remaining_ms(&self, now: f64) -> u64 {
        (self.hard_until - now).ceil().max(1.0) as u64
    }

    /// The JSON layout earlier versions wrote to Redis (still read by [`Envelope::decode`]; tests
    /// write it to check that). `body.value_json` is the value already serialized by the
    /// caller, embedded as is, so it is never re-serialized. `generation` (alphanumeric) names
    /// this write; it comes first, then `born`, where the Lua scripts read them without parsing
    /// the JSON (a load began from another generation is not written back; `clear` sweeps
    /// entries born before it).
    ///
    /// `value_key` is the Redis key it is written to: the envelope names it (`kh`, its
    /// [`key_mark`]), right after `born`, so a reader can tell a reply meant for another key
    /// (a desynchronized connection, a buggy proxy) from its own.
    #[cfg(test)]
    pub fn encode_json(&self, body: &Body<'_>, generation: &str, value_key: &str) -> String {
        debug_assert!(generation.bytes().all(|b| b.is_ascii_alphanumeric()));
        let value = body.value_json.unwrap_or("null");
        let mut out = String::with_capacity(value.len() + 180);
        out.push_str("{\"sc\":1,\"gen\":\"");
        out.push_str(generation);
        out.push_str("\",\"born\":");
        push_number(&mut out, self.born as f64);
        out.push_str(",\"kh\":\"");
        // Hex digits only: ASCII.
        out.push_str(std::str::from_utf8(&key_mark(value_key)).unwrap_or_default());
        out.push('"');
        out.push_str(",\"freshUntil\":");
        push_number(&mut out, self.fresh_until);
        out.push_str(",\"hardUntil\":");
        push_number(&mut out, self.hard_until);
        out.push_str(",\"computeMs\":");
        push_number(&mut out, self.compute_ms);
        out.push_str(",\"retryAfter\":");
        push_number(&mut out, self.retry_after);
        if self.negative {
            out.push_str(",\"negative\":true");
        }
        if body.value_json.is_none() {
            out.push_str(",\"undefined\":true");
        }
        if !body.tags.is_empty() {
            out.push_str(",\"tags\":");
            // Strings only: serializing them cannot fail.
            out.push_str(&serde_json::to_string(body.tags).unwrap_or_else(|_| "[]".into()));
        }
        if let Some(marker) = body.fmt.marker() {
            out.push_str(",\"fmt\":\"");
            out.push_str(marker);
            out.push('"');
        }
        // The value goes last, as given: never re-serialized.
        out.push_str(",\"value\":");
        out.push_str(value);
        out.push('}');
        out
    }

    /// Reads what [`Envelope::encode`] wrote. Anything else (other JSON, another format version,
    /// nonsense numbers) is `None`: a miss, never an error.
    ///
    /// What `encode` wrote ends with `,"value":<value>}`, and that sequence cannot occur earlier
    /// (a `"` inside the metadata's strings is escaped): only the metadata before it is parsed,
    /// and the value is taken as written, not scanned, since its reader parses it anyway (a value
    /// that is not JSON is then unreadable there: a miss, as here). Scanning a 10 KB value for
    /// escapes was the largest cost of a Redis read in the binding. Any other layout is parsed
    /// whole.
    pub fn decode_json(text: &str) -> Option<Decoded<'_>> {
        Self::decode_written(text).or_else(|| Self::decode_any(text))
    }

    /// What Redis holds for a key: the binary layout (see [`layout`]) or the JSON one earlier
    /// versions wrote (`decode_json`). Anything else is `None`: a miss, never an error.
    pub fn decode(bytes: &[u8]) -> Option<Decoded<'_>> {
        match bytes.first() {
            Some(&(layout::MAGIC | layout::MAGIC_TIMED)) => decode_binary(bytes),
            Some(b'{') => Self::decode_json(std::str::from_utf8(bytes).ok()?),
            _ => None,
        }
    }

    /// The bytes written to Redis for `value_key`: the header (see [`layout`]), the tags if
    /// any, then `body.value_json` as given (never re-serialized). `generation` names this write
    /// (the scripts compare it to fence loads).
    pub fn encode(&self, body: &Body<'_>, generation: &Generation, value_key: &str) -> Vec<u8> {
        self.encode_made_at(body, generation, value_key, 0)
    }

    /// [`Envelope::encode`] for a change made at `made_at` (epoch ms; 0 for none, as a load's
    /// result): a `set`'s envelope carries the time, so a replayed change older than it is
    /// refused (`write.lua`).
    pub fn encode_made_at(
        &self,
        body: &Body<'_>,
        generation: &Generation,
        value_key: &str,
        made_at: u64,
    ) -> Vec<u8> {
        let value = body.value_json.unwrap_or("");
        let mut out = Vec::with_capacity(layout::FIXED + 6 + value.len());
        let mut flags = (body.fmt.code() as u8) << layout::FMT_SHIFT;
        if self.negative {
            flags |= layout::NEGATIVE;
        }
        if body.value_json.is_none() {
            flags |= layout::UNDEFINED;
        }
        if !body.tags.is_empty() {
            flags |= layout::TAGGED;
        }
        let compressed = compressed(value.as_bytes());
        if compressed.is_some() {
            flags |= layout::COMPRESSED;
        }
        let retry = layout::ms(self.retry_after.ceil());
        if retry > 0 {
            flags |= layout::RETRY;
        }
        self.push_head(&mut out, flags, generation, value_key, made_at);
        if retry > 0 {
            out.extend_from_slice(&retry.to_be_bytes()[2..]);
        }
        if !body.tags.is_empty() {
            // Strings only: serializing them cannot fail.
            let tags = serde_json::to_vec(body.tags).unwrap_or_else(|_| b"[]".to_vec());
            out.extend_from_slice(&(tags.len() as u32).to_be_bytes());
            out.extend_from_slice(&tags);
        }
        match compressed {
            Some(c) => out.extend_from_slice(&c),
            None => out.extend_from_slice(value.as_bytes()),
        }
        out
    }

    /// A marker: a header with no value, holding a key's generation while a load that began
    /// with the key absent runs (see `fence.lua`). Read, it is a miss.
    pub fn encode_marker(&self, generation: &Generation, value_key: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(layout::FIXED);
        self.push_head(&mut out, layout::MARKER, generation, value_key, 0);
        out
    }

    /// The header: `made_at` > 0 selects the timed layout (see [`layout`]).
    fn push_head(
        &self,
        out: &mut Vec<u8>,
        flags: u8,
        generation: &Generation,
        value_key: &str,
        made_at: u64,
    ) {
        let made_at = made_at.min(layout::MAX_U48);
        out.push(if made_at > 0 {
            layout::MAGIC_TIMED
        } else {
            layout::MAGIC
        });
        out.push(flags);
        out.extend_from_slice(&key_mark_bits(value_key).to_be_bytes());
        out.extend_from_slice(generation);
        out.extend_from_slice(&self.born.min(layout::MAX_U48).to_be_bytes()[2..]);
        out.extend_from_slice(&layout::ms(self.fresh_until.round()).to_be_bytes()[2..]);
        out.extend_from_slice(&layout::ms(self.hard_until.round()).to_be_bytes()[2..]);
        out.extend_from_slice(&layout::compute_us(self.compute_ms).to_be_bytes());
        if made_at > 0 {
            out.extend_from_slice(&made_at.to_be_bytes()[2..]);
        }
    }

    /// Reads the layout `encode` writes without tags, in one pass over the metadata with no
    /// copy: keys in any order, each once, no whitespace, strings without escapes, numbers as
    /// JSON writes them. `None` for anything else, which `decode_any` then reads (or refuses):
    /// this never accepts what it would refuse, nor reads a field differently. serde_json's
    /// parse of the metadata was a third of the binding's time on a sequential Redis read.
    fn decode_written(text: &str) -> Option<Decoded<'_>> {
        const SC: u16 = 1;
        const GEN: u16 = 1 << 1;
        const BORN: u16 = 1 << 2;
        const FRESH: u16 = 1 << 3;
        const HARD: u16 = 1 << 4;
        const COMPUTE: u16 = 1 << 5;
        const RETRY: u16 = 1 << 6;
        const NEGATIVE: u16 = 1 << 7;
        const UNDEFINED: u16 = 1 << 8;
        const FMT: u16 = 1 << 9;
        const KH: u16 = 1 << 10;
        const REQUIRED: u16 = SC | FRESH | HARD | COMPUTE;
        let b = text.as_bytes();
        if b.first() != Some(&b'{') || b.last() != Some(&b'}') {
            return None;
        }
        let mut head = Head {
            sc: 0,
            gen: "",
            born: 0,
            fresh_until: 0.0,
            hard_until: 0.0,
            compute_ms: 0.0,
            retry_after: 0.0,
            negative: false,
            undefined: false,
            tags: Vec::new(),
            fmt: None,
            kh: None,
        };
        let mut seen = 0u16;
        let mut at = 1;
        loop {
            let (key, after) = plain_string(text, at)?;
            if b.get(after) != Some(&b':') {
                return None;
            }
            at = after + 1;
            if key == "value" {
                if seen & REQUIRED != REQUIRED {
                    return None;
                }
                return Self::decoded(head, &text[at..text.len() - 1]);
            }
            let field = match key {
                "sc" => SC,
                "gen" => GEN,
                "born" => BORN,
                "freshUntil" => FRESH,
                "hardUntil" => HARD,
                "computeMs" => COMPUTE,
                "retryAfter" => RETRY,
                "negative" => NEGATIVE,
                "undefined" => UNDEFINED,
                "fmt" => FMT,
                "kh" => KH,
                // Tags, or a key this layout does not have.
                _ => return None,
            };
            if seen & field != 0 {
                return None;
            }
            seen |= field;
            at = match field {
                SC => {
                    let (n, next) = whole_number(b, at)?;
                    head.sc = u32::try_from(n).ok()?;
                    next
                }
                BORN => {
                    let (n, next) = whole_number(b, at)?;
                    head.born = n;
                    next
                }
                GEN | FMT | KH => {
                    let (s, next) = plain_string(text, at)?;
                    match field {
                        GEN => head.gen = s,
                        FMT => head.fmt = Some(s),
                        _ => head.kh = Some(s),
                    }
                    next
                }
                NEGATIVE | UNDEFINED => {
                    let (v, next) = if b[at..].starts_with(b"true") {
                        (true, at + 4)
                    } else if b[at..].starts_with(b"false") {
                        (false, at + 5)
                    } else {
                        return None;
                    };
                    if field == NEGATIVE {
                        head.negative = v;
                    } else {
                        head.undefined = v;
                    }
                    next
                }
                _ => {
                    let (n, next) = json_number(text, at)?;
                    match field {
                        FRESH => head.fresh_until = n,
                        HARD => head.hard_until = n,
                        COMPUTE => head.compute_ms = n,
                        _ => head.retry_after = n,
                    }
                    next
                }
            };
            if b.get(at) != Some(&b',') {
                return None;
            }
            at += 1;
        }
    }

    /// Any JSON layout of the envelope (another writer's, or ours with tags).
    fn decode_any(text: &str) -> Option<Decoded<'_>> {
        const VALUE_KEY: &[u8] = b",\"value\":";
        // A plain scan: the key sits a hundred bytes or so in, past the metadata.
        let found = text
            .as_bytes()
            .windows(VALUE_KEY.len())
            .position(|w| w == VALUE_KEY);
        if let Some(at) = found {
            if let Some(rest) = text.strip_suffix('}') {
                if let Some(head) = Self::decode_head(&text[..at]) {
                    let value = rest.get(at + VALUE_KEY.len()..)?;
                    return Self::decoded(head, value);
                }
            }
        }
        let wire: Wire<'_> = serde_json::from_str(text).ok()?;
        Self::decoded(wire.head, wire.value?.get())
    }

    /// The metadata of an envelope whose value was cut off at `,"value":`.
    fn decode_head(head: &str) -> Option<Head<'_>> {
        let mut closed = String::with_capacity(head.len() + 1);
        closed.push_str(head);
        closed.push('}');
        // Parsed from a copy; the strings kept (`gen`, `fmt`) are taken again from `head`, at
        // the same offset (the copy is `head` and one more byte).
        let p: Head<'_> = serde_json::from_str(&closed).ok()?;
        let gen = match p.gen {
            "" => "",
            g => {
                let at = g.as_ptr() as usize - closed.as_ptr() as usize;
                head.get(at..at + g.len())?
            }
        };
        let fmt = match p.fmt {
            None => None,
            Some(f) => Some(Fmt::from_marker(Some(f))?.marker().unwrap_or("json")),
        };
        let kh = match p.kh {
            None => None,
            Some(k) => {
                let at = k.as_ptr() as usize - closed.as_ptr() as usize;
                Some(head.get(at..at + k.len())?)
            }
        };
        Some(Head {
            sc: p.sc,
            gen,
            born: p.born,
            fresh_until: p.fresh_until,
            hard_until: p.hard_until,
            compute_ms: p.compute_ms,
            retry_after: p.retry_after,
            negative: p.negative,
            undefined: p.undefined,
            tags: p.tags,
            fmt,
            kh,
        })
    }

    fn decoded<'a>(head: Head<'a>, value: &'a str) -> Option<Decoded<'a>> {
        let sane = head.sc == 1
            && head.fresh_until.is_finite()
            && head.hard_until.is_finite()
            && head.compute_ms.is_finite()
            && head.retry_after.is_finite()
            && head.hard_until >= head.fresh_until
            && head.compute_ms >= 0.0
            && !value.is_empty();
        if !sane {
            return None;
        }
        let fmt = Fmt::from_marker(head.fmt)?;
        // A value in another format must be a JSON string (base64, or the serializer's text).
        if fmt != Fmt::Json && !head.undefined && !head.negative && !value.starts_with('"') {
            return None;
        }
        Some(Decoded {
            generation: head.gen.as_bytes(),
            envelope: Envelope {
                fresh_until: head.fresh_until,
                hard_until: head.hard_until,
                compute_ms: head.compute_ms,
                negative: head.negative,
                retry_after: head.retry_after,
                born: head.born,
            },
            value_json: if head.undefined {
                None
            } else {
                Some(Cow::Borrowed(value))
            },
            tags: head.tags,
            fmt,
            // A mark that is not 16 hex digits (garbled) names no key of ours.
            key_mark: head
                .kh
                .map(|k| KeyMark::Hex(k.as_bytes().try_into().unwrap_or([b'!'; 16]))),
            marker: false,
            made_at: 0,
        })
    }
}

/// An envelope's metadata as written.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    sc: u32,
    #[serde(default, borrow)]
    gen: &'a str,
    #[serde(default)]
    born: u64,
    fresh_until: f64,
    hard_until: f64,
    compute_ms: f64,
    #[serde(default)]
    retry_after: f64,
    #[serde(default)]
    negative: bool,
    #[serde(default)]
    undefined: bool,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default, borrow)]
    fmt: Option<&'a str>,
    /// The key it was written for (see `key_mark`); absent from envelopes written before it.
    #[serde(default, borrow)]
    kh: Option<&'a str>,
}

/// A whole envelope in any layout.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(flatten, borrow)]
    head: Head<'a>,
    #[serde(borrow)]
    value: Option<&'a RawValue>,
}

/// An envelope read back from its JSON, the value still as JSON text borrowed from the input.
#[derive(Debug, PartialEq)]
pub struct Decoded<'a> {
    pub envelope: Envelope,
    /// The write that made it (empty for none): 8 bytes in the binary layout, the JSON's `gen`
    /// in the old one.
    pub generation: &'a [u8],
    /// `None` when the cached value is `undefined`; borrowed from the input unless it was
    /// compressed.
    pub value_json: Option<Cow<'a, str>>,
    pub tags: Vec<String>,
    pub fmt: Fmt,
    /// The mark of the key it was written for; `None` in envelopes written before marks.
    pub key_mark: Option<KeyMark>,
    /// A marker (see [`Envelope::encode_marker`]): no value, a miss.
    pub marker: bool,
    /// When the last `set` of the key was made (epoch ms; see
    /// [`Envelope::encode_made_at`]); 0 when the header names none.
    pub made_at: u64,
}

impl Decoded<'_> {
    /// Whether it may be read as the entry of `value_key`: it names that key, or names none
    /// (written by a version before marks).
    pub fn written_for(&self, value_key: &str) -> bool {
        self.written_for_mark(key_mark_bits(value_key))
    }

    /// [`Decoded::written_for`] of the key whose [`key_mark_bits`] are `bits` (a reader that
    /// has the bits without the key's String, as the read lane does).
    pub fn written_for_mark(&self, bits: u64) -> bool {
        match &self.key_mark {
            None => true,
            Some(KeyMark::Bits(mark)) => *mark == bits,
            Some(KeyMark::Hex(mark)) => *mark == hex_mark(bits),
        }
    }

    /// What to write to put it back as it was (see `Envelope::encode`).
    pub fn body(&self) -> Body<'_> {
        Body {
            value_json: self.value_json.as_deref(),
            tags: &self.tags,
            fmt: self.fmt,
        }
    }
}

/// A write's fencing generation: 8 random bytes. The first 4 are its set part: a `set` or
/// `delete` draws all 8, a load's write-back keeps the set part it was fenced by and draws the
/// rest, so a forced load (fenced by the set part alone) is dropped by a `set` or `delete` since
/// it began and not by another load's write (`write_back.lua`).
pub type Generation = [u8; 8];

/// A new generation, all 8 bytes random (the scripts carry a set part over where they must).
pub fn new_generation() -> Generation {
    rand::random()
}

/// The generation of a load's write-back fenced by `fence` (the generation the key held when
/// the load began, as the scripts read it): its set part, which `write_back.lua` would carry
/// over anyway (so it writes the envelope as given, without a copy), and 4 new bytes. All new
/// when the fence is not a binary generation (an old JSON envelope's).
pub fn load_generation(fence: &[u8]) -> Generation {
    let mut g = new_generation();
    if let Ok(fenced) = <&Generation>::try_from(fence) {
        g[..4].copy_from_slice(&fenced[..4]);
    }
    g
}

/// The binary layout in Redis, big-endian, fixed offsets so the Lua scripts read a field with
/// `string.sub` / `struct.unpack` (`scripts/envelope.lua` is the one place they do):
///
/// | offset | bytes | field |
/// |---:|---:|---|
/// | 0 | 1 | `MAGIC` (0xC5: the layout's version; never `{`, never valid UTF-8 first), or `MAGIC_TIMED` (0xC6: the same with `madeAt`) |
/// | 1 | 1 | flags: negative, undefined, tagged, retryAfter, marker, compressed; the format in bits 6-7 (on a marker, which has no value, the undefined bit says a lock waiter flagged it: `cold_gate.lua`) |
/// | 2 | 8 | the key's mark (`key_mark_bits` of the Redis key) |
/// | 10 | 8 | the generation (`Generation`) |
/// | 18 | 6 | born (the namespace clock) |
/// | 24 | 6 | freshUntil (epoch ms) |
/// | 30 | 6 | hardUntil (epoch ms) |
/// | 36 | 4 | computeMs in µs (saturating at about 71 minutes) |
/// | 40 | 6 | madeAt (epoch ms): when the key's last `set` was made, only with `MAGIC_TIMED` |
/// | .. | 6 | retryAfter (epoch ms), only with its flag |
/// | .. | 4 + n | the tags as a JSON array, its length first, only when tagged |
/// | .. | rest | the value's serialized bytes, as given |
///
/// `madeAt` is how a replayed change (one Redis could not take when it was made) tells whether
/// the key holds a newer one: a `set` writes it, and a load writing over that carries it over
/// (`write_back.lua`), as it carries the generation's set part. An entry no `set` or `delete` ever touched (a cache-aside fill) goes without it. The
/// flags byte has no bit left, so the layout's version byte says it.
pub mod layout {
    pub const MAGIC: u8 = 0xC5;
    pub const MAGIC_TIMED: u8 = 0xC6;
    pub const NEGATIVE: u8 = 0x01;
    pub const UNDEFINED: u8 = 0x02;
    pub const TAGGED: u8 = 0x04;
    pub const RETRY: u8 = 0x08;
    pub const MARKER: u8 = 0x10;
    pub const COMPRESSED: u8 = 0x20;
    pub const FMT_SHIFT: u8 = 6;
    pub const MARK: usize = 2;
    pub const GENERATION: usize = 10;
    pub const BORN: usize = 18;
    pub const FRESH: usize = 24;
    pub const HARD: usize = 30;
    pub const COMPUTE: usize = 36;
    /// The header without its optional parts.
    pub const FIXED: usize = 40;
    pub const MADE_AT: usize = 40;
    /// A timed header without its other optional parts.
    pub const TIMED_FIXED: usize = 46;
    pub const MAX_U48: u64 = (1 << 48) - 1;

    /// computeMs as the header holds it: whole µs, saturating.
    pub fn compute_us(ms: f64) -> u32 {
        let us = (ms * 1_000.0).round();
        if us.is_finite() && us > 0.0 {
            us.min(f64::from(u32::MAX)) as u32
        } else {
            0
        }
    }

    /// Epoch ms as the header holds them: whole, 0 to 2^48 - 1 (the year 10889).
    pub fn ms(t: f64) -> u64 {
        if t.is_finite() && t > 0.0 {
            (t as u64).min(MAX_U48)
        } else {
            0
        }
    }

    pub(super) fn u48(b: &[u8], at: usize) -> Option<u64> {
        let s = b.get(at..at + 6)?;
        Some(s.iter().fold(0u64, |n, &c| (n << 8) | u64::from(c)))
    }
}

/// How many bytes from the start of a value key hold every field [`same_write`] reads of the
/// binary layout: the fixed header (what `GETRANGE key 0 HEADER_BYTES-1` asks for).
pub const HEADER_BYTES: usize = layout::FIXED;

/// The same for an envelope earlier versions wrote as JSON (`{"sc":1,...}`: its fields are text,
/// about 200 bytes with a 46-character generation).
pub const JSON_HEADER_BYTES: usize = 256;

/// Whether `header`, the first [`HEADER_BYTES`] (of an old JSON envelope, [`JSON_HEADER_BYTES`]),
/// or more, of `value_key`'s value, begins the envelope of the very write `held` was read or
/// written with: the same birth, freshness, expiry and load time as the header holds them
/// (every write makes new ones; two writes of a key agreeing on all four, to the millisecond and
/// the microsecond of load time, are not told apart), and a header naming that key. Anything
/// else (another write, a marker, another format, a foreign value, too few bytes) is false. The
/// one place a write is recognised by its header, for the check after a lost bus connection
/// (`verify.rs`).
pub fn same_write(header: &[u8], held: &Envelope, value_key: &str) -> bool {
    use layout::*;
    match header.first() {
        Some(&(MAGIC | MAGIC_TIMED)) if header.len() >= FIXED => {
            header[1] & MARKER == 0
                && identity::header_identity(header) == Some(write_identity(held, value_key))
        }
        Some(b'{') => {
            // A cut inside a multi-byte character can only be in the value, after the fields.
            let text = match std::str::from_utf8(header) {
                Ok(text) => text,
                Err(e) => std::str::from_utf8(&header[..e.valid_up_to()]).unwrap_or_default(),
            };
            json_header_fields(text).is_some_and(|f| {
                f == [
                    held.born as f64,
                    held.fresh_until,
                    held.hard_until,
                    held.compute_ms,
                ]
            })
        }
        _ => false,
    }
}

/// born, freshUntil, hardUntil and computeMs of an old JSON envelope, in the order its writer
/// put them.
fn json_header_fields(text: &str) -> Option<[f64; 4]> {
    let mut rest = text.strip_prefix("{\"sc\":1,\"gen\":\"")?;
    let mut out = [0.0; 4];
    for (i, name) in [
        "\"born\":",
        "\"freshUntil\":",
        "\"hardUntil\":",
        "\"computeMs\":",
    ]
    .iter()
    .enumerate()
    {
        let at = rest.find(name)? + name.len();
        rest = &rest[at..];
        // A number cut off by the end of the header is not read as a shorter one.
        let end = rest.find([',', '}'])?;
        out[i] = rest[..end].parse().ok()?;
        rest = &rest[end..];
    }
    Some(out)
}

/// The name an envelope carries of the Redis key it was written to: FNV-1a (64 bits) of the
/// key's bytes, as 16 lowercase hex digits. Not a secret and not proof against forgery (a
/// hostile server can write anything); it turns a reply delivered for the wrong request into
/// a refusal, where 2^-64 is the chance that two keys' marks agree.
pub fn key_mark(value_key: &str) -> [u8; 16] {
    hex_mark(key_mark_bits(value_key))
}

/// The 64 bits of [`key_mark`], as the binary layout carries them.
pub fn key_mark_bits(value_key: &str) -> u64 {
    key_mark_extend(KEY_MARK_START, value_key.as_bytes())
}

/// Where [`key_mark_bits`] starts: FNV-1a's offset basis.
pub const KEY_MARK_START: u64 = 0xcbf2_9ce4_8422_2325;

/// [`key_mark_bits`] carried on over `bytes` from `h`: the mark of a key made of parts is
/// taken part by part, with no String of the whole key.
pub fn key_mark_extend(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A key mark as an envelope carries it: the binary layout's 64 bits, or the JSON layout's
/// 16 hex digits (compared as written, so a garbled one names no key).
#[derive(Debug, PartialEq, Clone, Copy)]
pub enum KeyMark {
    Bits(u64),
    Hex([u8; 16]),
}

fn hex_mark(h: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, slot) in out.iter_mut().enumerate() {
        let nibble = ((h >> (60 - 4 * i)) & 0xf) as u8;
        *slot = if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        };
    }
    out
}

/// The JSON string starting at `at` (its `"`), if it has no escape and no control character,
/// and where it ends (past its closing `"`).
fn plain_string(text: &str, at: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let len = b[at + 1..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
    let end = at + 1 + len;
    if b[end] != b'"' {
        return None;
    }
    // Both ends are ASCII bytes, so character boundaries.
    Some((&text[at + 1..end], end + 1))
}

/// The JSON number starting at `at` if it is a whole non-negative integer that fits a u64 (as
/// serde reads a u64), and where it ends.
fn whole_number(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let digits = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    let end = at + digits;
    // "01" is not JSON; a fraction or an exponent is not a u64 to serde.
    if digits == 0
        || (digits > 1 && b[at] == b'0')
        || matches!(b.get(end), Some(b'.' | b'e' | b'E'))
    {
        return None;
    }
    let mut n = 0u64;
    for &c in &b[at..end] {
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some((n, end))
}

/// The JSON number starting at `at` (JSON's grammar, checked here), and where it ends. Whole
/// numbers of up to 15 digits, as epoch milliseconds are, are exact without a float parse.
fn json_number(text: &str, at: usize) -> Option<(f64, usize)> {
    let b = text.as_bytes();
    let digits_from = |i: usize| b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut i = at;
    let negative = b.get(i) == Some(&b'-');
    if negative {
        i += 1;
    }
    let int = digits_from(i);
    if int == 0 || (int > 1 && b[i] == b'0') {
        return None;
    }
    let int_end = i + int;
    let mut end = int_end;
    if b.get(end) == Some(&b'.') {
        let frac = digits_from(end + 1);
        if frac == 0 {
            return None;
        }
        end += 1 + frac;
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let mut j = end + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let exp = digits_from(j);
        if exp == 0 {
            return None;
        }
        end = j + exp;
    }
    let n = if end == int_end && int <= 15 {
        let whole = b[i..int_end]
            .iter()
            .fold(0u64, |n, &c| n * 10 + u64::from(c - b'0')) as f64;
        if negative {
            -whole
        } else {
            whole
        }
    } else {
        text[at..end].parse::<f64>().ok()?
    };
    Some((n, end))
}

#[cfg(test)]
fn push_number(out: &mut String, n: f64) {
    use std::fmt::Write;
    // Integers (epoch ms) print without a fraction; fractions keep full precision.
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        let _ = write!(out, "{}", n as i64);
    } else {
        let _ = write!(out, "{n}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_load_keeps_the_set_part_it_was_fenced_by_and_draws_the_rest() {
        let fence = [1, 2, 3, 4, 5, 6, 7, 8];
        let a = load_generation(&fence);
        let b = load_generation(&fence);
        assert_eq!(a[..4], fence[..4]);
        assert_ne!(a[4..], b[4..], "the rest is drawn anew");
        // An old JSON envelope's generation (text) fences nothing binary: all new.
        let text = load_generation(b"0123456789abcdef0123456789abcdef");
        assert_ne!(text, load_generation(b"0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn a_header_names_the_write_it_begins_and_no_other() {
        use super::*;
        let e = Envelope {
            fresh_until: 1_796_000_000_123.0,
            hard_until: 1_796_000_600_123.0,
            compute_ms: 1.0856600000000185,
            negative: false,
            retry_after: 1_796_000_000_500.0,
            born: 42,
        };
        let value = "\"ü\"".repeat(200);
        let tags = ["t".to_string()];
        let body = Body {
            value_json: Some(&value),
            tags: &tags,
            fmt: Fmt::Json,
        };
        let key = "ns:v:{k}";
        let g = new_generation();
        // The binary layout, timed (a set's) or not (a load's): the fixed header is enough.
        for bytes in [
            e.encode(&body, &g, key),
            e.encode_made_at(&body, &g, key, 1_796_000_000_000),
        ] {
            let header = &bytes[..HEADER_BYTES];
            assert!(same_write(header, &e, key));
            assert!(same_write(&bytes, &e, key), "the whole value too");
            assert!(
                !same_write(&header[..HEADER_BYTES - 1], &e, key),
                "too short"
            );
            assert!(!same_write(header, &e, "ns:v:{other}"), "another key's");
            let other = Envelope {
                fresh_until: e.fresh_until + 1.0,
                ..e
            };
            assert!(!same_write(header, &other, key));
            assert!(!same_write(header, &Envelope { born: 43, ..e }, key));
            let slower = Envelope {
                compute_ms: e.compute_ms + 0.001,
                ..e
            };
            assert!(!same_write(header, &slower, key));
        }
        // A marker is no write of a value, whatever its times.
        assert!(!same_write(&e.encode_marker(&g, key), &e, key));
        // An old JSON envelope: its fields are within JSON_HEADER_BYTES.
        let text = e.encode_json(&body, &"t".repeat(46), key);
        let header = &text.as_bytes()[..JSON_HEADER_BYTES];
        assert!(same_write(header, &e, key));
        assert!(same_write(text.as_bytes(), &e, key));
        assert!(
            !same_write(&text.as_bytes()[..HEADER_BYTES], &e, key),
            "cut in its fields"
        );
        let later = Envelope {
            hard_until: e.hard_until + 1.0,
            ..e
        };
        assert!(!same_write(header, &later, key));
        assert!(!same_write(b"{\"foreign\":1}", &e, key));
        assert!(!same_write(b"", &e, key));
    }

    #[test]
    fn a_timed_envelope_carries_when_its_change_was_made() {
        use super::*;
        let e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        let g = new_generation();
        let key = "sc:v:{k}";
        let tags = ["a".to_string(), "b".to_string()];
        let body = Body {
            value_json: Some("\"AQI=\""),
            tags: &tags,
            fmt: Fmt::V8,
        };
        let retrying = Envelope {
            retry_after: 1_500.0,
            ..e
        };
        let untimed = retrying.encode(&body, &g, key);
        let timed = retrying.encode_made_at(&body, &g, key, 1_796_000_000_123);
        assert_eq!(untimed[0], layout::MAGIC);
        assert_eq!(timed[0], layout::MAGIC_TIMED);
        assert_eq!(timed.len(), untimed.len() + 6, "6 bytes more, nothing else");
        let (a, b) = (
            Envelope::decode(&untimed).unwrap(),
            Envelope::decode(&timed).unwrap(),
        );
        assert_eq!(a.made_at, 0);
        assert_eq!(b.made_at, 1_796_000_000_123);
        assert_eq!(
            (a.envelope, a.generation, &a.tags),
            (b.envelope, b.generation, &b.tags)
        );
        assert_eq!(b.value_json.as_deref(), Some("\"AQI=\""));
        assert_eq!(b.fmt, Fmt::V8);
        assert!(Envelope::decode(&timed[..layout::TIMED_FIXED - 1]).is_none());
    }

    #[test]
    fn a_mark_is_checked_by_its_bits_in_either_layout() {
        let e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        let body = Body::json(Some("1"));
        let binary = e.encode(&body, &[7; 8], "sc:v:{a}");
        let json = e.encode_json(&body, "g1", "sc:v:{a}");
        let d = Envelope::decode(&binary).unwrap();
        assert_eq!(d.key_mark, Some(KeyMark::Bits(key_mark_bits("sc:v:{a}"))));
        for d in [d, Envelope::decode_json(&json).unwrap()] {
            assert!(d.written_for_mark(key_mark_bits("sc:v:{a}")));
            assert!(!d.written_for_mark(key_mark_bits("sc:v:{b}")));
            assert!(!d.written_for_mark(key_mark_bits("sc:v:{a}") ^ 1));
        }
        let garbled = json.replacen("\"kh\":\"", "\"kh\":\"z", 1);
        let d = Envelope::decode_json(&garbled).unwrap();
        assert!(!d.written_for_mark(key_mark_bits("sc:v:{a}")));
    }

    #[test]
    fn an_envelope_names_the_key_it_was_written_for() {
        let e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        let text = e.encode_json(&Body::json(Some("1")), "g1", "sc:v:{a}");
        let d = Envelope::decode_json(&text).unwrap();
        assert!(d.written_for("sc:v:{a}"));
        assert!(!d.written_for("sc:v:{b}"));
        assert!(!d.written_for("other:v:{a}"));
        // Where the Lua scripts read gen and born by position, they still are.
        assert!(text.starts_with("{\"sc\":1,\"gen\":\"g1\",\"born\":0,\"kh\":\""));
        // Tagged envelopes (the general decoder) carry it too.
        let tags = vec!["t".to_string()];
        let body = Body {
            value_json: Some("1"),
            tags: &tags,
            fmt: Fmt::Json,
        };
        let tagged = e.encode_json(&body, "g1", "sc:v:{a}");
        let d = Envelope::decode_json(&tagged).unwrap();
        assert!(d.written_for("sc:v:{a}") && !d.written_for("sc:v:{b}"));
        // Written before marks existed: readable as any key's.
        let old = r#"{"sc":1,"gen":"g1","born":0,"freshUntil":1100,"hardUntil":2000,"computeMs":5,"retryAfter":0,"value":1}"#;
        assert!(Envelope::decode_json(old).unwrap().written_for("sc:v:{b}"));
        // A mark that is not one (garbled) names no key of ours.
        let garbled = text.replacen("\"kh\":\"", "\"kh\":\"z", 1);
        assert!(!Envelope::decode_json(&garbled)
            .unwrap()
            .written_for("sc:v:{a}"));
        assert_ne!(key_mark("sc:v:{a}"), key_mark("sc:v:{b}"));
        assert!(key_mark("x").iter().all(u8::is_ascii_hexdigit));
    }

    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn a_refresh_is_due_past_fresh_unless_backed_off() {
        let mut e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        assert!(!e.refresh_due(1_099.0));
        assert!(e.refresh_due(1_100.0));
        e.retry_after = 1_500.0;
        assert!(!e.refresh_due(1_499.0));
        assert!(e.refresh_due(1_500.0));
    }

    #[test]
    fn states_follow_the_two_ttls() {
        let e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        assert_eq!(e.state(1_000.0), State::Fresh);
        assert_eq!(e.state(1_099.9), State::Fresh);
        assert_eq!(e.state(1_100.0), State::Stale);
        assert_eq!(e.state(1_999.0), State::Stale);
        assert_eq!(e.state(2_000.0), State::Expired);
    }

    #[test]
    fn hard_ttl_never_ends_before_soft_ttl() {
        let e = Envelope::new(0.0, 100.0, 50.0, 0.0, false);
        assert_eq!(e.hard_until, 100.0);
    }

    #[test]
    fn backoff_holds_refreshes_until_retry_after() {
        let mut e = Envelope::new(0.0, 10.0, 100.0, 1.0, false);
        assert!(e.refresh_allowed(20.0));
        e.retry_after = 50.0;
        assert!(!e.refresh_allowed(20.0));
        assert!(e.refresh_allowed(50.0));
    }

    #[test]
    fn json_round_trip_keeps_value_text_verbatim() {
        let mut e = Envelope::new(1_700_000_000_000.0, 60_000.0, 600_000.0, 12.5, false);
        e.retry_after = 1_700_000_005_000.0;
        let value = r#"{"b":1,"a":[1,2,{"x":"y"}]}"#;
        let text = e.encode_json(&Body::json(Some(value)), "g1", "sc:v:{k}");
        assert!(
            text.starts_with(r#"{"sc":1,"gen":"g1","born":0,"#),
            "{text}"
        );
        let back = Envelope::decode_json(&text).unwrap();
        assert_eq!(back.envelope, e);
        assert_eq!(back.value_json.as_deref(), Some(value));
        assert_eq!(back.generation, b"g1");
    }

    #[test]
    fn negative_null_and_undefined_are_distinct() {
        let e = Envelope::new(0.0, 5.0, 5.0, 1.0, true);
        let null_text = e.encode_json(&Body::json(Some("null")), "g", "sc:v:{k}");
        let null = Envelope::decode_json(&null_text).unwrap();
        assert!(null.envelope.negative);
        assert_eq!(null.value_json.as_deref(), Some("null"));
        let undef_text = e.encode_json(&Body::json(None), "g", "sc:v:{k}");
        let undef = Envelope::decode_json(&undef_text).unwrap();
        assert_eq!(undef.value_json.as_deref(), None);
    }

    #[test]
    fn the_value_is_taken_as_written_and_other_layouts_are_parsed_whole() {
        let e = Envelope::new(1_000.0, 10.0, 20.0, 1.0, false);
        let big = format!("{{\"data\":\"{}\"}}", "x".repeat(10_000));
        // A tag that spells the value's key: escaped, it cannot be mistaken for it.
        let tags = vec![r#"x","value":1"#.to_string()];
        let body = Body {
            value_json: Some(&big),
            tags: &tags,
            fmt: Fmt::Json,
        };
        let text = e.encode_json(&body, "g1", "sc:v:{k}");
        let back = Envelope::decode_json(&text).unwrap();
        assert_eq!(back.value_json.as_deref(), Some(big.as_str()));
        assert_eq!(back.tags, tags);
        assert_eq!(back.generation, b"g1");

        // Not scanned: a value that is not JSON is left to its reader (a miss there).
        let head = r#"{"sc":1,"gen":"g2","born":0,"freshUntil":1,"hardUntil":2,"computeMs":0,"retryAfter":0"#;
        let corrupt = format!(r#"{head},"value":{{oops}}"#);
        assert_eq!(
            Envelope::decode_json(&corrupt)
                .unwrap()
                .value_json
                .as_deref(),
            Some("{oops")
        );

        // Another writer's layout (the value first, spaces): parsed whole.
        let first = r#"{"value":[1,2],"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":0}"#;
        assert_eq!(
            Envelope::decode_json(first).unwrap().value_json.as_deref(),
            Some("[1,2]")
        );
        let spaced =
            r#"{"sc": 1, "freshUntil": 1, "hardUntil": 2, "computeMs": 0, "value": {"a": 1}}"#;
        assert_eq!(
            Envelope::decode_json(spaced).unwrap().value_json.as_deref(),
            Some(r#"{"a": 1}"#)
        );
        let v8 = r#"{"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":0,"fmt":"v8","value":"AAE="}"#;
        assert_eq!(Envelope::decode_json(v8).unwrap().fmt, Fmt::V8);
    }

    /// Envelopes as `encode` writes them, over the fields' range: the one-pass reader of the
    /// written layout reads each as the general reader does, and as it was written.
    #[test]
    fn the_written_layout_is_read_as_the_general_reader_reads_it() {
        use rand::{rngs::SmallRng, Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(12);
        let values = [
            "1",
            "null",
            "\"x\"",
            r#"{"a":[1,2,{"b":"}"}]}"#,
            r#""\u00e9\"\\""#,
            "é",
        ];
        let fmts = [Fmt::Json, Fmt::V8, Fmt::Text, Fmt::Bytes];
        for i in 0..5_000 {
            let e = Envelope {
                fresh_until: rng.random_range(0..2_000_000_000_000u64) as f64,
                hard_until: 2.0e12 + rng.random_range(0..1_000_000u64) as f64,
                compute_ms: if i % 3 == 0 {
                    rng.random::<f64>() * 1e4
                } else {
                    rng.random_range(0..100u64) as f64
                },
                negative: i % 7 == 0,
                retry_after: if i % 5 == 0 {
                    rng.random::<f64>() * 1e13
                } else {
                    0.0
                },
                // A clock: `encode` writes it as a JS number, exact below 2^53.
                born: if i % 4 == 0 {
                    rng.random_range(0..1u64 << 53)
                } else {
                    rng.random_range(0..10u64)
                },
            };
            let value = values[i % values.len()];
            let fmt = fmts[i % fmts.len()];
            let value = if fmt == Fmt::Json {
                value.to_string()
            } else {
                format!("\"v{i}\"")
            };
            let body = Body {
                value_json: (i % 11 != 0).then_some(value.as_str()),
                tags: &[],
                fmt,
            };
            let text = e.encode_json(&body, "ab12", "sc:v:{k}");
            let fast = Envelope::decode_written(&text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(Some(&fast), Envelope::decode_any(&text).as_ref(), "{text}");
            assert_eq!(fast.envelope, e, "{text}");
            assert_eq!(fast.value_json.as_deref(), body.value_json);
            assert_eq!((fast.generation, fast.fmt), (&b"ab12"[..], fmt));
        }
    }

    /// The written layout cut, spliced and garbled: what the one-pass reader accepts, the
    /// general reader accepts the same way; everything else it leaves to the general reader.
    #[test]
    fn the_one_pass_reader_never_reads_what_the_general_reader_would_not() {
        use rand::{rngs::SmallRng, Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(7);
        let e = Envelope::new(1_000.5, 10_000.0, 20_000.0, 3.25, false).born_at(4);
        let bases = [
            e.encode_json(&Body::json(Some(r#"{"k":"v"}"#)), "g9", "sc:v:{k}"),
            e.encode_json(&Body::json(None), "g9", "sc:v:{k}"),
            Envelope {
                negative: true,
                retry_after: 7.0,
                ..e
            }
            .encode_json(&Body::json(Some("null")), "", "sc:v:{k}"),
            e.encode_json(
                &Body {
                    value_json: Some("\"AA==\""),
                    tags: &[],
                    fmt: Fmt::Bytes,
                },
                "g",
                "sc:v:{k}",
            ),
        ];
        let alphabet = b"{}[]\",:\\ 0123456789.eE+-truefalsnvgcmdpbhUMAR\x01";
        let mut accepted = 0;
        for i in 0..200_000 {
            let mut t = bases[i % bases.len()].clone().into_bytes();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..t.len());
                let c = alphabet[rng.random_range(0..alphabet.len())];
                match rng.random_range(0..3) {
                    0 => t[at] = c,
                    1 => t.insert(at, c),
                    _ => {
                        t.remove(at);
                    }
                }
                if t.is_empty() {
                    break;
                }
            }
            let Ok(text) = String::from_utf8(t) else {
                continue;
            };
            if let Some(fast) = Envelope::decode_written(&text) {
                accepted += 1;
                assert_eq!(Some(fast), Envelope::decode_any(&text), "{text}");
            }
        }
        // The garbling leaves many envelopes readable (a digit for a digit, say): the
        // comparison above ran on them.
        assert!(accepted > 5_000, "{accepted}");
    }

    /// Cases per property: `FUZZ_CASES` (`npm run fuzz` sets many more), else 25,000.
    fn cases() -> u32 {
        std::env::var("FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(25_000)
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(cases()))]

        /// Any bytes at all, and any bytes behind the binary layout's first byte: an envelope
        /// (for its key or another's), or a miss; never a panic.
        #[test]
        fn proptest_any_bytes_decode_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            binary in proptest::prelude::any::<bool>(),
        ) {
            let mut bytes = bytes;
            if binary && !bytes.is_empty() {
                bytes[0] = layout::MAGIC;
            }
            if let Some(d) = Envelope::decode(&bytes) {
                proptest::prop_assert!(d.envelope.hard_until >= d.envelope.fresh_until);
                let _ = d.written_for("sc:v:{k}");
            }
        }

        /// Random headers with random fields and bodies read back as written.
        #[test]
        fn proptest_the_binary_layout_reads_back_as_written(
            fresh in 0u64..(1 << 47),
            extra in 0u64..(1 << 40),
            born in 0u64..(1 << 48),
            compute_us in 0u32..u32::MAX,
            retry in 0u64..(1 << 47),
            g in proptest::prelude::any::<[u8; 8]>(),
            negative in proptest::prelude::any::<bool>(),
            tags in proptest::collection::vec("[ -~]{0,12}", 0..4),
            value in "[ -~]{1,60}",
        ) {
            let e = Envelope {
                fresh_until: fresh as f64,
                hard_until: (fresh + extra) as f64,
                compute_ms: f64::from(compute_us) / 1_000.0,
                negative,
                retry_after: retry as f64,
                born,
            };
            let json = serde_json::to_string(&value).unwrap_or_default();
            let body = Body { value_json: Some(&json), tags: &tags, fmt: Fmt::Json };
            let bytes = e.encode(&body, &g, "sc:v:{key}");
            let d = Envelope::decode(&bytes).expect("what encode wrote is read");
            proptest::prop_assert_eq!(d.envelope, e);
            proptest::prop_assert_eq!(d.body(), body);
            proptest::prop_assert_eq!(d.generation, &g[..]);
            let (own, other) = ("sc:v:{key}", "sc:v:{kez}");
            proptest::prop_assert!(d.written_for(own) && !d.written_for(other));
        }

        /// Any text at all: an envelope, or a miss; never a panic.
        #[test]
        fn any_text_decodes_without_panicking(chars in proptest::collection::vec(proptest::prelude::any::<char>(), 0..300)) {
            let text: String = chars.into_iter().collect();
            let _ = Envelope::decode_json(&text);
        }

        /// An envelope is read as written, for the key it was written for, and as no other's.
        #[test]
        fn an_envelope_reads_back_for_its_own_key_only(
            key in proptest::collection::vec(b' '..=b'~', 1..64).prop_map(|k| String::from_utf8(k).unwrap_or_default()),
            other in proptest::collection::vec(b' '..=b'~', 1..64).prop_map(|k| String::from_utf8(k).unwrap_or_default()),
            fresh in 0u32..1_000_000,
            extra in 0u32..1_000_000,
            compute in 0u32..100_000,
            value in proptest::collection::vec(b'a'..=b'z', 0..40).prop_map(|k| String::from_utf8(k).unwrap_or_default()),
            negative in proptest::prelude::any::<bool>(),
        ) {
            let e = Envelope::new(f64::from(fresh), f64::from(extra), f64::from(extra) * 2.0, f64::from(compute) / 8.0, negative);
            let json = format!("\"{value}\"");
            let text = e.encode_json(&Body::json(Some(&json)), "g1", &key);
            let d = Envelope::decode_json(&text).expect("what encode wrote is read");
            proptest::prop_assert_eq!(d.envelope, e);
            proptest::prop_assert_eq!(d.value_json.as_deref(), Some(json.as_str()));
            proptest::prop_assert!(d.written_for(&key));
            proptest::prop_assert_eq!(d.written_for(&other), key == other);
        }
    }

    #[test]
    fn the_binary_layout_round_trips_and_names_its_key() {
        let mut e = Envelope::new(1_700_000_000_000.0, 60_000.0, 600_000.0, 12.5, false).born_at(7);
        let g: Generation = *b"ABCDefgh";
        let value = r#"{"id":1,"name":"x"}"#;
        let bytes = e.encode(&Body::json(Some(value)), &g, "sc:v:{k}");
        // The header and the value's bytes as given, nothing else.
        assert_eq!(bytes.len(), layout::FIXED + value.len());
        assert_eq!(&bytes[layout::FIXED..], value.as_bytes());
        assert_eq!(bytes[0], layout::MAGIC);
        assert_eq!(
            &bytes[layout::GENERATION..layout::GENERATION + 8],
            b"ABCDefgh"
        );
        let d = Envelope::decode(&bytes).unwrap();
        assert_eq!(d.envelope, e);
        assert_eq!(d.value_json.as_deref(), Some(value));
        assert_eq!(d.generation, b"ABCDefgh");
        assert!(d.written_for("sc:v:{k}") && !d.written_for("sc:v:{j}"));
        assert!(!d.marker);
        // Retry-after, tags, another format, undefined, negative.
        e.retry_after = 1_700_000_005_000.0;
        let tags = vec!["user:1".to_string(), "a \"quoted\" tag".to_string()];
        for (fmt, v) in [
            (Fmt::V8, Some("\"AAEC\"")),
            (Fmt::Json, None),
            (Fmt::Bytes, Some("\"AA==\"")),
        ] {
            let body = Body {
                value_json: v,
                tags: &tags,
                fmt,
            };
            let bytes = e.encode(&body, &g, "sc:v:{k}");
            let d = Envelope::decode(&bytes).unwrap();
            assert_eq!(d.envelope, e);
            assert_eq!(d.body(), body);
        }
        let neg = Envelope {
            negative: true,
            ..e
        };
        let d_bytes = neg.encode(&Body::json(Some("null")), &g, "sc:v:{k}");
        let d = Envelope::decode(&d_bytes).unwrap();
        assert!(d.envelope.negative);
        assert_eq!(d.value_json.as_deref(), Some("null"));
        // A marker is an envelope with no value, for its key only.
        let m = e.encode_marker(&g, "sc:v:{k}");
        assert_eq!(m.len(), layout::FIXED);
        let d = Envelope::decode(&m).unwrap();
        assert!(d.marker && d.value_json.is_none() && d.written_for("sc:v:{k}"));
        assert!(!d.written_for("sc:v:{x}"));
        // computeMs is kept to the microsecond.
        let c = Envelope::new(0.0, 1.0, 1.0, 0.123_456_7, false);
        let d_bytes = c.encode(&Body::json(Some("1")), &g, "k");
        assert_eq!(
            Envelope::decode(&d_bytes).unwrap().envelope.compute_ms,
            0.123
        );
        // Old JSON envelopes are still read.
        let old = r#"{"sc":1,"gen":"g1","born":0,"freshUntil":1100,"hardUntil":2000,"computeMs":5,"retryAfter":0,"value":1}"#;
        let d = Envelope::decode(old.as_bytes()).unwrap();
        assert_eq!(
            (d.value_json.as_deref(), d.generation),
            (Some("1"), &b"g1"[..])
        );
    }

    #[test]
    fn large_values_are_compressed_and_read_back_as_written() {
        let e = Envelope::new(1_000.0, 10.0, 20.0, 1.0, false);
        let g: Generation = *b"01234567";
        let page = format!("\"{}\"", "<div class=\\\"row\\\">héllo</div>".repeat(4_000));
        let bytes = e.encode(&Body::json(Some(&page)), &g, "sc:v:{k}");
        assert_ne!(bytes[1] & layout::COMPRESSED, 0, "compressed");
        assert!(
            bytes.len() < page.len() / 4,
            "{} of {}",
            bytes.len(),
            page.len()
        );
        let d = Envelope::decode(&bytes).unwrap();
        assert_eq!(d.value_json.as_deref(), Some(page.as_str()));
        // Small, or not worth it (random-looking): stored as given.
        let small = e.encode(&Body::json(Some("[1,2,3]")), &g, "k");
        assert_eq!(small[1] & layout::COMPRESSED, 0);
        use rand::{rngs::SmallRng, Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(3);
        let noise: String = (0..40_000)
            .map(|_| char::from(rng.random_range(b'#'..=b'~')))
            .filter(|&c| c != '\\')
            .collect();
        let noise = format!("\"{noise}\"");
        let raw = e.encode(&Body::json(Some(&noise)), &g, "k");
        assert_eq!(raw[1] & layout::COMPRESSED, 0);
        // A compressed body that lies about its length, or is cut: a miss, never a large allocation.
        let mut lying = bytes.clone();
        lying[layout::FIXED..layout::FIXED + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Envelope::decode(&lying).is_none());
        assert!(Envelope::decode(&bytes[..bytes.len() - 10]).is_none());
    }

    #[test]
    fn a_cut_or_garbled_header_is_a_miss_or_names_another_key() {
        let e = Envelope::new(1_000.0, 10.0, 20.0, 1.0, false);
        let g: Generation = *b"01234567";
        let bytes = e.encode(&Body::json(Some("[1]")), &g, "sc:v:{k}");
        for cut in 0..layout::FIXED {
            assert!(Envelope::decode(&bytes[..cut]).is_none(), "{cut}");
        }
        // No value at all (and not a marker): a miss.
        assert!(Envelope::decode(&bytes[..layout::FIXED]).is_none());
        // A garbled mark: read, but as another key's.
        let mut other = bytes.clone();
        other[layout::MARK] ^= 1;
        assert!(!Envelope::decode(&other).unwrap().written_for("sc:v:{k}"));
        // hardUntil before freshUntil: a miss.
        let mut bad = bytes.clone();
        bad[layout::HARD..layout::HARD + 6].copy_from_slice(&[0; 6]);
        assert!(Envelope::decode(&bad).is_none());
        // A compressed flag over bytes that are not what compression writes: a miss.
        let mut comp = bytes.clone();
        comp[1] |= layout::COMPRESSED;
        assert!(Envelope::decode(&comp).is_none());
        // A value that is not UTF-8: a miss.
        let mut b = bytes.clone();
        b.push(0xff);
        assert!(Envelope::decode(&b).is_none());
    }

    #[test]
    fn foreign_data_is_a_miss() {
        for text in [
            "",
            "hello",
            "42",
            "null",
            "[1,2]",
            r#"{"value":1}"#,
            r#"{"sc":2,"freshUntil":1,"hardUntil":2,"computeMs":0,"value":1}"#,
            r#"{"sc":1,"freshUntil":5,"hardUntil":2,"computeMs":0,"value":1}"#,
            r#"{"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":-1,"value":1}"#,
            r#"{"sc":1,"freshUntil":"x","hardUntil":2,"computeMs":0,"value":1}"#,
            r#"{"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":0,"value":}"#,
            r#"{"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":0}"#,
        ] {
            assert!(Envelope::decode_json(text).is_none(), "{text}");
        }
    }

    #[test]
    fn tags_born_and_format_round_trip() {
        let e = Envelope::new(1_000.0, 10.0, 20.0, 1.0, false).born_at(42);
        let tags = vec!["user:1".to_string(), "a \"quoted\" tag".to_string()];
        let body = Body {
            value_json: Some("\"AAEC\""),
            tags: &tags,
            fmt: Fmt::V8,
        };
        let text = e.encode_json(&body, "g7", "sc:v:{k}");
        assert!(
            text.starts_with(r#"{"sc":1,"gen":"g7","born":42,"#),
            "{text}"
        );
        let back = Envelope::decode_json(&text).unwrap();
        assert_eq!(back.envelope, e);
        assert_eq!(back.tags, tags);
        assert_eq!(back.fmt, Fmt::V8);
        assert_eq!(back.body(), body);
        // An untagged JSON envelope carries neither field: it reads as before.
        let plain = e.encode_json(&Body::json(Some("1")), "g", "sc:v:{k}");
        assert!(!plain.contains("tags") && !plain.contains("fmt"), "{plain}");
        // Envelopes written before born existed read as born at 0.
        let old = r#"{"sc":1,"gen":"g","freshUntil":1,"hardUntil":2,"computeMs":0,"value":1}"#;
        assert_eq!(Envelope::decode_json(old).unwrap().envelope.born, 0);
    }

    #[test]
    fn serializers_read_only_their_own_format() {
        use Serializer::*;
        assert!(Json.reads(Fmt::Json) && !Json.reads(Fmt::V8) && !Json.reads(Fmt::Text));
        assert!(V8.reads(Fmt::V8) && !V8.reads(Fmt::Json) && !V8.reads(Fmt::Bytes));
        assert!(Custom.reads(Fmt::Text) && Custom.reads(Fmt::Bytes) && !Custom.reads(Fmt::V8));
        // An unknown marker, or a non-string value under a marker, is not ours at all.
        let base = r#"{"sc":1,"freshUntil":1,"hardUntil":2,"computeMs":0,"#;
        assert!(
            Envelope::decode_json(&format!(r#"{base}"fmt":"msgpack","value":"x"}}"#)).is_none()
        );
        assert!(
            Envelope::decode_json(&format!(r#"{base}"fmt":"v8","value":{{"a":1}}}}"#)).is_none()
        );
        assert!(Envelope::decode_json(&format!(r#"{base}"fmt":"v8","value":"AAE="}}"#)).is_some());
    }

    #[test]
    fn remaining_ms_is_a_positive_px() {
        let e = Envelope::new(0.0, 10.0, 20.5, 0.0, false);
        assert_eq!(e.remaining_ms(0.0), 21);
        assert_eq!(e.remaining_ms(100.0), 1);
    }
}
