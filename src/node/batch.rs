//! Many keys at once (`getMany`, `getOrLoadMany`): the binding's batch calls. Each answers one
//! `Batch` for its keys, in the order of `keys`; the facade ends each key's flight as it does
//! for a single key (mod.rs, "Boundary rules").
//!
//! A batch crosses to JS compactly, because a profile of a warm batch of 1,000 keys put most of
//! the binding's time in per-key crossings: an answer object per key (thirteen values each)
//! and an `adopt` call per key (fourteen arguments each). So the keys Redis had cross as one
//! typed array of codes (`BATCH_*` bits: found, format, negative, has a value, state), one of
//! freshUntil, and their values' JSON, joined into one JSON array text (one string, one
//! `JSON.parse`) when this cache's serializer is JSON; their envelopes stay in the engine (a
//! gate's in its flights' records, a read's in an external) until one `adoptMany` call takes
//! them all into the in-process tier. Every other
//! answer (a lead with its lock, a key to wait for, closed, a value an announcement carried) is
//! an ordinary answer in `others`.
//!
//! A gate batch's flights have records (`flight.rs`) as one key's flight has: they begin here
//! (`begin_flights`), and each is given what its key's gate answered as the batch lands on the
//! JS thread (a found key's entry, a lead's ticket), so `adoptMany` and a led key's write-back
//! end them as `adopt` and `writeBack` end one key's.

use std::ptr;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;

use super::answer::{answer_of, Landed, RedisAnswer};
use super::codes::{
    encode_hit, hit_state, lock_code, GATE_CLOSED, GATE_MISSING, GATE_UNAVAILABLE, GATE_WAIT, MISS,
    NO_SLOT, PURPOSE_COLD, WRITTEN_NOWHERE,
};
use super::engines::{engine, with_engine};
use super::flight::{Flight, Found, Gated};
use super::hot_path;
use super::lane::{self, ThenMany};
use super::reads::{carried_gate, For};
use super::redis::{adopt_flight, keep_found, lane_of};
use super::{napi_fail, settle, JsErr};
use crate::cache::EntryState;
use crate::clock::{Clock, SystemClock};
use crate::error::ErrorCode;
use crate::inbox::Stamp;
use crate::json_element::one_element;
use crate::store::redis::{Fetched, FirstLook, Gate, LaneRead, RedisTier, Remote};

/// Set in the code of a key Redis had (`Batch`): its envelope waits for `adoptMany`. A key
/// without it has its answer in `others`, at `-1 - code`.
#[napi]
pub const BATCH_FOUND: u32 = 1 << 8;
/// A found key's code: its value's format (a `FMT_*` code) is `code & BATCH_FMT_MASK`.
#[napi]
pub const BATCH_FMT_MASK: u32 = 0xf;
/// A found key's code: a negative entry (its value is JSON whatever the serializer).
#[napi]
pub const BATCH_NEGATIVE: u32 = 1 << 4;
/// A found key's code: it has a value text (without it, the cached value is `undefined`).
#[napi]
pub const BATCH_VALUE: u32 = 1 << 5;
/// A found key's code: its state when Redis answered is `HIT_STATES[(code >> BATCH_STATE_SHIFT) & 3]`.
#[napi]
pub const BATCH_STATE_SHIFT: u32 = 6;

/// The tier of a live cache, and each key's invalidation stamp taken now, on the JS thread
/// (before a later `set` or `delete` of this process can change it).
fn asked(id: u32, keys: &[String]) -> Option<(Arc<RedisTier>, Vec<Stamp>)> {
    let e = engine(id)?;
    let e = e.borrow();
    if e.cache.is_closed() {
        return None;
    }
    let tier = e.redis.clone()?;
    let stamps = keys.iter().map(|k| e.cache.inbox().stamp(k)).collect();
    Some((tier, stamps))
}

/// A batch's keys, given as one string (`keys.join('')`) and each key's length in UTF-16 units:
/// a `string[]` crossed at 1.2 µs a key (several N-API calls each), which put a warm batch of
/// 1,000 keys a millisecond behind one MGET before Redis was asked.
fn split_keys(joined: &str, lengths: &[u32]) -> napi::Result<Vec<String>> {
    let mut keys = Vec::with_capacity(lengths.len());
    let mut at = 0;
    let ascii = joined.is_ascii();
    let mut chars = joined.char_indices();
    for &units in lengths {
        let end = if ascii {
            at + units as usize
        } else {
            // UTF-16 units to UTF-8 bytes: walk the key's characters.
            let mut left = units as usize;
            let mut end = at;
            while left > 0 {
                let Some((i, c)) = chars.next() else { break };
                end = i + c.len_utf8();
                left = left.saturating_sub(c.len_utf16());
            }
            end
        };
        let Some(key) = joined.get(at..end) else {
            return Err(napi::Error::from_reason(
                "the batch's keys do not match their lengths",
            ));
        };
        keys.push(key.to_string());
        at = end;
    }
    if at != joined.len() {
        return Err(napi::Error::from_reason(
            "the batch's keys do not match their lengths",
        ));
    }
    Ok(keys)
}

