//! The invalidation bus: one pub/sub subscriber per cache on `<ns>:bus:<db>`. An announcement
//! (`<origin> <key>`) drops other processes' in-process copies of the key (through the inbox) and
//! wakes the lock waiters of the key. Losing or regaining the subscription wakes every waiter
//! too, since announcements may have been missed meanwhile.
//!
//! Namespace-wide messages start with the byte 0xFF, which no UTF-8 key can start with (older
//! instances, which read messages as UTF-8, ignore them): `0xFF T <origin> <clock> <tag>` (a
//! deleteByTag), `0xFF S <origin> <clock> <until> <tag>` (an expireByTag; until `-` for none) and `0xFF C <origin> <clock>`
//! (a clear). Each subscription first learns the
//! namespace clock and the clear clock, which were decided before it (see `tags.rs`).
//!
//! This part owns what the bus says and hears: the channel, this instance's origin, the
//! messages' formats, what a message does to the inbox and to the carried envelopes, and
//! whether the first subscription attempt has ended. The subscription itself runs on the
//! tier's connections (`subscriber.rs`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::carried::{self, Carried, CARRIED_MESSAGE};
use crate::inbox::{tag_bucket, Inbox};

/// The bus pings this often when no message arrives, to notice a Redis that stopped answering.
pub const BUS_PING_INTERVAL: Duration = Duration::from_secs(1);

/// First byte of a namespace-wide bus message: never the first byte of a key's announcement,
/// since keys are UTF-8 and 0xFF never appears in UTF-8 (an older instance, which reads
/// messages as UTF-8, ignores these).
pub const NAMESPACE_MESSAGE: u8 = 0xFF;

/// The channel of one namespace in one database: apps on different databases of one server
/// never invalidate each other.
pub fn channel(namespace: &str, db: i64) -> String {
    format!("{namespace}:bus:{db}")
}

pub struct Bus {
    channel: String,
    /// Names this cache instance on the bus, so it ignores its own announcements.
    origin: String,
    /// What announcements invalidate.
    inbox: Arc<Inbox>,
    /// Envelopes other processes' announcements carried, for the next read of their key.
    carried: Carried,
    /// Set once the first subscription attempt has ended (either way): the first commands wait
    /// for it, so nothing is cached before the bus could announce changes to it.
    attempted: watch::Sender<bool>,
}

impl Bus {
    pub fn new(channel: String, origin: String, inbox: Arc<Inbox>) -> Self {
        let (attempted, _) = watch::channel(false);
        Bus {
            channel,
            origin,
            inbox,
            carried: Carried::default(),
            attempted,
        }
    }

    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The envelopes announcements carried (see `carried.rs`).
    pub fn carried(&self) -> &Carried {
        &self.carried
    }

    /// The announcement of a change of `key`.
    pub fn announcement(&self, key: &str) -> String {
        format!("{} {key}", self.origin)
    }

    /// The announcement of a load's result, as `write_back.lua` is given it: the carried
    /// message's prefix (its first byte `CARRIED_MESSAGE`), to which the script appends the
    /// envelope it writes, if that is small and untagged (see `carried.rs`); else the plain
    /// announcement.
    pub fn carrying_announcement(&self, key: &str, envelope_len: usize, tagged: bool) -> Vec<u8> {
        (!tagged)
            .then(|| carried::prefix(&self.origin, key, envelope_len))
            .flatten()
            .unwrap_or_else(|| self.announcement(key).into_bytes())
    }

    /// A deleteByTag's announcement of a tag (`stale`: an expireByTag's), less the clock and
    /// the tag that follow it (`<clock> <tag>`).
    pub fn tag_prefix(&self, stale: bool) -> Vec<u8> {
        let mut msg = vec![NAMESPACE_MESSAGE];
        let kind = if stale { 'S' } else { 'T' };
        msg.extend_from_slice(format!("{kind} {} ", self.origin).as_bytes());
        msg
    }

    /// A clear's announcement, less the clock `clear.lua` appends.
    pub fn clear_prefix(&self) -> Vec<u8> {
        let mut prefix = vec![NAMESPACE_MESSAGE];
        prefix.extend_from_slice(format!("C {} ", self.origin).as_bytes());
        prefix
    }

