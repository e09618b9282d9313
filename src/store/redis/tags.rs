//! `deleteByTag`, `expireByTag` and `clear` in Redis, and whether an entry read from Redis is
//! still alive (and, tag-expired, stale).
//!
//! Neither touches an entry. The namespace clock (`HINCRBY <ns>:meta clock`) numbers them; a
//! deleteByTag records its clock at each tag's key (`tag.lua`), a clear as the namespace's clear
//! clock (`clear.lua`); both announce it on the bus. An entry is born at the clock its load began
//! at (read at the load's gate, before the loader runs) or its set was made at, and is dead once
//! a clear, or a deleteByTag of one of its tags, has a later clock. So a load that began before
//! either writes a result that is dead on arrival (and not even sent when this process already
//! knows), and the invalidation costs one key per tag whatever the number of entries carrying
//! it. An expireByTag records its clock at each tag's stale key (`<ns>:stale:{<tag>}`, on the tag
//! key's slot): an entry born before it is stale, served while one refresh runs. On one server a
//! call's tags are recorded by one script (`tags.lua`), so a list of any length is never partly
//! applied; on a Cluster each tag's records are on its own slot, written by `tag.lua` each.
//!
//! An entry read from Redis is checked against the clear clock and the tag clocks heard on the
//! bus (in the inbox) and, for a tagged entry, against its tags' keys (one GET each, sent
//! together), since deletions made before this process subscribed were never heard here. While
//! the bus is down, the clear clock is read from Redis too.
//!
//! Every clock is read with an echo pipelined after it (on a Cluster a keyed one; see `Echo`): a
//! clock read off another command's reply could make an entry born after a deletion it predates
//! (a moved number in front of the namespace clock's read) or older than one that killed it (in
//! front of a tag key's), so a deleted entry would be served. A moved reply leaves the clock
//! unknown: the read counts as Redis unavailable and the connection is replaced.
//!
//! `clear` then sweeps the namespace's value keys (SCAN, on every master of a cluster, one batch
//! at a time), deleting the entries born before it, to give their memory back and so that a
//! process which has not heard the clear yet finds nothing to serve; each step echoed too.

use std::time::Instant;

use futures_util::future::join_all;

use super::envelopes::{invoke_echoed, query_echoed, Echo};
use super::topology::{masters_of, Node};
use super::{RedisTier, Unavailable};
use crate::clock::{Clock, SystemClock};
use crate::envelope::Envelope;
use crate::inbox::{tag_bucket, Tentative};

/// Keys asked of SCAN per step of the sweep (memory stays bounded by one batch).
const SWEEP_BATCH: u64 = 1_000;

/// How many steps of one sweep may be found out of step (each replaced and run again) before
/// the sweep gives up.
const SWEEP_REDOS: u32 = 3;

/// How a `deleteByTag` failed in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagFailure {
    /// Redis gave no clock: nothing happened there.
    NotTaken,
    /// The clock advanced, but a tag's key may not have been written.
    Partial,
}

/// What a tag method records: a deleteByTag's death, or an expireByTag's staleness with the end
/// of its window as text (whole epoch ms, `-` for none), as records and messages spell it.
#[derive(Debug, Clone, PartialEq)]
enum TagMark {
    Dead,
    Stale(String),
}

impl TagMark {
    fn of(stale_until: Option<f64>) -> TagMark {
        match stale_until {
            None => TagMark::Dead,
            Some(u) if u.is_finite() => TagMark::Stale(format!("{}", u.max(0.0).floor() as u64)),
            Some(_) => TagMark::Stale("-".to_string()),
        }
    }

    fn is_stale(&self) -> bool {
        matches!(self, TagMark::Stale(_))
    }

    fn op(&self) -> &'static str {
        if self.is_stale() {
            "expireByTag"
        } else {
            "deleteByTag"
        }
    }

    /// The announcement after the bus prefix: `<clock> <tag>`, or `<clock> <until> <tag>`.
    fn message(&self, clock: u64, tag: &str) -> String {
        match self {
            TagMark::Dead => format!("{clock} {tag}"),
            TagMark::Stale(until) => format!("{clock} {until} {tag}"),
        }
    }
}

/// A window's end as records and messages spell it (`-`, or anything unreadable: none).
pub(super) fn until_of(text: &str) -> f64 {
    text.parse::<u64>().map_or(f64::INFINITY, |u| u as f64)
}

