//! Many keys at once (`getMany`, `getOrLoadMany`): a batch's reads go as one `MGET` and an
//! `ECHO` on a single server (or a Sentinel's primary), as one pipeline of GETs per cluster slot
//! in a cluster, each ending with its keyed echo (`Echo`); its lock bids in one pipeline per slot,
//! echoed the same way; all sent at once. So a batch of any size
//! costs about one round trip for its reads and one for its locks, where one key at a time cost
//! one (or two) per key. The lock bids are the single-key path's `cold_gate.lua`, so Lua scripts
//! still touch only the keys they declare, and every envelope is read as the single-key path
//! reads it (its key mark checked against the key it was asked for).
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

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use redis::Value;

use super::envelopes::{new_token, usable, Fetched, Misdelivered};
use super::fence::GENERATION_TTL;
use super::gates::{Gate, LockOutcome};
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

/// The reply of `cold_gate.lua` (see the script): `{value or false, fence, state, ms left}`.
enum Look {
    Value,
    Locked(String),
    Held,
}

fn look_of(reply: &Value) -> Option<Look> {
    let Value::Array(items) = reply else {
        return None;
    };
    let generation = match items.get(1) {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    };
    Some(match items.get(2) {
        Some(Value::Int(0)) => Look::Value,
        Some(Value::Int(1)) => Look::Locked(generation),
        _ => Look::Held,
    })
}

/// The indexes of `keys` by the cluster slot of their Redis key. A pipeline must stay in one slot
/// in a cluster: the redis crate routes it by its first key and the node refuses the others.
fn by_slot<'k>(keys: impl Iterator<Item = &'k str>) -> Vec<Vec<usize>> {
    let mut groups: HashMap<Slot, usize> = HashMap::new();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, k) in keys.enumerate() {
        let g = *groups.entry(Slot::for_key(k)).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[g].push(i);
    }
    out
}

impl RedisTier {
    /// Whether every value this tier reads is JSON (the JSON serializer's): a batch's values
    /// can then cross to JS as one JSON array text.
    pub fn values_are_json(&self) -> bool {
        self.policies.serializer == Serializer::Json
    }