    /// Takes in a message heard on the channel. Answers the key whose lock waiters should look
    /// again (the key's holder may have written or let go).
    pub fn hear<'p>(&self, payload: &'p [u8]) -> Option<&'p str> {
        if let Some(rest) = payload.strip_prefix(&[NAMESPACE_MESSAGE]) {
            self.hear_namespace_message(rest);
            return None;
        }
        if let Some(rest) = payload.strip_prefix(&[CARRIED_MESSAGE]) {
            let (origin, key, envelope) = carried::parse(rest)?;
            if origin != self.origin {
                let stamp = self.inbox.invalidate_stamped(key);
                self.carried.keep(key, stamp, envelope);
            } else {
                self.carried.own_heard(key);
            }
            return Some(key);
        }
        let text = std::str::from_utf8(payload).ok()?;
        let (origin, key) = text.split_once(' ')?;
        if origin != self.origin {
            self.inbox.invalidate(key);
            self.carried.forget(key);
        } else {
            self.carried.own_heard(key);
        }
        Some(key)
    }

    /// A deleteByTag (`T <origin> <clock> <tag>`), expireByTag (`S <origin> <clock> <until> <tag>`)
    /// or clear
    /// (`C <origin> <clock>`) anywhere,
    /// this instance's own included (the clock it was given may be newer than the mark it made).
    fn hear_namespace_message(&self, text: &[u8]) {
        let Ok(text) = std::str::from_utf8(text) else {
            return;
        };
        let mut parts = text.splitn(4, ' ');
        let (Some(kind), Some(_origin), Some(clock)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Ok(clock) = clock.parse::<u64>() else {
            return;
        };
        if kind == "S" {
            // `S <origin> <clock> <until> <tag>` (until `-`: none).
            let Some((until, tag)) = parts.next().and_then(|rest| rest.split_once(' ')) else {
                return;
            };
            self.inbox.observe_clock(clock);
            let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
            self.inbox
                .stale_tag(tag_bucket(tag), clock, super::tags::until_of(until), now);
            return;
        }
        match (kind, parts.next()) {
            ("T", Some(tag)) => {
                self.inbox.observe_clock(clock);
                self.inbox.invalidate_tag(tag_bucket(tag), clock);
            }
            ("C", None) => {
                self.inbox.observe_clock(clock);
                self.inbox.clear_at(clock);
                // Untagged in-process entries are not checked against the clear clock on a
                // hit: they are dropped here (this instance's own too, in case a read made
                // between its clear call and now was kept).
                self.inbox.invalidate_all();
            }
            _ => {}
        }
    }

    /// Subscribed again after a gap: announcements may have been missed meanwhile. Every
    /// carried envelope goes; the in-process copies are checked against Redis (`verify.rs`),
    /// unless a clear happened meanwhile (`cleared`): then every copy goes.
    pub fn missed_announcements(&self, cleared: bool) {
        if cleared {
            self.inbox.invalidate_all();
        } else {
            self.inbox.verify_all();
        }
        self.carried.clear();
    }

    /// The first subscription attempt has ended (calls waiting for it go on).
    pub fn attempted(&self) {
        self.attempted.send_replace(true);
    }

    /// Whether the first subscription attempt has ended, and, if not, what tells when it has.
    pub fn attempt(&self) -> Option<watch::Receiver<bool>> {
        (!*self.attempted.borrow()).then(|| self.attempted.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(origin: &str) -> (Bus, Arc<Inbox>) {
        let inbox = Arc::new(Inbox::default());
        (
            Bus::new(channel("app", 0), origin.to_string(), inbox.clone()),
            inbox,
        )
    }

    #[test]
    fn another_origins_announcement_invalidates_and_wakes_its_key_and_ours_only_wakes() {
        let (bus, inbox) = bus("me");
        let before = inbox.stamp("k");
        assert_eq!(bus.hear(b"me k"), Some("k"));
        assert_eq!(
            inbox.stamp("k"),
            before,
            "our own announcement invalidates nothing"
        );
        assert_eq!(bus.hear(b"them k"), Some("k"));
        assert_ne!(inbox.stamp("k"), before);
        assert_eq!(bus.hear(b"no-space"), None);
        assert_eq!(bus.hear(&[0xC3, 0x28, b' ', b'k']), None, "not UTF-8");
    }

    #[test]
    fn namespace_messages_move_the_clock_and_wake_no_key() {
        let (bus, inbox) = bus("me");
        let mut tagged = bus.tag_prefix(false);
        tagged.extend_from_slice(b"7 t");
        assert_eq!(tagged[0], NAMESPACE_MESSAGE);
        assert_eq!(bus.hear(&tagged), None);
        assert_eq!(inbox.clock(), 7);
        assert_eq!(inbox.tag_clock(tag_bucket("t")), 7);
        let mut staled = bus.tag_prefix(true);
        staled.extend_from_slice(b"8 - t");
        assert_eq!(bus.hear(&staled), None);
        assert_eq!(inbox.clock(), 8);
        assert_eq!(inbox.tag_stale_clock(tag_bucket("t")), 8);
        assert_eq!(inbox.tag_clock(tag_bucket("t")), 7, "stale, not dead");
        let mut cleared = bus.clear_prefix();
        cleared.extend_from_slice(b"9");
        assert_eq!(bus.hear(&cleared), None);
        assert_eq!(inbox.clock(), 9);
        tagged.truncate(3);
        assert_eq!(bus.hear(&tagged), None, "cut short: ignored");
        assert_eq!(inbox.clock(), 9);
    }

    #[test]
    fn the_first_attempt_is_waited_for_until_it_ends() {
        let (bus, _) = bus("me");
        let rx = bus.attempt().expect("not attempted yet");
        bus.attempted();
        assert!(*rx.borrow());
        assert!(bus.attempt().is_none());
    }

    #[test]
    fn channels_name_the_database() {
        assert_eq!(channel("app", 0), "app:bus:0");
        assert_eq!(channel("app", 3), "app:bus:3");
    }
}
