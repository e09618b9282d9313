//! Many keys at once (`getMany`, `getOrLoadMany`): a batch's reads go as one `MGET` and an
//! `ECHO` on a single server (or a Sentinel's primary), as one pipeline of GETs per node in a
//! Cluster, ending with one keyed echo (`Echo`) routed by a key that node serves; its lock bids
//! in one pipeline per node, echoed the same way; all sent at once. So a batch of any size
//! costs about one round trip per node for its reads and one for its locks, where one key at a
//! time cost one (or two) per key. The lock bids are the single-key path's `cold_gate.lua`, so
//! Lua scripts still touch only the keys they declare, and every envelope is read as the
//! single-key path reads it (its key mark checked against the key it was asked for).
//!
//! A Cluster's keys are grouped by the slot map of our own (`slots`, read by `CLUSTER SLOTS`
//! when none is known since the connection was made): the redis crate routes a pipeline by one
//! slot and keeps its map private. A node pipeline goes to the node serving its echo's key,
//! which serves any key of its slots. A stale map puts a key in the wrong node's pipeline: that
//! node answers MOVED or ASK, the crate sends the whole pipeline where the redirect points
//! (where the other keys are refused in turn) and fails once its retries are spent. Such a
//! pipeline's keys are sent again per slot (one pipeline per slot, which the crate's redirects
//! do serve), the map is read again for the next batch, and the bids the refused pipeline may
//! have won are given back first. Keys of slots the map names no owner for go per slot too.
//!
//! One MGET, not a GET per key: Redis ran 1,000 pipelined GETs in about three times the time of
//! one MGET of the same keys, and the redis crate framed 1,000 replies instead of one. The ECHO
//! after it proves the MGET's reply is the one in its place: an extra reply in front (an old
//! MGET's of these very keys, which the key marks cannot tell) moves the MGET's reply into the
//! echo's place, and the batch is refused. A refused batch replaces the connection and is asked
//! once more on the new one; refused again, its keys are unavailable (a load, unfenced).
//!
//! A batch never waits for a lock another process holds: such a key comes back as
//! [`FirstLook::Wait`], and its caller then waits for it alone (`cold_gate_observed`, notified
//! by the bus) while the keys this process won are loaded at once.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::join_all;
use redis::{ErrorKind, ServerErrorKind, Value};

use super::envelopes::{new_token, usable, Fetched, Misdelivered};
use super::fence::GENERATION_TTL;
use super::gates::{Gate, LockOutcome};
use super::slots::{slot_of_key, SlotMap};
use super::{RedisTier, Unavailable};
use crate::envelope::Serializer;
use crate::inbox::Stamp;

/// What a batch's first look at one key found.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstLook {
    /// Redis had it, or the lock is ours (or Redis could not be asked: an unfenced lead), as
    /// the single-key gate answers.
    Done(Gate, LockOutcome),
    /// Another process holds the key's lock, or the look found a value only the single-key gate
    /// can judge: ask again for this key alone (that gate waits for the holder).
    Wait,
}

/// The reply of `cold_gate.lua` (see the script): `{value or false, fence, state, ms left,
/// mark}` (the pipeline's echo proves its place: the mark is not checked).
enum Look {
    Value,
    Locked(Vec<u8>),
    Held,
}

fn look_of(reply: &Value) -> Option<Look> {
    let Value::Array(items) = reply else {
        return None;
    };
    let generation = match items.get(1) {
        Some(Value::BulkString(b)) => b.clone(),
        Some(Value::SimpleString(s)) => s.clone().into_bytes(),
        _ => Vec::new(),
    };
    Some(match items.get(2) {
        Some(Value::Int(0)) => Look::Value,
        Some(Value::Int(1)) => Look::Locked(generation),
        _ => Look::Held,
    })
}

/// How a Cluster batch's keys are put in pipelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grouping {
    /// One pipeline per node of the slot map (per slot for slots it names no owner for).
    ByNode,
    /// One pipeline per slot: for keys a node pipeline could not serve (a stale map).
    BySlot,
}

/// What one pipeline of a Cluster batch goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Owner {
    Node(u16),
    Slot(u16),
}