/// One key's answer before the batch is made compact (`A`: a read's `RedisAnswer`, a gate's
/// `Landed`).
enum Each<A> {
    /// Redis had it (found by this batch's read).
    Found(Remote),
    Other(A),
}

/// The keys an announcement carried a value for are answered from it (no Redis read): those
/// answers, and the positions of the other keys (whose names travel beside, see `uncarried`).
/// The per-key answers are laid out on the runtime (`Asked::answers`): a vector of them made
/// here, 200 bytes a key, was one fresh mapping of the JS thread's allocator per batch (page
/// faults and zeroed pages, half a millisecond for 1,000 keys).
struct Asked<A> {
    n: usize,
    carried: Vec<(usize, A)>,
    /// The position of each key asked of Redis, in the order of its name.
    at: Vec<usize>,
}

/// `carried`: key i's answer from an announcement, if one carried its value. The names of the
/// keys not carried, in the order of `Asked::at`.
fn uncarried<A>(
    keys: Vec<String>,
    carried: impl Fn(usize, &str) -> Option<A>,
) -> (Asked<A>, Vec<String>) {
    let n = keys.len();
    let mut answered = Vec::new();
    let mut at = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    for (i, key) in keys.into_iter().enumerate() {
        match carried(i, &key) {
            Some(found) => answered.push((i, found)),
            None => {
                at.push(i);
                names.push(key);
            }
        }
    }
    let asked = Asked {
        n,
        carried: answered,
        at,
    };
    (asked, names)
}

/// A batch read's keys, as `uncarried` splits them, with the tier and each uncarried key's
/// stamp taken once on the JS thread (before a later `set` or `delete` of this process can
/// change it), the carried keys' checked against the same stamp; `None` when the cache is
/// closed or has no Redis (every key unavailable). A key's stamp was taken twice, and the
/// engine looked up once per key, when the carried check and `asked` each took their own.
#[allow(clippy::type_complexity)]
fn read_asked(
    id: u32,
    keys: Vec<String>,
    count: bool,
) -> std::result::Result<
    (Arc<RedisTier>, Asked<RedisAnswer>, Vec<String>, Vec<Stamp>),
    (Asked<RedisAnswer>, Vec<String>),
> {
    let Some(e) = engine(id) else {
        return Err(uncarried(keys, |_, _| None));
    };
    let e = e.borrow();
    let tier = match &e.redis {
        Some(tier) if !e.cache.is_closed() => tier.clone(),
        _ => return Err(uncarried(keys, |_, _| None)),
    };
    let inbox = e.cache.inbox();
    let n = keys.len();
    let mut answered = Vec::new();
    let mut at = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    let mut stamps = Vec::with_capacity(n);
    for (i, key) in keys.into_iter().enumerate() {
        let stamp = inbox.stamp(&key);
        match tier.take_carried(&key, stamp) {
            Some(found) => {
                if count {
                    tier.count_l2_hit();
                }
                answered.push((i, RedisAnswer::found(found).reporting(&tier)));
            }
            None => {
                at.push(i);
                names.push(key);
                stamps.push(stamp);
            }
        }
    }
    let asked = Asked {
        n,
        carried: answered,
        at,
    };
    Ok((tier, asked, names, stamps))
}

impl<A> Asked<A> {
    /// Every key's slot, the carried ones answered.
    fn answers(&mut self) -> Vec<Option<Each<A>>> {
        let mut answers: Vec<Option<Each<A>>> = (0..self.n).map(|_| None).collect();
        for (i, a) in self.carried.drain(..) {
            answers[i] = Some(Each::Other(a));
        }
        answers
    }
}

