//! Values carried on the bus. A load's write-back announces its key with the envelope it wrote
//! when that is small and untagged (`0xFE <origin> <key length> <key><envelope>`), so other
//! processes, which drop their copy of the key on hearing it, can take the new one from the
//! message on their next read instead of asking Redis for it.
//!
//! A carried envelope is used only while the key's invalidation stamp is still the one its
//! announcement produced: anything heard of the key since (another announcement, a write in this
//! process, a clear, a resubscription) changes the stamp and the next read asks Redis again. It
//! is exactly what Redis held when the script that wrote it published it, so serving it is no
//! older than an in-process copy kept until that same announcement.
//!
//! One more rule, for this process's own writes. Its writes' replies come on the command
//! connection, announcements on the subscriber connection, so another process's announcement of
//! a write Redis ran *before* one of ours can arrive *after* our write returned (and after the
//! stamp our write gave the key): kept then, it would be served over our newer write. Announcements
//! arrive in the order Redis ran the writes, so each write of ours that will announce its key is
//! counted until its own announcement arrives, and while one is outstanding no announcement of the
//! key is kept: it ran before ours. An own announcement lost with the bus leaves its count behind,
//! which only stops that key being carried (past a bound, every key, until the cache closes).
//!
//! Entries and bytes are bounded; on overflow everything carried is forgotten (reads then ask
//! Redis, as they would without this).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::inbox::Stamp;
use crate::sync::LockOrRecover;

/// First byte of a value-carrying announcement: never the first byte of a plain one (which is
/// UTF-8 text) nor of a namespace-wide one (0xFF).
pub const CARRIED_MESSAGE: u8 = 0xFE;

/// Envelopes larger than this are announced without their value: every subscriber receives
/// every message, and a large value is read only by the processes that read it.
pub const MAX_CARRIED_ENVELOPE: usize = 4 * 1024;

/// Carried envelopes kept per cache at most, and their bytes in all.
pub const MAX_CARRIED_KEYS: usize = 4_096;
pub const MAX_CARRIED_BYTES: usize = 4 * 1024 * 1024;

/// Keys with an own announcement outstanding, at most; past it nothing is carried any more.
pub const MAX_OWN_PENDING: usize = 4_096;

/// The announcement of `key` carrying `envelope`, or `None` if the envelope is too large (what
/// `write_back.lua` publishes, the prefix and the envelope it wrote; built here for the tests).
#[cfg(test)]
pub fn message(origin: &str, key: &str, envelope: &[u8]) -> Option<Vec<u8>> {
    let mut m = prefix(origin, key, envelope.len())?;
    m.extend_from_slice(envelope);
    Some(m)
}

/// [`message`] less the envelope, for an envelope of `envelope_len` bytes: what
/// `write_back.lua` is given, and puts in front of the envelope it writes (so the value crosses
/// to Redis once, not once more inside the message). `None` if the envelope is too large.
pub fn prefix(origin: &str, key: &str, envelope_len: usize) -> Option<Vec<u8>> {
    if envelope_len > MAX_CARRIED_ENVELOPE {
        return None;
    }
    let len = key.len().to_string();
    let mut m = Vec::with_capacity(4 + origin.len() + len.len() + key.len() + envelope_len);
    m.push(CARRIED_MESSAGE);
    m.extend_from_slice(origin.as_bytes());
    m.push(b' ');
    m.extend_from_slice(len.as_bytes());
    m.push(b' ');
    m.extend_from_slice(key.as_bytes());
    Some(m)
}

/// A carried announcement, split: `(origin, key, envelope)`. `body` is the message without its
/// first byte. `None` for anything malformed.
pub fn parse(body: &[u8]) -> Option<(&str, &str, &[u8])> {
    let text_end = body.iter().position(|&b| b == b' ')?;
    let origin = std::str::from_utf8(&body[..text_end]).ok()?;
    let rest = &body[text_end + 1..];
    let len_end = rest.iter().position(|&b| b == b' ')?;
    let len: usize = std::str::from_utf8(&rest[..len_end]).ok()?.parse().ok()?;
    let rest = &rest[len_end + 1..];
    if rest.len() < len {
        return None;
    }
    let key = std::str::from_utf8(&rest[..len]).ok()?;
    Some((origin, key, &rest[len..]))
}