/// `which` (indexes of `redis_keys`) grouped by `owner` of their Redis key, in order of first
/// appearance, each group in the order of `which`.
fn grouped(
    redis_keys: &[String],
    which: &[usize],
    owner: impl Fn(u16) -> Owner,
) -> Vec<Vec<usize>> {
    let mut groups: HashMap<Owner, usize> = HashMap::new();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for &i in which {
        let slot = slot_of_key(redis_keys[i].as_bytes());
        let g = *groups.entry(owner(slot)).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[g].push(i);
    }
    out
}

/// One pipeline's outcome.
enum Sent {
    Replies(Vec<Value>),
    /// The echo's place held anything else: out of step.
    OutOfStep,
    /// A node pipeline redirected (MOVED, ASK): not answered.
    Moved,
}

/// A batch's replies: one per Redis key (`Unavailable` for a key of a pipeline that failed, or
/// was not sent), and the keys whose node pipeline was redirected (`Sent::Moved`).
pub(super) struct Piped {
    pub(super) replies: Vec<Result<Value, Unavailable>>,
    pub(super) moved: Vec<usize>,
}

/// A node refused a key of the pipeline as not its own (the crate gave up following).
fn redirected(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    )
}

fn redirect_reply(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if matches!(e.code(), "MOVED" | "ASK"))
}

impl RedisTier {
    /// Whether every value this tier reads is JSON (the JSON serializer's): a batch's values
    /// can then cross to JS as one JSON array text.
    pub fn values_are_json(&self) -> bool {
        self.policies.serializer == Serializer::Json
    }

    /// The pipelines `which` (indexes of `redis_keys`) go in: one on a single server (or a
    /// Sentinel's primary); in a Cluster one per node (`ByNode`, when the slot map is known)
    /// or per slot.
    async fn groups(
        &self,
        redis_keys: &[String],
        which: &[usize],
        grouping: Grouping,
    ) -> Vec<Vec<usize>> {
        if which.is_empty() {
            return Vec::new();
        }
        if !self.link.topology.is_cluster() {
            return vec![which.to_vec()];
        }
        let map = match grouping {
            Grouping::ByNode => self.slot_map().await,
            Grouping::BySlot => None,
        };
        grouped(redis_keys, which, |slot| {
            match map.as_ref().and_then(|m| m.node_of(slot)) {
                Some(node) => Owner::Node(node),
                None => Owner::Slot(slot),
            }
        })
    }