/// The cold gates of the keys a batch leads, in one go: per key, `GATE_FOUND` (Redis has it),
/// `GATE_LEAD` (call the loader, holding the lock if a token is set), `GATE_WAIT` (another
/// process holds the lock: ask `redisGate` for this key alone, which waits for its value) or
/// `GATE_CLOSED`. One read of them all (see `RedisTier::fetch_many`), then one pipeline of lock
/// bids per slot. `joined`, `lengths`: the keys (see `split_keys`); `flights`: each key's
/// flight, whose record begins here (see `flight.rs`); `looked`: the keys were just read
/// (`redisFetchMany`) and found missing, so only their locks are bid for.
#[napi(ts_return_type = "Promise<unknown[]>")]
pub fn redis_gate_many(
    env: &Env,
    id: u32,
    joined: String,
    lengths: Uint32Array,
    flights: Float64Array,
    looked: bool,
) -> napi::Result<PromiseRaw<'_, Batch<Landed>>> {
    let keys = split_keys(&joined, &lengths)?;
    if flights.len() != keys.len() {
        return Err(napi::Error::from_reason(
            "the batch's flights do not match its keys",
        ));
    }
    let flights: Vec<u64> = flights.iter().map(|f| *f as u64).collect();
    let to = |i: usize| For {
        id,
        flight: flights[i],
    };
    begin_flights(id, &keys, &flights);
    let (mut asked_, names) = uncarried(keys, |i, key| carried_gate(to(i), key));
    let tier = asked(id, &names);
    settle::spawn_settled(env, async move {
        let mut answers = asked_.answers();
        let rest = asked_.at;
        let records = Records { id, flights };
        let landed = |i: usize, (answer, gated): (RedisAnswer, Gated)| {
            Each::Other(Landed {
                id,
                flight: records.flights[i],
                answer,
                gated,
            })
        };
        let Some((tier, stamps)) = tier else {
            for i in &rest {
                let closed = (RedisAnswer::kind(GATE_CLOSED, None), Gated::Nothing);
                answers[*i] = Some(landed(*i, closed));
            }
            return Ok(Batch::of(rest, names, answers, false, false, Some(records)));
        };
        let asks: Vec<(String, Stamp)> = names.into_iter().zip(stamps.iter().copied()).collect();
        let looks = tier.cold_gate_many(&asks, looked).await;
        let closed = tier.closed();
        for ((i, (key, stamp)), look) in rest.iter().zip(&asks).zip(looks) {
            let answer = match look {
                FirstLook::Done(
                    Gate::Lead {
                        token: Some(token), ..
                    },
                    _,
                ) if closed => {
                    // Closed while asking: no loader runs, and a lock just taken goes back.
                    tier.release(key, &token, true).await;
                    let closed = RedisAnswer::kind(GATE_CLOSED, Some(*stamp));
                    landed(*i, (closed, Gated::Nothing))
                }
                _ if closed => {
                    let closed = RedisAnswer::kind(GATE_CLOSED, Some(*stamp));
                    landed(*i, (closed, Gated::Nothing))
                }
                FirstLook::Done(Gate::Found(r), _) => Each::Found(r),
                FirstLook::Done(gate, lock) => landed(
                    *i,
                    answer_of(&tier, key, gate, lock_code(lock), Some(*stamp)),
                ),
                FirstLook::Wait => {
                    let wait = RedisAnswer::kind(GATE_WAIT, Some(*stamp));
                    landed(*i, (wait, Gated::Nothing))
                }
            };
            answers[*i] = Some(answer);
        }
        let joined = tier.values_are_json();
        let names = asks.into_iter().map(|(key, _)| key).collect();
        Ok(Batch::of(
            rest,
            names,
            answers,
            joined,
            tier.reports_waiting(),
            Some(records),
        ))
    })
}

/// Begins the records of a batch's cold flights (`redisGate` begins one's).
fn begin_flights(id: u32, keys: &[String], flights: &[u64]) {
    let Some(e) = engine(id) else { return };
    let mut e = e.borrow_mut();
    if e.cache.is_closed() || e.redis.is_none() {
        return;
    }
    for (key, flight) in keys.iter().zip(flights) {
        e.flights
            .entry(*flight)
            .or_insert_with(|| Flight::new(key.clone(), PURPOSE_COLD));
    }
}