/// Carried envelopes by key, each with the stamp its announcement gave the key.
#[derive(Default)]
pub struct Carried {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<Box<str>, (Stamp, Box<[u8]>)>,
    bytes: usize,
    /// Own announcements not heard back yet, by key.
    own: HashMap<Box<str>, u32>,
    /// Too many own announcements went unheard: nothing is carried any more.
    off: bool,
}

impl Carried {
    /// A write of ours that will announce `key` is about to be sent. What is carried for the
    /// key now is older than it (Redis ran that write first) and goes: a load's write-back
    /// leaves the key's stamp as it was, so `take`'s stamp check would not tell.
    pub fn expect_own(&self, key: &str) {
        let mut g = self.inner.lock_or_recover();
        if let Some((_, old)) = g.by_key.remove(key) {
            g.bytes -= old.len();
        }
        if g.own.len() >= MAX_OWN_PENDING && !g.own.contains_key(key) {
            g.off = true;
            g.own = HashMap::new();
            g.by_key = HashMap::new();
            g.bytes = 0;
        }
        if !g.off {
            *g.own.entry(key.into()).or_default() += 1;
        }
    }

    /// One of our announcements of `key` arrived, or a write of ours turned out not to announce.
    pub fn own_heard(&self, key: &str) {
        let mut g = self.inner.lock_or_recover();
        if let Some(n) = g.own.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                g.own.remove(key);
            }
        }
    }

    /// Keeps `envelope` for `key`, valid while the key's stamp is `stamp`; not if a write of ours
    /// to the key is still to be heard (Redis ran this one before it) or carrying is off.
    pub fn keep(&self, key: &str, stamp: Stamp, envelope: &[u8]) {
        let mut g = self.inner.lock_or_recover();
        if let Some((_, old)) = g.by_key.remove(key) {
            g.bytes -= old.len();
        }
        if g.off || g.own.contains_key(key) {
            return;
        }
        if g.by_key.len() >= MAX_CARRIED_KEYS || g.bytes + envelope.len() > MAX_CARRIED_BYTES {
            g.by_key = HashMap::new();
            g.bytes = 0;
        }
        g.bytes += envelope.len();
        g.by_key.insert(key.into(), (stamp, envelope.into()));
    }

    /// Forgets the key's carried envelope (a plain announcement of it).
    pub fn forget(&self, key: &str) {
        let mut g = self.inner.lock_or_recover();
        if let Some((_, old)) = g.by_key.remove(key) {
            g.bytes -= old.len();
        }
    }

    /// Takes the key's carried envelope if `stamp` is still the one it came with.
    pub fn take(&self, key: &str, stamp: Stamp) -> Option<Box<[u8]>> {
        let mut g = self.inner.lock_or_recover();
        let (kept, _) = g.by_key.get(key)?;
        if *kept != stamp {
            // Something newer was heard of the key: this one is of no use any more.
            let (_, old) = g.by_key.remove(key)?;
            g.bytes -= old.len();
            return None;
        }
        let (_, envelope) = g.by_key.remove(key)?;
        g.bytes -= envelope.len();
        Some(envelope)
    }

    /// Forgets every carried envelope (the own counts stay: those writes may still announce).
    pub fn clear(&self) {
        let mut g = self.inner.lock_or_recover();
        g.by_key = HashMap::new();
        g.bytes = 0;
    }

    /// `(keys, bytes)` kept (for tests: bounded).
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        let g = self.inner.lock_or_recover();
        (g.by_key.len(), g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_whatever_the_key_holds() {
        for key in ["k", "a b c", "{weird} key", "ключ", ""] {
            let m = message("origin1", key, br#"{"sc":1}"#).unwrap();
            assert_eq!(m[0], CARRIED_MESSAGE);
            assert!(std::str::from_utf8(&m).is_err(), "older readers ignore it");
            assert_eq!(parse(&m[1..]), Some(("origin1", key, &br#"{"sc":1}"#[..])));
        }
        assert!(message("o", "k", "x".repeat(MAX_CARRIED_ENVELOPE + 1).as_bytes()).is_none());
        for bad in [&b"origin"[..], b"o 5 abc", b"o x abc", b"o 3"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_envelope_is_taken_once_and_only_under_its_stamp() {
        let c = Carried::default();
        c.keep("k", Stamp(7), b"env");
        assert_eq!(c.take("k", Stamp(8)), None, "heard something newer");
        assert_eq!(c.usage(), (0, 0), "and forgotten");
        c.keep("k", Stamp(9), b"env");
        c.keep("k", Stamp(10), b"env2");
        assert_eq!(c.usage(), (1, 4));
        assert_eq!(c.take("k", Stamp(10)).as_deref(), Some(&b"env2"[..]));
        assert_eq!(c.take("k", Stamp(10)), None);
        c.keep("j", Stamp(1), b"e");
        c.forget("j");
        assert_eq!(c.usage(), (0, 0));
    }

    #[test]
    fn nothing_is_kept_while_an_own_announcement_of_the_key_is_outstanding() {
        let c = Carried::default();
        c.expect_own("k");
        c.expect_own("k");
        // Redis ran this before our two writes: it arrives before their announcements.
        c.keep("k", Stamp(1), b"older");
        assert_eq!(c.take("k", Stamp(1)), None);
        c.own_heard("k");
        c.keep("k", Stamp(2), b"older");
        assert_eq!(c.take("k", Stamp(2)), None, "one of ours is still to come");
        c.own_heard("k");
        c.keep("k", Stamp(3), b"newer");
        assert_eq!(c.take("k", Stamp(3)).as_deref(), Some(&b"newer"[..]));
        c.own_heard("k"); // an extra one (a write that did not announce, cancelled twice) is harmless
        c.keep("j", Stamp(4), b"other keys are not held back");
        assert!(c.take("j", Stamp(4)).is_some());
    }

    /// Kept before a write of ours was sent (another process's announcement, heard while no
    /// write of ours was outstanding): older than that write, so never served after it. A
    /// load's write-back does not change the key's stamp, so the stamp alone would not tell.
    #[test]
    fn an_own_write_forgets_what_was_carried_for_its_key() {
        let c = Carried::default();
        c.keep("k", Stamp(1), b"older");
        c.keep("j", Stamp(1), b"other");
        c.expect_own("k");
        assert_eq!(c.take("k", Stamp(1)), None, "older than our write");
        assert_eq!(c.take("j", Stamp(1)).as_deref(), Some(&b"other"[..]));
        assert_eq!(c.usage(), (0, 0));
    }

    #[test]
    fn too_many_unheard_own_announcements_turn_carrying_off() {
        let c = Carried::default();
        for i in 0..=MAX_OWN_PENDING {
            c.expect_own(&format!("k{i}"));
        }
        c.keep("fresh", Stamp(1), b"e");
        assert_eq!(c.take("fresh", Stamp(1)), None);
    }

    #[test]
    fn it_stays_within_its_bounds() {
        let c = Carried::default();
        let big = vec![b'x'; MAX_CARRIED_ENVELOPE];
        for i in 0..(MAX_CARRIED_KEYS * 2) {
            c.keep(&format!("k{i}"), Stamp(i as u64), &big);
            let (keys, bytes) = c.usage();
            assert!(keys <= MAX_CARRIED_KEYS && bytes <= MAX_CARRIED_BYTES);
        }
    }
}