    /// The Cluster's slot map, read (`CLUSTER SLOTS`, one round trip) when none was since the
    /// connection was last replaced or a node last redirected a batch's key. `None`: not
    /// known (Redis unavailable), or the reply was refused (reported; kept refused until the
    /// connection is replaced): the batch goes per slot.
    pub(super) async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        if let Some(known) = self.link.slot_map() {
            return known;
        }
        let at = self.link.replacements();
        let reply = self
            .run("get", "", |mut c| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut c)
                    .await
            })
            .await
            .ok()?;
        let map = match SlotMap::parse(&reply) {
            Ok(map) => Some(Arc::new(map)),
            Err(why) => {
                self.stats.redis_errors.incr();
                self.report(
                    "get",
                    None,
                    format!("Redis's CLUSTER SLOTS reply was refused ({why}): batches go by slot"),
                );
                None
            }
        };
        self.link.keep_slot_map(at, map.clone());
        map
    }

    /// Sends `command(i)` for each `i` of `which` (indexes of `redis_keys`; `keys`: their keys,
    /// for reports) in one pipeline per group (`groups`), all at once, each ending with its
    /// keyed echo (see `Echo`; on a Cluster routed by the group's first key, so the pipeline
    /// goes to the node serving it), as `invoke_echoed` sends one after a single script call.
    /// `Err(Misdelivered)` when a mark is not in its place (an extra reply in front, or one
    /// missing, moved every reply after it onto another key's command).
    pub(super) async fn pipelined(
        &self,
        op: &'static str,
        redis_keys: &[String],
        keys: &[&str],
        which: &[usize],
        grouping: Grouping,
        command: impl Fn(usize) -> redis::Cmd,
    ) -> Result<Piped, Misdelivered> {
        let by_node = grouping == Grouping::ByNode && self.link.topology.is_cluster();
        let groups = self.groups(redis_keys, which, grouping).await;
        let sent = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in group {
                pipe.add_command(command(i));
            }
            let echo = self.echo(&redis_keys[group[0]]);
            let first = keys[group[0]];
            async move {
                self.run(op, first, |mut c| async move {
                    // A node pipeline a node redirected is not a failure to report: its keys
                    // are sent again by slot. Per slot, the crate's own redirects serve it.
                    match echo.send(pipe, &mut c).await {
                        Err(e) if by_node && redirected(&e) => Ok(Sent::Moved),
                        Ok(Some(r)) if by_node && r.iter().any(redirect_reply) => Ok(Sent::Moved),
                        Ok(Some(r)) => Ok(Sent::Replies(r)),
                        Ok(None) => Ok(Sent::OutOfStep),
                        Err(e) => Err(e),
                    }
                })
                .await
            }
        });
        let mut out = Piped {
            replies: vec![Err(Unavailable); redis_keys.len()],
            moved: Vec::new(),
        };
        for (group, sent) in groups.iter().zip(join_all(sent).await) {
            match sent {
                Err(Unavailable) => {}
                Ok(Sent::Moved) => out.moved.extend_from_slice(group),
                Ok(Sent::Replies(replies)) if replies.len() == group.len() => {
                    for (&i, reply) in group.iter().zip(replies) {
                        out.replies[i] = Ok(reply);
                    }
                }
                Ok(_) => {
                    self.misdelivered(op, keys[group[0]]);
                    return Err(Misdelivered);
                }
            }
        }
        if !out.moved.is_empty() {
            self.link.forget_slot_map();
        }
        Ok(out)
    }

    /// Reads many keys' envelopes, as `fetch` reads one: each with the stamp its caller took
    /// (see `fetch`). `count`: reads for `getMany`, each counted as an l2Hit or a miss.
    pub async fn fetch_many(&self, keys: &[(String, Stamp)], count: bool) -> Vec<Fetched> {
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let vkeys: Vec<String> = names.iter().map(|k| self.value_key(k)).collect();
        let mut fetched = None;
        for _ in 0..2 {
            let replies = self.read_values(&vkeys, &names).await;
            if let Some(f) = self.judge_replies(keys, &vkeys, replies).await {
                fetched = Some(f);
                break;
            }
        }
        let fetched = fetched.unwrap_or_else(|| vec![Fetched::Unavailable; keys.len()]);
        if count {
            for f in &fetched {
                match f {
                    Fetched::Found(_) => self.stats.l2_hits.incr(),
                    _ => self.stats.misses.incr(),
                }
            }
        }
        fetched
    }

    /// The replies to reads of `vkeys` (`names`: their keys, for reports): one MGET and an ECHO
    /// off a cluster, one pipeline of GETs and a keyed echo per node in one (per slot for the
    /// keys of a node pipeline a node redirected). `Err(Misdelivered)` when the replies cannot
    /// be the reads' (an echo is not in its place, or the replies are not one per key): the
    /// connection is replaced.
    async fn read_values(
        &self,
        vkeys: &[String],
        names: &[&str],
    ) -> Result<Vec<Result<Value, Unavailable>>, Misdelivered> {
        if self.link.topology.is_cluster() || vkeys.is_empty() {
            // A Cluster: a pipeline of GETs per node, each with its keyed echo; a node
            // pipeline redirected is sent again per slot.
            let get = |i: usize| {
                let mut c = redis::cmd("GET");
                c.arg(&vkeys[i]);
                c
            };
            let all: Vec<usize> = (0..vkeys.len()).collect();
            let mut piped = self
                .pipelined("get", vkeys, names, &all, Grouping::ByNode, get)
                .await?;
            if !piped.moved.is_empty() {
                let mut again = self
                    .pipelined("get", vkeys, names, &piped.moved, Grouping::BySlot, get)
                    .await?;
                for &i in &piped.moved {
                    piped.replies[i] = std::mem::replace(&mut again.replies[i], Err(Unavailable));
                }
            }
            return Ok(piped.replies);
        }
        let echo = self.echo(&vkeys[0]);
        let sent = self
            .run("get", names[0], |mut c| {
                let mut pipe = redis::pipe();
                pipe.ignore_errors().cmd("MGET").arg(vkeys);
                async move { echo.send(pipe, &mut c).await }
            })
            .await;
        let Ok(replies) = sent else {
            return Ok(vec![Err(Unavailable); vkeys.len()]);
        };
        match replies.and_then(|r| r.into_iter().next()) {
            Some(Value::Array(values)) if values.len() == vkeys.len() => {
                Ok(values.into_iter().map(Ok).collect())
            }
            Some(Value::ServerError(e)) => {
                // Refused as a whole (an ACL without MGET, say): no key of it could be read.
                self.stats.redis_errors.incr();
                self.report(
                    "get",
                    Some(names[0]),
                    format!("Redis get failed: {}", e.code()),
                );
                Ok(vec![Err(Unavailable); vkeys.len()])
            }
            _ => {
                self.misdelivered("get", names[0]);
                Err(Misdelivered)
            }
        }
    }

    /// What each key's reply says, as `fetch` reads one (uncounted); `None` when the replies
    /// are out of step with the reads (the connection was replaced: ask again).
    async fn judge_replies(
        &self,
        keys: &[(String, Stamp)],
        vkeys: &[String],
        replies: Result<Vec<Result<Value, Unavailable>>, Misdelivered>,
    ) -> Option<Vec<Fetched>> {
        let Ok(replies) = replies else { return None };
        // An untagged entry with the bus up needs no Redis read to know it is alive (see
        // `alive`): judged here at once; the others (tagged, or the bus down) ask Redis.
        let mut fetched: Vec<Fetched> = Vec::with_capacity(keys.len());
        let mut asks = Vec::new();
        for (i, ((key, stamp), reply)) in keys.iter().zip(replies).enumerate() {
            let found = match reply {
                Err(Unavailable) => {
                    fetched.push(Fetched::Unavailable);
                    continue;
                }
                Ok(Value::BulkString(b)) => match usable(&b, self.policies.serializer, &vkeys[i]) {
                    Ok(found) => found,
                    Err(Misdelivered) => {
                        // The replies are out of step: none of them is trusted.
                        self.misdelivered("get", key);
                        return None;
                    }
                },
                // Nil, or another type's error (WRONGTYPE): a miss, as for one key.
                Ok(_) => None,
            };
            match found {
                None => fetched.push(Fetched::Missing),
                Some(found) if found.tags.is_empty() && self.bus_up() => {
                    fetched.push(if self.inbox.dead(found.envelope.born, &[]) {
                        Fetched::Missing
                    } else {
                        Fetched::Found(found.remote(*stamp))
                    });
                }
                Some(found) => {
                    fetched.push(Fetched::Missing);
                    asks.push((i, key.as_str(), *stamp, found));
                }
            }
        }
        let judged = asks
            .into_iter()
            .map(|(i, key, stamp, mut found)| async move {
                let alive = self.alive(key, &mut found.envelope, &found.tags).await;
                let f = match alive {
                    Ok(true) => Fetched::Found(found.remote(stamp)),
                    Ok(false) => Fetched::Missing,
                    Err(Unavailable) => Fetched::Unavailable,
                };
                (i, f)
            });
        for (i, f) in join_all(judged).await {
            fetched[i] = f;
        }
        Some(fetched)
    }

    /// Sends the lock bids (`cold_gate.lua`) of `which` (indexes of `vkeys`, `names` and
    /// `tokens`) in one pipeline per node; each bid's reply, indexed as `vkeys`. The bids of a
    /// node pipeline that was redirected (a stale slot map) may have run on a node before the
    /// redirect, under their tokens: those locks are given back, and the bids sent again per
    /// slot under new tokens. `Err(Misdelivered)` when replies were out of step: every lock
    /// these bids may hold is given back (the connection is replaced).
    async fn bid(
        &self,
        vkeys: &[String],
        names: &[&str],
        tokens: &mut [String],
        which: &[usize],
    ) -> Result<Vec<Result<Value, Unavailable>>, Misdelivered> {
        let lock_ttl_ms = self.lock.ttl_ms();
        let hash = self.scripts.cold_gate.get_hash().to_string();
        let bid = |i: usize, token: &str| {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&hash)
                .arg(2)
                .arg(&vkeys[i])
                .arg(self.lock_key(names[i]))
                .arg(token)
                .arg(lock_ttl_ms)
                .arg("0")
                .arg(self.marker(&vkeys[i]))
                .arg(GENERATION_TTL.as_millis() as u64)
                .arg("b");
            c
        };
        let give_back = |which: Vec<usize>, tokens: Vec<String>| {
            join_all(
                which
                    .into_iter()
                    .zip(tokens)
                    .map(|(i, token)| async move { self.release(names[i], &token, true).await }),
            )
        };
        let sent = {
            let tokens = &*tokens;
            self.pipelined("lock", vkeys, names, which, Grouping::ByNode, |i| {
                bid(i, &tokens[i])
            })
            .await
        };
        let mut piped = match sent {
            Ok(piped) => piped,
            Err(Misdelivered) => {
                let held = which.iter().map(|&i| tokens[i].clone()).collect();
                give_back(which.to_vec(), held).await;
                return Err(Misdelivered);
            }
        };
        if piped.moved.is_empty() {
            return Ok(piped.replies);
        }
        let moved = std::mem::take(&mut piped.moved);
        let held = moved.iter().map(|&i| tokens[i].clone()).collect();
        give_back(moved.clone(), held).await;
        for &i in &moved {
            tokens[i] = new_token();
        }
        let again = {
            let tokens = &*tokens;
            self.pipelined("lock", vkeys, names, &moved, Grouping::BySlot, |i| {
                bid(i, &tokens[i])
            })
            .await
        };
        match again {
            Ok(mut again) => {
                for &i in &moved {
                    piped.replies[i] = std::mem::replace(&mut again.replies[i], Err(Unavailable));
                }
                Ok(piped.replies)
            }
            Err(Misdelivered) => {
                let held = which.iter().map(|&i| tokens[i].clone()).collect();
                give_back(which.to_vec(), held).await;
                Err(Misdelivered)
            }
        }
    }

    /// The cold gates of many keys at once: one pipelined GET of them all, then one pipelined
    /// lock bid (`cold_gate.lua`) for those the GET did not answer. A key whose lock another
    /// process holds is [`FirstLook::Wait`]: never waited for here. `looked`: the keys were
    /// read already and found missing (a batch read first, on the read lane): bids only.
    ///
    /// The bids travel with an echo, a keyed one per node on a Cluster (see `pipelined`): a
    /// reply moved by an extra one in front would otherwise be read as another key's bid (a
    /// lock another process holds read as ours, and its key loaded twice). Out of step, the
    /// connection is replaced, the locks the bids may have taken under their tokens are
    /// released, and every key asks again alone
    /// ([`FirstLook::Wait`]: the single-key gate, echo-checked, on the new connection).
    pub async fn cold_gate_many(&self, keys: &[(String, Stamp)], looked: bool) -> Vec<FirstLook> {
        let fetched = if looked {
            vec![Fetched::Missing; keys.len()]
        } else {
            self.fetch_many(keys, false).await
        };
        let mut out: Vec<Option<FirstLook>> = vec![None; keys.len()];
        let mut bids: Vec<usize> = Vec::new();
        for (i, f) in fetched.into_iter().enumerate() {
            match f {
                Fetched::Found(r) => {
                    out[i] = Some(FirstLook::Done(Gate::Found(r), LockOutcome::None))
                }
                Fetched::Unavailable => {
                    out[i] = Some(FirstLook::Done(Gate::unfenced(), LockOutcome::None))
                }
                Fetched::Missing => bids.push(i),
            }
        }
        if !bids.is_empty() {
            let names: Vec<&str> = bids.iter().map(|&i| keys[i].0.as_str()).collect();
            let stamps: Vec<Stamp> = bids.iter().map(|&i| self.inbox.stamp(&keys[i].0)).collect();
            let mut tokens: Vec<String> = bids.iter().map(|_| new_token()).collect();
            let vkeys: Vec<String> = names.iter().map(|k| self.value_key(k)).collect();
            let all: Vec<usize> = (0..bids.len()).collect();
            // Read before the bids, so nothing announced after they ran is in it.
            let known = self.known_clock();
            let Ok(mut replies) = self.bid(&vkeys, &names, &mut tokens, &all).await else {
                for &i in &bids {
                    out[i] = Some(FirstLook::Wait);
                }
                return out
                    .into_iter()
                    .map(|l| l.unwrap_or(FirstLook::Wait))
                    .collect();
            };
            if replies.iter().any(no_script) {
                // The script is not loaded on some node (a restart, a new node): loaded (on a
                // Cluster SCRIPT LOAD goes to every node), and only the bids it refused sent
                // again.
                let refused: Vec<usize> = (0..replies.len())
                    .filter(|&j| no_script(&replies[j]))
                    .collect();
                let _ = self
                    .run("lock", names[refused[0]], |mut c| async move {
                        self.scripts
                            .cold_gate
                            .prepare_invoke()
                            .load_async(&mut c)
                            .await
                    })
                    .await;
                match self.bid(&vkeys, &names, &mut tokens, &refused).await {
                    Ok(mut again) => {
                        for &j in &refused {
                            replies[j] = std::mem::replace(&mut again[j], Err(Unavailable));
                        }
                    }
                    Err(Misdelivered) => {
                        // Their locks were given back (see `bid`): their keys ask again alone.
                        for &j in &refused {
                            replies[j] = Ok(Value::Nil);
                        }
                    }
                }
            }
            // Born at the namespace clock known here when the bus vouches for it (see
            // `known_clock`), else at Redis's now: one read for every key won.
            let mut born: Option<Option<u64>> = None;
            for (j, reply) in replies.into_iter().enumerate() {
                let i = bids[j];
                let look = match reply {
                    Err(Unavailable) => {
                        out[i] = Some(FirstLook::Done(Gate::unfenced(), LockOutcome::None));
                        continue;
                    }
                    Ok(Value::ServerError(e)) => {
                        self.stats.redis_errors.incr();
                        self.report(
                            "lock",
                            Some(names[j]),
                            format!("Redis lock failed: {}", e.code()),
                        );
                        out[i] = Some(FirstLook::Done(Gate::unfenced(), LockOutcome::None));
                        continue;
                    }
                    Ok(v) => look_of(&v),
                };
                out[i] = Some(match look {
                    Some(Look::Locked(generation)) => {
                        self.stats.lock_wins.incr();
                        if born.is_none() {
                            born = Some(self.born_unread(names[j], known).await);
                        }
                        FirstLook::Done(
                            Gate::Lead {
                                token: Some(tokens[j].clone()),
                                fence: Some(self.fences.read(generation)),
                                stamp: Some(stamps[j]),
                                born: born.flatten(),
                                tags: Vec::new(),
                            },
                            LockOutcome::Won,
                        )
                    }
                    // A value written since the GET, or a lock held elsewhere: the single-key
                    // gate judges the value (or waits for the holder).
                    Some(Look::Value) | Some(Look::Held) | None => FirstLook::Wait,
                });
            }
        }
        out.into_iter()
            .map(|l| l.unwrap_or(FirstLook::Wait))
            .collect()
    }
}