/// Reads many keys from Redis (for `getMany`, and `getOrLoadMany`'s first look), as
/// `redisFetch` reads one: found / missing / unavailable per key. Found keys count as l2Hits;
/// `count_misses` (`getMany`): the others as misses (`getOrLoadMany` counts them when it
/// looks them up to load). `joined`, `lengths`: the keys (see `split_keys`).
///
/// Off a Cluster, on the read lane when it can take the batch: one MGET written on the JS
/// thread's own socket, its reply framed and every envelope checked against its key there, and
/// the promise settled in the loop's callback, with no thread crossed. A profile of a warm
/// batch of 1,000 keys on the command connection put 2.1 ms of its 3.7 ms between the call and
/// the answer: the runtime's wake-ups, the redis crate's framing of 1,000 values, and the
/// crossing back. A key the lane cannot judge (tags, the bus down) is asked again on the
/// command connection alone; a lane that fails asks the whole batch there.
#[napi(ts_return_type = "Promise<unknown[]>")]
pub fn redis_fetch_many(
    env: &Env,
    id: u32,
    joined: String,
    lengths: Uint32Array,
    count_misses: bool,
) -> napi::Result<PromiseRaw<'_, Batch<RedisAnswer>>> {
    let keys = split_keys(&joined, &lengths)?;
    let (tier, asked_, names, stamps) = match read_asked(id, keys, true) {
        Ok(read) => read,
        Err((asked_, names)) => {
            return settle::spawn_settled(env, async move {
                let mut asked_ = asked_;
                let mut answers = asked_.answers();
                for i in &asked_.at {
                    answers[*i] = Some(Each::Other(RedisAnswer::kind(GATE_UNAVAILABLE, None)));
                }
                Ok(Batch::of(asked_.at, names, answers, false, false, None))
            });
        }
    };
    // One batch at a time on the lane: while one is in flight, the others take the command
    // connection, whose runtime threads frame and check their envelopes beside the JS thread
    // (measured with 16 batches of 1,000 keys in flight: all on the lane, their framing and
    // checks on the JS thread held throughput at ioredis's; see bench/batch.js).
    let lane = lane_of(env, id, &tier).filter(|l| !l.borrow().carrying_batch());
    if !names.is_empty() {
        if let Some(lane) = lane {
            let then: ThenMany = Box::new(move |env, tier, promised, names, stamps, reads| {
                let read = LaneBatch {
                    asked: asked_,
                    names,
                    stamps,
                    count_misses,
                };
                fetched_on_lane(env, tier, promised, read, reads)
            });
            let asked = lane::Asked::Many {
                keys: names,
                stamps,
                count: false,
                then,
            };
            return lane::send(env, &lane, &tier, asked);
        }
    }
    let asks: Vec<(String, Stamp)> = names.into_iter().zip(stamps).collect();
    settle::spawn_settled(env, fetch_on_runtime(tier, asked_, asks, count_misses))
}

/// A batch read on the command connection (`asks`: the keys `asked_` did not answer).
async fn fetch_on_runtime(
    tier: Arc<RedisTier>,
    mut asked_: Asked<RedisAnswer>,
    asks: Vec<(String, Stamp)>,
    count_misses: bool,
) -> napi::Result<Batch<RedisAnswer>> {
    let mut answers = asked_.answers();
    let fetched = tier.fetch_many(&asks, false).await;
    for (i, f) in asked_.at.iter().zip(fetched) {
        answers[*i] = Some(fetched_answer(&tier, f, count_misses));
    }
    let joined = tier.values_are_json();
    let names = asks.into_iter().map(|(key, _)| key).collect();
    Ok(Batch::of(
        asked_.at,
        names,
        answers,
        joined,
        tier.reports_waiting(),
        None,
    ))
}

/// One key's answer to a batch read, counted (a found key as an l2Hit; another as a miss when
/// `count_misses`).
fn fetched_answer(tier: &RedisTier, f: Fetched, count_misses: bool) -> Each<RedisAnswer> {
    match f {
        Fetched::Found(r) => {
            tier.count_l2_hit();
            Each::Found(r)
        }
        other => {
            if count_misses {
                tier.count_miss();
            }
            Each::Other(RedisAnswer::kind(
                if other == Fetched::Missing {
                    GATE_MISSING
                } else {
                    GATE_UNAVAILABLE
                },
                None,
            ))
        }
    }
}

/// A batch read sent on the lane: what its answer is made of once the lane has read it.
struct LaneBatch {
    asked: Asked<RedisAnswer>,
    /// The names of the keys asked (`asked.at`'s), and their stamps.
    names: Vec<String>,
    stamps: Vec<Stamp>,
    count_misses: bool,
}