    /// The pipelines a batch of Redis keys goes in: one on a single server (or a Sentinel's
    /// primary), one per slot in a cluster.
    fn groups<'k>(&self, keys: impl Iterator<Item = &'k str>) -> Vec<Vec<usize>> {
        if self.link.topology.is_cluster() {
            return by_slot(keys);
        }
        let all: Vec<usize> = (0..keys.count()).collect();
        if all.is_empty() {
            Vec::new()
        } else {
            vec![all]
        }
    }

    /// Sends `commands` (one per key of `keys`, `op` for reports) in one pipeline per slot, all
    /// at once; each key's reply, or `Unavailable` for every key of a pipeline that failed.
    /// `echoed`: each pipeline ends with an echo (see `Echo`; on a Cluster one per slot group,
    /// routed by the group's first key), as `invoke_echoed` sends one after a single script
    /// call, and `Err(Misdelivered)` when a mark is not in its place (an extra reply in front,
    /// or one missing, moved every reply after it onto another key's command).
    async fn pipelined(
        &self,
        op: &'static str,
        redis_keys: &[String],
        keys: &[&str],
        echoed: bool,
        command: impl Fn(usize) -> redis::Cmd,
    ) -> Result<Vec<Result<Value, Unavailable>>, Misdelivered> {
        let groups = self.groups(redis_keys.iter().map(String::as_str));
        let sent = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in group {
                pipe.add_command(command(i));
            }
            let echo = echoed.then(|| self.echo(&redis_keys[group[0]]));
            let first = keys[group[0]];
            async move {
                self.run(op, first, |mut c| async move {
                    match echo {
                        None => pipe.query_async::<Vec<Value>>(&mut c).await.map(Some),
                        Some(echo) => echo.send(pipe, &mut c).await,
                    }
                })
                .await
            }
        });
        let mut out: Vec<Result<Value, Unavailable>> = vec![Err(Unavailable); keys.len()];
        for (group, replies) in groups.iter().zip(join_all(sent).await) {
            let Ok(replies) = replies else { continue };
            let Some(replies) = replies.filter(|r| r.len() == group.len()) else {
                self.misdelivered(op, keys[group[0]]);
                return Err(Misdelivered);
            };
            for (&i, reply) in group.iter().zip(replies) {
                out[i] = Ok(reply);
            }
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
    /// off a cluster, one pipeline of GETs and a keyed echo per slot in one. `Err(Misdelivered)`
    /// when the replies cannot be the MGET's (the echo is not in its place, or the reply is not
    /// one per key): the connection is replaced.
    async fn read_values(
        &self,
        vkeys: &[String],
        names: &[&str],
    ) -> Result<Vec<Result<Value, Unavailable>>, Misdelivered> {
        if self.link.topology.is_cluster() || vkeys.is_empty() {
            // A Cluster: a pipeline of GETs per slot, each with its keyed echo.
            return self
                .pipelined("get", vkeys, names, true, |i| {
                    let mut c = redis::cmd("GET");
                    c.arg(&vkeys[i]);
                    c
                })
                .await;
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
        let judged = asks.into_iter().map(|(i, key, stamp, found)| async move {
            let alive = self.alive(key, found.envelope.born, &found.tags).await;
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

    /// The cold gates of many keys at once: one pipelined GET of them all, then one pipelined
    /// lock bid (`cold_gate.lua`) for those the GET did not answer. A key whose lock another
    /// process holds is [`FirstLook::Wait`]: never waited for here. `looked`: the keys were
    /// read already and found missing (a batch read first, on the read lane): bids only.
    ///
    /// The bids travel with an echo, a keyed one per slot on a Cluster (see `pipelined`): a
    /// reply moved by an extra one in front would otherwise be read as another key's bid (a
    /// lock another process holds read as ours, and its key loaded twice). Out of step, the connection is replaced, the locks the
    /// bids may have taken under their tokens are released, and every key asks again alone
    /// ([`FirstLook::Wait`]: the single-key gate, echo-checked, on the new connection).
    pub async fn cold_gate_many(&self, keys: &[(String, Stamp)], looked: bool) -> Vec<FirstLook> {
        let lock_ttl_ms = self.lock.ttl_ms();
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
            let tokens: Vec<String> = bids.iter().map(|_| new_token()).collect();
            let vkeys: Vec<String> = names.iter().map(|k| self.value_key(k)).collect();
            let hash = self.scripts.cold_gate.get_hash().to_string();
            let bid = |i: usize| {
                let mut c = redis::cmd("EVALSHA");
                c.arg(&hash)
                    .arg(3)
                    .arg(&vkeys[i])
                    .arg(self.lock_key(names[i]))
                    .arg(self.generation_key(names[i]))
                    .arg(&tokens[i])
                    .arg(lock_ttl_ms)
                    .arg("0")
                    .arg(new_token())
                    .arg(GENERATION_TTL.as_millis() as u64);
                c
            };
            let Ok(mut replies) = self.pipelined("lock", &vkeys, &names, true, bid).await else {
                let released = names
                    .iter()
                    .zip(&tokens)
                    .map(|(name, token)| self.release(name, token, true));
                join_all(released).await;
                for &i in &bids {
                    out[i] = Some(FirstLook::Wait);
                }
                return out
                    .into_iter()
                    .map(|l| l.unwrap_or(FirstLook::Wait))
                    .collect();
            };
            if replies.iter().any(no_script) {
                // The script is not loaded on some node (a restart, a new node): load it there
                // through one key of each such slot, and send again only the bids it refused.
                let refused: Vec<usize> = (0..replies.len())
                    .filter(|&j| no_script(&replies[j]))
                    .collect();
                let loads = self
                    .groups(refused.iter().map(|&j| vkeys[j].as_str()))
                    .into_iter()
                    .map(|group| {
                        let first = refused[group[0]];
                        let name = names[first];
                        async move {
                            self.run("lock", name, |mut c| async move {
                                self.scripts
                                    .cold_gate
                                    .prepare_invoke()
                                    .load_async(&mut c)
                                    .await
                            })
                            .await
                        }
                    });
                join_all(loads).await;
                let again_v: Vec<String> = refused.iter().map(|&j| vkeys[j].clone()).collect();
                let again_n: Vec<&str> = refused.iter().map(|&j| names[j]).collect();
                match self
                    .pipelined("lock", &again_v, &again_n, true, |x| bid(refused[x]))
                    .await
                {
                    Ok(again) => {
                        for (&j, reply) in refused.iter().zip(again) {
                            replies[j] = reply;
                        }
                    }
                    Err(Misdelivered) => {
                        // Out of step: those bids' locks may be ours; given back, and their
                        // keys ask again alone.
                        let released = refused
                            .iter()
                            .map(|&j| self.release(names[j], &tokens[j], true));
                        join_all(released).await;
                        for &j in &refused {
                            replies[j] = Ok(Value::Nil);
                        }
                    }
                }
            }
            // Born at the namespace clock Redis has now: one read for every key won (the
            // single-key gate reads it once per key).
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
                            born = Some(self.clock_now(names[j]).await);
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
    use super::by_slot;

    #[test]
    fn keys_of_one_hash_tag_share_a_group_and_order_is_kept() {
        let keys = ["sc:v:{a}", "sc:lock:{a}", "sc:v:{b}", "sc:v:{a}"];
        let groups = by_slot(keys.iter().copied());
        assert_eq!(groups, vec![vec![0, 1, 3], vec![2]]);
    }
}