fn no_script(reply: &Result<Value, Unavailable>) -> bool {
    matches!(reply, Ok(Value::ServerError(e)) if e.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn keys_of_one_hash_tag_share_a_slot_group_and_order_is_kept() {
        let keys = keys(&["sc:v:{a}", "sc:lock:{a}", "sc:v:{b}", "sc:v:{a}"]);
        let groups = grouped(&keys, &[0, 1, 2, 3], Owner::Slot);
        assert_eq!(groups, vec![vec![0, 1, 3], vec![2]]);
        // Only the keys asked for, in the order asked.
        assert_eq!(grouped(&keys, &[3, 2], Owner::Slot), vec![vec![3], vec![2]]);
    }

    #[test]
    fn keys_of_many_slots_share_their_node_s_group() {
        // Three nodes by thirds of the slots; keys of every slot of a node in one group.
        let range = |start: i64, end: i64, id: &str| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(7000),
                    Value::BulkString(id.as_bytes().to_vec()),
                ]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, "a"),
            range(5461, 10922, "b"),
            range(10923, 16383, "c"),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        let names: Vec<String> = (0..300).map(|i| format!("sc:v:{{k{i}}}")).collect();
        let which: Vec<usize> = (0..names.len()).collect();
        let owner = |slot: u16| match map.node_of(slot) {
            Some(n) => Owner::Node(n),
            None => Owner::Slot(slot),
        };
        let groups = grouped(&names, &which, owner);
        assert_eq!(groups.len(), 3, "one group per node");
        let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, which, "every key once");
        for group in &groups {
            let node = map.node_of(slot_of_key(names[group[0]].as_bytes()));
            assert!(group
                .iter()
                .all(|&i| map.node_of(slot_of_key(names[i].as_bytes())) == node));
            assert!(group.windows(2).all(|w| w[0] < w[1]), "order kept");
        }
        let slots: std::collections::HashSet<u16> =
            names.iter().map(|k| slot_of_key(k.as_bytes())).collect();
        assert!(
            slots.len() > 250,
            "the keys span many slots: {}",
            slots.len()
        );
    }
}