/// Settles a batch read the lane answered (`reads`, per key of `read.names`), on the JS thread
/// in the lane's callback; the keys the lane could not judge are asked again on the command
/// connection, and the whole batch there when the lane failed (`None`).
fn fetched_on_lane(
    env: sys::napi_env,
    tier: &Arc<RedisTier>,
    promised: settle::Promised,
    read: LaneBatch,
    reads: Option<Vec<LaneRead>>,
) {
    let LaneBatch {
        asked: mut asked_,
        names,
        stamps,
        count_misses,
    } = read;
    let Some(reads) = reads else {
        let asks = names.into_iter().zip(stamps).collect();
        settle::spawn_into(
            promised,
            fetch_on_runtime(tier.clone(), asked_, asks, count_misses),
        );
        return;
    };
    let mut answers = asked_.answers();
    let mut again: Vec<(usize, (String, Stamp))> = Vec::new();
    for (((i, read), key), stamp) in asked_.at.iter().zip(reads).zip(&names).zip(&stamps) {
        let f = match read {
            LaneRead::Found(r) => Fetched::Found(r),
            LaneRead::Missing => Fetched::Missing,
            LaneRead::Ask | LaneRead::Misaligned(_) => {
                again.push((*i, (key.clone(), *stamp)));
                continue;
            }
        };
        answers[*i] = Some(fetched_answer(tier, f, count_misses));
    }
    let rest = std::mem::take(&mut asked_.at);
    if again.is_empty() {
        let batch = Batch::of(
            rest,
            names,
            answers,
            tier.values_are_json(),
            tier.reports_waiting(),
            None,
        );
        settle::settle_here(env, promised, Ok(batch));
        return;
    }
    let tier = tier.clone();
    settle::spawn_into(promised, async move {
        let (at, asks): (Vec<usize>, Vec<(String, Stamp)>) = again.into_iter().unzip();
        let fetched = tier.fetch_many(&asks, false).await;
        for (i, f) in at.into_iter().zip(fetched) {
            answers[i] = Some(fetched_answer(&tier, f, count_misses));
        }
        let joined = tier.values_are_json();
        Ok(Batch::of(
            rest,
            names,
            answers,
            joined,
            tier.reports_waiting(),
            None,
        ))
    });
}

/// A found key of a batch (its value text crossed to JS apart).
struct Kept {
    key: String,
    /// What `adoptMany` keeps of it: here for a read's key; in its flight's record for a gate's
    /// (moved there as the batch lands, see `Records`), so `None` here.
    found: Option<Found>,
    /// The value text's UTF-8 length (what the entry's `size` is).
    size: u64,
    /// It has a value text (else the cached value is `undefined`).
    text: bool,
}

/// The found keys of a batch, by position in the batch, until `adoptMany`.
pub struct FoundKeys(Vec<Option<Kept>>);

/// A gate batch's engine and each key's flight: as the batch crosses to JS, each found key's
/// entry goes into its flight's record, as a single gate's `Landed` puts it there.
pub(super) struct Records {
    id: u32,
    flights: Vec<u64>,
}

/// The found keys' value texts: one JSON array of those that have one, in order, or each apart.
enum Texts {
    Joined(String),
    Each(Vec<Option<String>>),
}

/// A batch's answer. It crosses to JS as `[codes, texts, freshUntil, others, found, reported]`:
/// `codes` (Int32Array) per key, a `BATCH_*` code if found, else `-1 - j` for `others[j]`;
/// `texts` the found values' JSON texts, one JSON array text of those with `BATCH_VALUE` (in
/// order) or an array per key (`null` for none); `freshUntil` (Float64Array) per key (found
/// only); `found` the external `adoptMany` takes; `reported`: failures wait for `onError`.
/// `A`: an other answer (a gate's `Landed`, which lands its part in its flight's record).
pub struct Batch<A> {
    codes: Vec<i32>,
    texts: Texts,
    fresh_until: Vec<f64>,
    others: Vec<A>,
    found: FoundKeys,
    records: Option<Records>,
    reported: bool,
}

/// An other answer for a key no answer was made for (never expected: every key is answered).
pub(super) trait Unanswered {
    fn unavailable(records: Option<&Records>, i: usize) -> Self;
}

impl Unanswered for RedisAnswer {
    fn unavailable(_: Option<&Records>, _: usize) -> Self {
        RedisAnswer::kind(GATE_UNAVAILABLE, None)
    }
}

impl Unanswered for Landed {
    fn unavailable(records: Option<&Records>, i: usize) -> Self {
        Landed {
            id: records.map_or(0, |r| r.id),
            flight: records.and_then(|r| r.flights.get(i).copied()).unwrap_or(0),
            answer: RedisAnswer::kind(GATE_UNAVAILABLE, None),
            gated: Gated::Nothing,
        }
    }
}