/// An expireByTag's record (`<clock>` or `<clock> <until>`): its clock and its window's end.
fn stale_record_of(text: Option<String>) -> (u64, f64) {
    let Some(text) = text else {
        return (0, f64::INFINITY);
    };
    let mut parts = text.split_whitespace();
    let clock = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    (clock, parts.next().map_or(f64::INFINITY, until_of))
}

/// A clock stored as text (a missing or foreign value counts as 0).
fn clock_of(text: Option<String>) -> u64 {
    text.and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

/// `text` with glob's special characters escaped, for SCAN MATCH.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for ch in text.chars() {
        if matches!(ch, '\\' | '*' | '?' | '[' | ']') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

impl RedisTier {
    /// The namespace clock now, as Redis has it (also known here from then on); `None` when
    /// Redis could not be asked or its reply was moved (the caller's entry is then born at the
    /// clock known here, never later than Redis's).
    pub async fn clock_now(&self, key: &str) -> Option<u64> {
        let mut read = redis::cmd("HGET");
        read.arg(self.meta_key()).arg("clock");
        let echo = self.echo(self.meta_key());
        let clock = self
            .run("get", key, |mut c| async move {
                query_echoed::<Option<String>>(&read, &mut c, echo).await
            })
            .await
            .ok()?;
        let Some(clock) = clock else {
            self.misdelivered("get", key);
            return None;
        };
        self.clock_read(key, clock).await
    }

    /// The namespace clock Redis answered (`HGET <ns>:meta clock`, here or inside a script), as
    /// `clock_now` takes it: known here from then on, or raised first if Redis lost it.
    pub(super) async fn clock_read(&self, key: &str, clock: Option<String>) -> Option<u64> {
        let clock = clock_of(clock);
        if clock < self.inbox.clock() {
            // Redis lost the clock (see advance.lua): raise it before anything is born here.
            return self.advance_clock("get", key, 0).await.ok();
        }
        self.inbox.observe_clock(clock);
        Some(clock)
    }

    /// Moves Redis's namespace clock to at least the one known here, plus `step`
    /// (`advance.lua`); the result is known here from then on.
    async fn advance_clock(
        &self,
        op: &'static str,
        key: &str,
        step: u64,
    ) -> Result<u64, Unavailable> {
        let meta = self.meta_key();
        let known = self.inbox.clock();
        let echo = self.echo(&meta);
        let clock = self
            .run(op, key, |mut c| async move {
                let mut call = self.scripts.advance.key(&meta);
                call.arg(known).arg(step);
                invoke_echoed::<u64>(&call, &mut c, echo).await
            })
            .await?;
        let Some(clock) = clock else {
            // Out of step: the clock Redis gave is unknown, so nothing may be born at it (a
            // deleteByTag counts as not taken: no tag key was written).
            self.misdelivered(op, key);
            return Err(Unavailable);
        };
        self.inbox.observe_clock(clock);
        Ok(clock)
    }

    /// Whether an entry born at `born` carrying `tags`, read from Redis for `key`, is still
    /// alive: no clear, and no deleteByTag of one of its tags, since it was born.
    ///
    /// An entry alive but tag-expired (an expireByTag of one of its tags since it was born) has
    /// its freshness ended in `envelope` (its freshUntil becomes now): it is served stale and
    /// refreshed, as in process; a tag-expired not-found is dead (loaded again).
    pub(super) async fn alive(
        &self,
        key: &str,
        envelope: &mut Envelope,
        tags: &[String],
    ) -> Result<bool, Unavailable> {
        let alive = self.alive_at(key, envelope.born, tags).await?;
        if alive && !tags.is_empty() {
            let buckets: Vec<u16> = tags.iter().map(|t| tag_bucket(t)).collect();
            if self.inbox.expired(envelope.born, &buckets) {
                // A not-found has no value to serve stale: loaded again, as in process.
                if envelope.negative {
                    return Ok(false);
                }
                let now = SystemClock.now_ms().floor();
                envelope.fresh_until = envelope.fresh_until.min(now);
            }
        }
        Ok(alive)
    }

    async fn alive_at(&self, key: &str, born: u64, tags: &[String]) -> Result<bool, Unavailable> {
        let buckets: Vec<u16> = tags.iter().map(|t| tag_bucket(t)).collect();
        let now = SystemClock.now_ms();
        if self.inbox.gone(born, &buckets, now) {
            return Ok(false);
        }
        let bus_up = self.bus_up();
        if tags.is_empty() && bus_up {
            return Ok(true);
        }
        // `Ok(None)`: the reply was moved. A key of another type holds no clock.
        let clock_at = |read: redis::Cmd, redis_key: &str| {
            let echo = self.echo(redis_key);
            self.run("get", key, |mut c| async move {
                match query_echoed::<Vec<Option<String>>>(&read, &mut c, echo).await {
                    Err(e) if e.code() == Some("WRONGTYPE") => Ok(Some(Vec::new())),
                    other => other,
                }
            })
        };
        // A tag's deleteByTag and expireByTag records share its slot: one MGET each.
        let reads = tags.iter().map(|tag| {
            let tkey = self.tag_key(tag);
            let mut read = redis::cmd("MGET");
            read.arg(&tkey).arg(self.tag_stale_key(tag));
            clock_at(read, &tkey)
        });
        let cleared = async {
            if bus_up {
                return Ok(Some(None));
            }
            let mut read = redis::cmd("HMGET");
            let meta = self.meta_key();
            read.arg(&meta).arg("cleared");
            clock_at(read, &meta)
                .await
                .map(|c| c.map(|mut c| Some(c.pop().flatten())))
        };
        let (clocks, cleared) = tokio::join!(join_all(reads), cleared);
        let clocks: Vec<Option<Vec<Option<String>>>> =
            clocks.into_iter().collect::<Result<_, _>>()?;
        let (Some(cleared), true) = (cleared?, clocks.iter().all(Option::is_some)) else {
            // Out of step: a clock is unknown, so whether the entry was deleted is too.
            self.misdelivered("get", key);
            return Err(Unavailable);
        };
        if let Some(cleared) = cleared {
            self.inbox.clear_at(clock_of(cleared));
        }
        for (bucket, records) in buckets.iter().zip(clocks.into_iter().flatten()) {
            // Known here from now on: a deletion or expiry that did happen (only ever
            // conservative).
            let mut records = records.into_iter();
            self.inbox
                .invalidate_tag(*bucket, clock_of(records.next().flatten()));
            let (stale, until) = stale_record_of(records.next().flatten());
            if stale > 0 {
                self.inbox.stale_tag(*bucket, stale, until, now);
            }
        }
        Ok(!self.inbox.gone(born, &buckets, now))
    }

    /// `deleteByTag(tags)` (`stale_until: None`) or `expireByTag(tags)` (its window's end, epoch
    /// ms, infinity for none) in Redis, already applied here: advances the namespace clock,
    /// records it at each tag's record key and announces it. `Err(NotTaken)`: Redis gave no
    /// clock, so nothing happened there; the caller keeps the effect here and puts its marks
    /// back (`Cache::revert_tags`, on the thread that owns the in-process tier). `Err(Partial)`:
    /// the clock advanced but a tag's record may not have been written (a Cluster only). The
    /// caller rejects with ERR_REDIS either way. Run it through `in_order_global`.
    ///
    /// On one server (or a Sentinel's master) every tag goes in one script (`tags.lua`), so a
    /// list of any length is applied whole or not at all. On a Cluster each tag's records are on
    /// its own slot: the clock advances first, then each tag's record is written on its node.
    pub async fn mark_tags(
        &self,
        tags: &[String],
        stale_until: Option<f64>,
    ) -> Result<(), TagFailure> {
        let mark = TagMark::of(stale_until);
        if !self.link.topology.is_cluster() {
            return self.mark_tags_at_once(tags, &mark).await;
        }
        let op = mark.op();
        let first = tags.first().map_or("", String::as_str);
        let clock = self.advance_clock(op, first, 1).await;
        let Ok(clock) = clock else {
            return Err(TagFailure::NotTaken);
        };
        self.heard_tags(tags, clock, &mark);
        let px = self.tag_key_px();
        let now = SystemClock.now_ms().floor();
        let mark = &mark;
        let writes = tags.iter().map(|tag| {
            let keys = (self.tag_record_key(tag, mark), self.tag_key(tag));
            let mut msg = self.bus.tag_prefix(mark.is_stale());
            msg.extend_from_slice(mark.message(clock, tag).as_bytes());
            let echo = self.echo(&keys.0);
            self.run(op, tag, |mut c| async move {
                let mut call = self.scripts.tag.key(&keys.0);
                if let TagMark::Stale(until) = mark {
                    call.key(&keys.1);
                    call.arg(clock).arg(self.bus.channel()).arg(msg).arg(px);
                    call.arg(until).arg(now as u64);
                } else {
                    call.arg(clock).arg(self.bus.channel()).arg(msg).arg(px);
                }
                invoke_echoed::<i64>(&call, &mut c, echo).await
            })
        });
        let written = join_all(writes).await;
        if written.contains(&Ok(None)) {
            // Out of step: whether that tag's key was written is unknown.
            self.misdelivered(op, first);
            return Err(TagFailure::Partial);
        }
        if written.iter().any(Result::is_err) {
            return Err(TagFailure::Partial);
        }
        Ok(())
    }

    /// `mark_tags` where every key is on one server: one `tags.lua` call for the whole list.
    async fn mark_tags_at_once(&self, tags: &[String], mark: &TagMark) -> Result<(), TagFailure> {
        let op = mark.op();
        let first = tags.first().map_or("", String::as_str);
        let meta = self.meta_key();
        let known = self.inbox.clock();
        let px = self.tag_key_px();
        let now = SystemClock.now_ms().floor();
        let echo = self.echo(&meta);
        let clock = self
            .run(op, first, |mut c| async move {
                let mut call = self.scripts.tags.key(&meta);
                for tag in tags {
                    call.key(self.tag_record_key(tag, mark));
                    if mark.is_stale() {
                        call.key(self.tag_key(tag));
                    }
                }
                let until = match mark {
                    TagMark::Stale(until) => until.as_str(),
                    TagMark::Dead => "-",
                };
                call.arg(known)
                    .arg(px)
                    .arg(self.bus.channel())
                    .arg(self.bus.tag_prefix(mark.is_stale()))
                    .arg(if mark.is_stale() { "1" } else { "0" })
                    .arg(until)
                    .arg(now as u64);
                for tag in tags {
                    call.arg(tag.as_str());
                }
                invoke_echoed::<u64>(&call, &mut c, echo).await
            })
            .await;
        match clock {
            Ok(Some(clock)) => {
                self.heard_tags(tags, clock, mark);
                Ok(())
            }
            Ok(None) => {
                // Out of step: the script may have run, at a clock unknown here; the marks here
                // stay (entries dead or stale, never wrongly fresh).
                self.misdelivered(op, first);
                Err(TagFailure::Partial)
            }
            Err(Unavailable) => Err(TagFailure::NotTaken),
        }
    }

    /// Marks `tags` here at `clock`, as their announcements will.
    fn heard_tags(&self, tags: &[String], clock: u64, mark: &TagMark) {
        self.inbox.observe_clock(clock);
        let now = SystemClock.now_ms();
        for tag in tags {
            match mark {
                TagMark::Stale(until) => {
                    self.inbox
                        .stale_tag(tag_bucket(tag), clock, until_of(until), now)
                }
                TagMark::Dead => self.inbox.invalidate_tag(tag_bucket(tag), clock),
            }
        }
    }

    /// The key a deleteByTag (or an expireByTag) of `tag` records its clock at.
    fn tag_record_key(&self, tag: &str, mark: &TagMark) -> String {
        if mark.is_stale() {
            self.tag_stale_key(tag)
        } else {
            self.tag_key(tag)
        }
    }

    /// How long a deleteByTag's record lives in Redis (ms): `tagTtl`, the longest an entry
    /// carrying tags lives after its birth, plus the slack between the clocks the two are
    /// counted on. The entry's hardUntil counts from its load's start here, which follows the
    /// gate's read of the namespace clock by at most that reply's trip; its PX counts from when
    /// Redis applies its write, a trip after it was computed. The record's PX counts from when
    /// Redis applied the deletion, after that read. Each trip is bounded by commandTimeout (a
    /// later reply is abandoned), so two of them, and a second for the scheduling in between.
    fn tag_key_px(&self) -> u64 {
        let slack = 2 * self.link.command_timeout.as_millis() as u64 + 1_000;
        self.policies.tag_ttl_ms.saturating_add(slack)
    }

    /// `clear()` in Redis, already applied here as `tentative`: advances the namespace clock,
    /// records it as the clear clock and announces it. Returns the clear's clock (for
    /// [`RedisTier::sweep`]). Run it through `in_order_global`.
    pub async fn clear(&self, tentative: &Tentative) -> Result<u64, Unavailable> {
        let meta = self.meta_key();
        let prefix = self.bus.clear_prefix();
        let known = self.inbox.clock();
        let echo = self.echo(&meta);
        let clock = self
            .run("clear", "", |mut c| async move {
                let mut call = self.scripts.clear.key(&meta);
                call.arg(self.bus.channel()).arg(prefix).arg(known);
                invoke_echoed::<u64>(&call, &mut c, echo).await
            })
            .await;
        let clock = match clock {
            Ok(Some(c)) => c,
            Ok(None) => {
                // Out of step: the clear may have run in Redis, at a clock unknown here. The
                // effect here stays (entries dead, never wrongly alive) and nothing is swept.
                self.misdelivered("clear", "");
                return Err(Unavailable);
            }
            Err(Unavailable) => {
                self.inbox.revert(tentative);
                return Err(Unavailable);
            }
        };
        self.inbox.observe_clock(clock);
        self.inbox.clear_at(clock);
        Ok(clock)
    }

    /// Deletes the namespace's entries born before `clock` (a clear's), scanning its value keys
    /// (`<ns>:v:{…}`, `<ns>:vx:{…}`) on every node, one batch at a time. Entries written since
    /// stay; other namespaces are never touched. Returns how many were deleted.
    ///
    /// Every step proves its replies are its own (see `Echo`): a SCAN answered by another
    /// command's reply could end the sweep early (a cursor of 0, no keys) and leave entries that
    /// a process which has not heard the clear yet would serve; a node list read off another
    /// reply could skip nodes. A step out of step replaces the connection and runs again from
    /// the last cursor proven (the sweep script is idempotent), at most `SWEEP_REDOS` times in
    /// one sweep; then the sweep fails as on any Redis failure (the entries stay dead by the
    /// clear clock, and are reported).
    pub async fn sweep(&self, clock: u64) -> Result<u64, Unavailable> {
        let mut redos = 0;
        let mut out_of_step = || {
            self.misdelivered("clear", "");
            redos += 1;
            if redos > SWEEP_REDOS {
                Err(Unavailable)
            } else {
                Ok(())
            }
        };
        let nodes = loop {
            match self.sweep_nodes().await? {
                Some(nodes) => break nodes,
                None => out_of_step()?,
            }
        };
        let ns = &self.policies.namespace;
        let pattern = format!("{}:v*", glob_escape(ns));
        let prefixes = (format!("{ns}:v:{{"), format!("{ns}:vx:{{"));
        let mut deleted = 0;
        for node in nodes {
            let mut cursor = 0u64;
            loop {
                let Some((next, swept)) = self
                    .sweep_step(&node, cursor, clock, &pattern, &prefixes)
                    .await?
                else {
                    out_of_step()?;
                    continue;
                };
                deleted += swept;
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    /// The nodes the sweep visits: the one server, or every master of a cluster (`CLUSTER
    /// SLOTS`, echoed on the node that answers it). `Ok(None)`: the reply was moved.
    async fn sweep_nodes(&self) -> Result<Option<Vec<Node>>, Unavailable> {
        if !self.link.topology.is_cluster() {
            return Ok(Some(vec![None]));
        }
        self.run("clear", "", |mut c| async move {
            let echo = Echo::plain();
            let mut pipe = redis::pipe();
            pipe.ignore_errors().cmd("CLUSTER").arg("SLOTS");
            echo.push(&mut pipe);
            let replies = c.pipeline_anywhere(&pipe).await?;
            let Some(slots) = echo.checked(replies).and_then(|r| r.into_iter().next()) else {
                return Ok(None);
            };
            let slots = slots.extract_error()?;
            let masters = masters_of(&slots).map_err(|why| {
                redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "the CLUSTER SLOTS reply was refused",
                    why.to_string(),
                ))
            })?;
            Ok(Some(masters))
        })
        .await
    }

    /// One step of the sweep on `node`: a SCAN from `cursor` with an `ECHO` after it on the
    /// node's connection, then the sweep script on each of the namespace's keys it names (each
    /// echoed, keyed on a cluster). The next cursor and how many entries were deleted, or
    /// `Ok(None)` when a reply was out of step.
    async fn sweep_step(
        &self,
        node: &Node,
        cursor: u64,
        clock: u64,
        pattern: &str,
        (plain, hex): &(String, String),
    ) -> Result<Option<(u64, u64)>, Unavailable> {
        let scanned = self
            .run("clear", "", |mut c| async move {
                let echo = Echo::plain();
                let mut pipe = redis::pipe();
                pipe.ignore_errors()
                    .cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SWEEP_BATCH);
                echo.push(&mut pipe);
                let replies = c.pipeline_on(&pipe, node).await?;
                let Some(reply) = echo.checked(replies).and_then(|r| r.into_iter().next()) else {
                    return Ok(None);
                };
                let page: (u64, Vec<Vec<u8>>) = redis::from_redis_value(reply.extract_error()?)?;
                Ok(Some(page))
            })
            .await?;
        let Some((next, keys)) = scanned else {
            return Ok(None);
        };
        let ours = keys
            .iter()
            .filter(|k| k.starts_with(plain.as_bytes()) || k.starts_with(hex.as_bytes()));
        let swept = join_all(ours.map(|vkey| {
            let echo = self.echo(vkey);
            self.run("clear", "", move |mut c| async move {
                let mut call = self.scripts.sweep.key(vkey.as_slice());
                call.arg(clock);
                invoke_echoed::<i64>(&call, &mut c, echo).await
            })
        }))
        .await;
        let mut deleted = 0;
        let mut moved = false;
        for r in swept {
            match r? {
                Some(n) => deleted += n.max(0) as u64,
                None => moved = true,
            }
        }
        Ok((!moved).then_some((next, deleted)))
    }

    /// Learns the namespace clock and the clear clock, as the bus subscribes: what was decided
    /// before this subscription was never heard here.
    pub(super) async fn sync_namespace(&self) {
        let started = Instant::now();
        let meta = self.meta_key();
        let echo = self.echo(&meta);
        let read = async {
            let mut conn = self.link.get(started).await?;
            let mut read = redis::cmd("HMGET");
            read.arg(&meta).arg("clock").arg("cleared");
            query_echoed::<(Option<String>, Option<String>)>(&read, &mut conn.inner, echo).await
        };
        match tokio::time::timeout(self.link.command_timeout, read).await {
            Ok(Ok(None)) => self.misdelivered("bus", ""),
            Ok(Ok(Some((clock, cleared)))) => {
                let clock = clock_of(clock);
                if clock < self.inbox.clock() {
                    // Redis lost the clock while this instance was away (see advance.lua).
                    let _ = self.advance_clock("bus", "", 0).await;
                }
                self.inbox.observe_clock(clock);
                self.inbox.clear_at(clock_of(cleared));
            }
            Ok(Err(e)) => {
                self.stats.redis_errors.incr();
                self.report(
                    "bus",
                    None,
                    format!("Redis read of the namespace clock failed: {e}"),
                );
            }
            Err(_) => {
                self.stats.redis_errors.incr();
                self.report(
                    "bus",
                    None,
                    "Redis read of the namespace clock timed out".to_string(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_of_a_namespace_are_escaped() {
        assert_eq!(glob_escape("app"), "app");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn stale_records_and_marks_spell_their_window() {
        assert_eq!(stale_record_of(Some("7".into())), (7, f64::INFINITY));
        assert_eq!(stale_record_of(Some("7 1500".into())), (7, 1500.0));
        assert_eq!(stale_record_of(Some("x".into())), (0, f64::INFINITY));
        assert_eq!(stale_record_of(None), (0, f64::INFINITY));
        assert_eq!(TagMark::of(None), TagMark::Dead);
        assert_eq!(
            TagMark::of(Some(f64::INFINITY)).message(3, "a b"),
            "3 - a b"
        );
        assert_eq!(TagMark::of(Some(1500.7)).message(3, "t"), "3 1500 t");
        assert_eq!(until_of("-"), f64::INFINITY);
    }

    #[test]
    fn clocks_read_as_numbers_or_zero() {
        assert_eq!(clock_of(Some("42".into())), 42);
        assert_eq!(clock_of(Some("nope".into())), 0);
        assert_eq!(clock_of(None), 0);
    }
}