impl<A: Unanswered> Batch<A> {
    /// `rest`: the positions of the keys asked of Redis, `names` their names (the others
    /// were answered from announcements, and are in `others`); `join`: the serializer is
    /// JSON, so the found values' texts may be joined; `records`: a gate batch's flights.
    fn of(
        rest: Vec<usize>,
        names: Vec<String>,
        answers: Vec<Option<Each<A>>>,
        join: bool,
        reported: bool,
        records: Option<Records>,
    ) -> Batch<A> {
        let n = answers.len();
        let mut named: Vec<Option<String>> = (0..n).map(|_| None).collect();
        for (i, key) in rest.into_iter().zip(names) {
            named[i] = Some(key);
        }
        let now = SystemClock.now_ms();
        let mut codes = Vec::with_capacity(n);
        let mut fresh_until = vec![0.0; n];
        let mut others = Vec::new();
        let mut kept = Vec::with_capacity(n);
        let mut texts: Vec<Option<String>> = Vec::with_capacity(n);
        for (i, (answer, name)) in answers.into_iter().zip(named).enumerate() {
            match (answer, name) {
                (Some(Each::Found(mut r)), Some(key)) => {
                    let e = &r.envelope;
                    let state = hit_state(EntryState::of_live(e, now)) as u32;
                    let text = r.value_json.take();
                    let mut code = BATCH_FOUND
                        | (r.fmt.code() & BATCH_FMT_MASK)
                        | (state << BATCH_STATE_SHIFT);
                    if e.negative {
                        code |= BATCH_NEGATIVE;
                    }
                    if text.is_some() {
                        code |= BATCH_VALUE;
                    }
                    codes.push(code as i32);
                    fresh_until[i] = e.fresh_until;
                    let size = text.as_ref().map_or(0, |t| t.len() as u64);
                    let found = Found {
                        envelope: r.envelope,
                        tags: r.tags,
                        stamp: Some(r.stamp),
                        size,
                    };
                    kept.push(Some(Kept {
                        key,
                        found: Some(found),
                        size,
                        text: text.is_some(),
                    }));
                    texts.push(text);
                }
                (answer, _) => {
                    let answer = match answer {
                        Some(Each::Other(a)) => a,
                        // Unavailable, as a read that failed.
                        _ => A::unavailable(records.as_ref(), i),
                    };
                    codes.push(-1 - others.len() as i32);
                    others.push(answer);
                    kept.push(None);
                    texts.push(None);
                }
            }
        }
        let texts = if join && texts.iter().flatten().all(|t| one_element(t)) {
            let len = texts.iter().flatten().map(|t| t.len() + 1).sum::<usize>() + 2;
            let mut joined = String::with_capacity(len);
            joined.push('[');
            for t in texts.iter().flatten() {
                if joined.len() > 1 {
                    joined.push(',');
                }
                joined.push_str(t);
            }
            joined.push(']');
            Texts::Joined(joined)
        } else {
            Texts::Each(texts)
        };
        Batch {
            codes,
            texts,
            fresh_until,
            others,
            found: FoundKeys(kept),
            records,
            reported,
        }
    }
}

impl Records {
    /// Moves each found key's entry into its flight's record (on the JS thread, as the batch
    /// crosses, so the record has it before any JS reads the batch). A record gone by then (the
    /// cache closed) drops it.
    fn land(&self, found: &mut FoundKeys) {
        let Some(e) = engine(self.id) else { return };
        let mut e = e.borrow_mut();
        for (kept, flight) in found.0.iter_mut().zip(&self.flights) {
            let Some(kept) = kept else { continue };
            let Some(entry) = kept.found.take() else {
                continue;
            };
            if let Some(f) = e.flights.get_mut(flight) {
                f.gated = Gated::Found(entry);
            }
        }
    }
}

impl<A> TypeName for Batch<A> {
    fn type_name() -> &'static str {
        "Batch"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl<A: ToNapiValue> ToNapiValue for Batch<A> {
    unsafe fn to_napi_value(env: sys::napi_env, mut b: Self) -> napi::Result<sys::napi_value> {
        if let Some(records) = &b.records {
            records.land(&mut b.found);
        }
        // SAFETY: napi-rs calls this on the JS thread with its environment, in a handle scope;
        // each conversion makes a fresh value of `env`, and the array is made and filled there.
        unsafe {
            let items = [
                typed_array(env, sys::TypedarrayType::int32_array, &b.codes)?,
                match b.texts {
                    Texts::Joined(text) => hot_path::js_string(env, &text)?,
                    Texts::Each(texts) => ToNapiValue::to_napi_value(env, texts)?,
                },
                typed_array(env, sys::TypedarrayType::float64_array, &b.fresh_until)?,
                ToNapiValue::to_napi_value(env, b.others)?,
                ToNapiValue::to_napi_value(env, External::new(b.found))?,
                ToNapiValue::to_napi_value(env, b.reported)?,
            ];
            let mut out = ptr::null_mut();
            napi::check_status!(sys::napi_create_array_with_length(
                env,
                items.len(),
                &mut out
            ))?;
            for (i, item) in items.into_iter().enumerate() {
                napi::check_status!(sys::napi_set_element(env, out, i as u32, item))?;
            }
            Ok(out)
        }
    }
}

/// A typed array of `kind` holding a copy of `data` (i32 or f64), in memory V8 owns: napi-rs's
/// typed arrays lend theirs to V8 as external buffers, each with a finalizer to run.
///
/// SAFETY: on the JS thread with its live environment, in a handle scope; `kind` is the typed
/// array type of `T`'s size and layout.
unsafe fn typed_array<T: Copy>(
    env: sys::napi_env,
    kind: sys::napi_typedarray_type,
    data: &[T],
) -> napi::Result<sys::napi_value> {
    let bytes = std::mem::size_of_val(data);
    let mut buffer = ptr::null_mut();
    let mut at = ptr::null_mut();
    let mut out = ptr::null_mut();
    // SAFETY: the caller's; `at` is `bytes` writable bytes V8 gave, which `data` does not
    // overlap.
    unsafe {
        napi::check_status!(sys::napi_create_arraybuffer(
            env,
            bytes,
            &mut at,
            &mut buffer
        ))?;
        if bytes > 0 {
            ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), at.cast::<u8>(), bytes);
        }
        napi::check_status!(sys::napi_create_typedarray(
            env,
            kind,
            data.len(),
            buffer,
            0,
            &mut out
        ))?;
    }
    Ok(out)
}

/// What `adoptMany` (and `getEntries`) answer, per key: crosses as an Int32Array.
pub struct Adopted(Vec<i32>);

impl TypeName for Adopted {
    fn type_name() -> &'static str {
        "Int32Array"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ToNapiValue for Adopted {
    unsafe fn to_napi_value(env: sys::napi_env, a: Self) -> napi::Result<sys::napi_value> {
        // SAFETY: napi-rs calls this on the JS thread with its environment, in a handle scope.
        unsafe { typed_array(env, sys::TypedarrayType::int32_array, &a.0) }
    }
}

/// Takes a batch's found entries into the in-process tier at once, as `adopt` and `adoptRead`
/// take one each: `flights[i]` is key i's flight, whose record its gate's entry is in, ended as
/// `adopt` ends it (-1: none, as for `getMany`: the entry is in `found`; below -1: not adopted,
/// as for a key not found or whose value this cache's serializer could not read). `cold`, `beta`
/// as for `adopt`. Answers per key what `adopt` answers (`slot * 2 + refresh`;
/// `WRITTEN_NOWHERE * 2` for a key not adopted). A key whose slot a later key of the batch took
/// (evicted meanwhile) answers `NO_SLOT`: the facade keeps values at slots in key order after
/// this call, and would otherwise keep the earlier key's value at a slot that is no longer its.
#[napi(ts_return_type = "Int32Array")]
pub fn adopt_many(
    id: u32,
    found: &mut External<FoundKeys>,
    flights: Float64Array,
    cold: bool,
    beta: f64,
) -> Adopted {
    let nowhere = WRITTEN_NOWHERE * 2;
    let mut out = vec![nowhere; found.0.len()];
    let Some(e) = engine(id) else {
        return Adopted(out);
    };
    let mut e = e.borrow_mut();
    let e = &mut *e;
    if e.cache.options().l1_max_entries.is_none() && !flights.iter().any(|&f| f >= 0.0) {
        read_kept_nowhere(e, found, &flights, cold, beta, &mut out);
        return Adopted(out);
    }
    let mut slotted = Vec::new();
    for (i, kept) in found.0.iter_mut().enumerate() {
        let flight = flights.get(i).copied().unwrap_or(-2.0);
        if flight < -1.0 {
            continue;
        }
        let Some(Kept { key, found, .. }) = kept.take() else {
            continue;
        };
        let adopted = if flight >= 0.0 {
            adopt_flight(e, flight as u64, cold, beta)
        } else if let Some(found) = found {
            keep_found(e, &key, None, cold, found, beta)
        } else {
            continue;
        };
        if adopted >> 1 >= 0 {
            slotted.push((i, key, adopted >> 1));
        }
        out[i] = adopted;
    }
    for (i, key, s) in slotted {
        if e.cache.live_slot(&key).map(|s| s as i32) != Some(s) {
            out[i] = NO_SLOT * 2 + (out[i] & 1);
        }
    }
    Adopted(out)
}

/// `adoptMany` of a batch read (no flights) when the in-process tier keeps nothing (`l1:
/// false`): nothing is adopted, so each key found answers `NO_SLOT` and, for a cold read,
/// whether its caller should start its refresh, as `keep_found` decides it. A profile of a warm
/// batch of 1,000 keys with `l1: false` put 7% of the JS thread's time in `keep_found`'s
/// adoption of entries that tier then dropped.
fn read_kept_nowhere(
    e: &mut super::engines::EngineState,
    found: &mut FoundKeys,
    flights: &[f64],
    cold: bool,
    beta: f64,
    out: &mut [i32],
) {
    let beta = if beta >= 0.0 {
        beta
    } else {
        e.cache.options().defaults.beta
    };
    for (i, kept) in found.0.iter_mut().enumerate() {
        if flights.get(i).copied().unwrap_or(-2.0) < -1.0 {
            continue;
        }
        let Some(Kept {
            found: Some(found), ..
        }) = kept.take()
        else {
            continue;
        };
        let refresh = cold && e.cache.served_refresh_due(&found.envelope, beta);
        out[i] = NO_SLOT * 2 + i32::from(refresh);
    }
}

/// `getEntry` for many keys at once (`getMany` without an index of fresh entries: l1 off), in
/// one call where `getMany` made two per key (get's hot path, then `getEntry` for its miss), what
/// `getEntry` answers per key (the keys checked by the facade already). `joined`, `lengths`: the
/// keys (see `split_keys`).
#[napi(ts_return_type = "Int32Array")]
pub fn get_entries(
    id: u32,
    joined: String,
    lengths: Uint32Array,
) -> std::result::Result<Adopted, JsErr> {
    let keys =
        split_keys(&joined, &lengths).map_err(|e| napi_fail(ErrorCode::InvalidArgument, e))?;
    with_engine(id, |c| {
        let count_miss = c.redis.is_none();
        let mut out = Vec::with_capacity(keys.len());
        for key in &keys {
            out.push(c.cache.get_hit(key, count_miss)?.map_or(MISS, encode_hit));
        }
        Ok(Adopted(out))
    })
}

/// The found values' texts of a batch, each apart (`null` for none), cut out of the joined
/// text `joined` it answered: what the facade reads when that text did not parse as a whole (a
/// corrupt value among them). Before `adoptMany` (which takes the entries).
#[napi]
pub fn batch_texts(found: &External<FoundKeys>, joined: String) -> Vec<Option<String>> {
    // Each text is one element of `joined`, in order, `,` between them (see `Batch::of`).
    let mut at = 1;
    found
        .0
        .iter()
        .map(|kept| {
            let kept = kept.as_ref().filter(|k| k.text)?;
            let end = (at + kept.size as usize).min(joined.len().saturating_sub(1));
            let text = joined.get(at..end).map(str::to_string);
            at = end + 1;
            text
        })
        .collect()
}

/// A `loadMany` call is about to run: `loads` counts it once, however many keys it loads (its
/// keys' flights skip `noteLoaderCall`); `refresh`: a background refresh batch, counted once in
/// `refreshes` too.
#[napi]
pub fn note_batch_call(id: u32, refresh: bool) {
    if let Some(e) = engine(id) {
        let e = e.borrow();
        e.cache.stats.loads.incr();
        if refresh {
            e.cache.stats.refreshes.incr();
        }
    }
}

/// Registers the background refresh of one stale key of a batch (`beginRefresh` for a
/// `getOrLoadMany` call): its flight id, or -1 if one already runs or (`first`: no key of the batch
/// has a flight yet) the bound on refreshes running is reached. `seen`: the fresh-until of the
/// copy the caller was served from Redis (-1: from the in-process tier), the refresh's basis.
#[napi]
pub fn begin_batch_refresh(id: u32, key: String, first: bool, seen: f64) -> f64 {
    let seen = (seen >= 0.0).then_some(seen);
    engine(id)
        .and_then(|e| e.borrow_mut().cache.begin_batch_refresh(&key, first, seen))
        .map_or(-1.0, |f| f as f64)
}
