//! The cache: composes the in-process store, request coalescing, XFetch, jitter, negative caching
//! and error backoff into the decisions `getOrLoad` makes. It decides; the embedder acts (calls
//! the loader, keeps values at the slots the store hands out, hands refreshes to `waitUntil`).
//!
//! Everything here runs on one thread (in Node, the JS thread), so a fresh hit is one synchronous
//! call: a hash lookup, a time read, one random draw for XFetch, no allocation. A tagged entry's
//! hit also reads its tags' clocks (see `inbox.rs`); an untagged one reads nothing more.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::clock::{Clock, SystemClock};
use crate::envelope::{Envelope, State};
use crate::error::{Error, ErrorCode, Result};
use crate::fresh::FreshWords;
use crate::inbox::{tag_bucket, Inbox, Stamp, Tentative, Verdict};
use crate::jitter;
use crate::policy::{self, EntryPolicy, Options};
use crate::singleflight::{FlightId, FlightKind, Role, Singleflight};
use crate::stats::Stats;
use crate::store::memory::{Held, MemoryStore, Slot, Tags};
use crate::xfetch;

mod invalidate;

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hit {
    /// A fresh value at `slot`; `refresh` asks the caller to start an early (XFetch) refresh.
    Fresh { slot: Slot, refresh: bool },
    /// A stale value at `slot`, served at once; `refresh` asks the caller to start the refresh.
    Stale { slot: Slot, refresh: bool },
    /// A cached not-found at `slot`.
    Negative { slot: Slot },
}

impl Hit {
    pub fn slot(self) -> Slot {
        match self {
            Hit::Fresh { slot, .. } | Hit::Stale { slot, .. } | Hit::Negative { slot } => slot,
        }
    }

    pub fn wants_refresh(self) -> bool {
        matches!(
            self,
            Hit::Fresh { refresh: true, .. } | Hit::Stale { refresh: true, .. }
        )
    }
}

/// What `getOrLoad` does after the hot path missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Serve(Hit),
    /// Call the loader, then [`Cache::complete`] or [`Cache::fail`] with this flight.
    Lead(FlightId),
    /// Wait for the flight already running.
    Join(FlightId),
}

/// An entry just written: its envelope, and the slot its value goes to (`None`: tier off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Written {
    pub slot: Option<Slot>,
    pub envelope: Envelope,
}

/// What a write carries besides its times: the entry's tags and its value's serialized size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    pub tags: Vec<String>,
    /// Bytes, for `l1.maxBytes`.
    pub size: u64,
}

/// What a loader returned, as the cache writes it: its time, whether it found nothing, the
/// policy it is kept by, its tags and size, and (`inherit`: a refresh or forceRefresh) whether
/// a result given no tags keeps the tags of the entry it replaces.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub compute_ms: f64,
    pub negative: bool,
    pub policy: EntryPolicy,
    pub extra: Extra,
    pub inherit: bool,
}

impl Loaded {
    /// A value (not a not-found), with no tags, that inherits none.
    pub fn new(compute_ms: f64, policy: EntryPolicy) -> Self {
        Loaded {
            compute_ms,
            negative: false,
            policy,
            extra: Extra::default(),
            inherit: false,
        }
    }
}

/// A load's result ready to be written: its envelope (born when the load began) and extras.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub envelope: Envelope,
    pub extra: Extra,
}

/// The in-process tags of `names` (`None` for none).
fn tag_set(names: &[String]) -> Option<Box<Tags>> {
    if names.is_empty() {
        return None;
    }
    Some(Box::new(Tags {
        names: names.to_vec().into(),
        buckets: names.iter().map(|t| tag_bucket(t)).collect(),
    }))
}

fn buckets(names: &[String]) -> Vec<u16> {
    names.iter().map(|t| tag_bucket(t)).collect()
}

/// What `inspect` reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryInfo {
    pub state: EntryState,
    pub fresh_until: f64,
    pub hard_until: f64,
    pub compute_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    Fresh,
    Stale,
    Negative,
}

impl EntryState {
    /// The state of a live (not expired) entry at `now`.
    pub fn of_live(env: &Envelope, now: f64) -> EntryState {
        if env.negative {
            EntryState::Negative
        } else if now < env.fresh_until {
            EntryState::Fresh
        } else {
            EntryState::Stale
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            EntryState::Fresh => "fresh",
            EntryState::Stale => "stale",
            EntryState::Negative => "negative",
        }
    }
}

pub struct Cache<C: Clock = SystemClock> {
    options: Options,
    store: MemoryStore,
    flights: Singleflight,
    /// Shared with background work on other threads (Redis), which counts there too.
    pub stats: Arc<Stats>,
    /// Invalidations from other threads, applied at the start of each call.
    inbox: Arc<Inbox>,
    clock: C,
    /// Draws for XFetch and jitter; a fast non-cryptographic generator is all they need.
    rng: SmallRng,
    closed: bool,
    /// Whether the embedder observes the invalidations applied from the inbox (someone listens);
    /// while it does, `applied` keeps them, in order, until it takes them.
    observing: bool,
    /// Keys dropped from the inbox since the embedder last took them; `None`: everything.
    applied: Vec<Option<Box<str>>>,
    /// Background refresh flights whose loader may still run, bounded by
    /// `options.max_refreshes`. A flight superseded by a write leaves the key's registry but
    /// its loader runs on, so this counts flights until their end is reported, not registry
    /// entries. Each holds its basis: the fresh-until of the copy it refreshes, so the Redis
    /// gate can tell a copy refreshed elsewhere meanwhile (newer than the basis) from the one
    /// this refresh replaces, with or without an in-process entry (`l1: false` keeps none).
    refreshing: HashMap<FlightId, f64>,
    /// Takes the in-process copies to check against Redis after a lost bus connection (set by
    /// the embedder when there is a Redis tier); without one they are dropped instead.
    verifier: Option<Box<dyn Fn(Vec<Held>)>>,
}

/// Applied invalidations kept between two `take_applied` calls at most (the embedder takes them
/// after every call that applies the inbox, so this only bounds a misbehaving one).
pub const MAX_APPLIED: usize = 4 * crate::inbox::MAX_PENDING_KEYS;

impl Cache<SystemClock> {
    pub fn new(options: Options) -> Self {
        Cache::with_clock(options, SystemClock, SmallRng::from_os_rng())
    }
}

impl<C: Clock> Cache<C> {
    pub fn with_clock(options: Options, clock: C, rng: SmallRng) -> Self {
        let inbox = Arc::new(Inbox::default());
        Cache {
            store: MemoryStore::new(options.l1_max_entries, options.l1_max_bytes)
                .sharing(inbox.fresh().clone()),
            options,
            flights: Singleflight::default(),
            stats: Arc::new(Stats::default()),
            inbox,
            clock,
            rng,
            closed: false,
            observing: false,
            applied: Vec::new(),
            refreshing: HashMap::new(),
            verifier: None,
        }
    }

    /// What takes the in-process copies to check after a lost bus connection (see `verifier`).
    pub fn set_verifier(&mut self, verifier: Box<dyn Fn(Vec<Held>)>) {
        self.verifier = Some(verifier);
    }

    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Drops what other processes replaced. Cheap when nothing is pending.
    #[inline]
    fn apply_inbox(&mut self) {
        if self.inbox.has_pending() {
            let d = self.inbox.take();
            if d.clear_all {
                self.store.clear();
                self.note_applied(None);
            } else if d.verify {
                match &self.verifier {
                    // The check drops, through this inbox, those another instance changed.
                    Some(verify) => verify(self.store.held()),
                    None => {
                        self.store.clear();
                        self.note_applied(None);
                    }
                }
            }
            for key in d.keys {
                self.store.remove(&key);
                self.note_applied(Some(key));
            }
        }
    }

    fn note_applied(&mut self, key: Option<Box<str>>) {
        if self.observing && self.applied.len() < MAX_APPLIED {
            self.applied.push(key);
        }
    }

    /// Starts or stops keeping the invalidations applied from the inbox for the embedder (it
    /// reports them to whoever listens; nothing is kept while nobody does).
    pub fn observe_invalidations(&mut self, on: bool) {
        self.observing = on;
        if !on {
            self.applied = Vec::new();
        }
    }

    /// The invalidations applied since the last call, in order (`None`: everything was dropped).
    pub fn take_applied(&mut self) -> Vec<Option<Box<str>>> {
        std::mem::take(&mut self.applied)
    }

    /// Applied invalidations not yet taken (for tests: none may pile up).
    pub fn applied_kept(&self) -> usize {
        self.applied.len()
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    pub fn now(&self) -> f64 {
        self.clock.now_ms()
    }

    fn ensure_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::new(ErrorCode::Closed, "the cache is closed"));
        }
        Ok(())
    }

    /// The words shared with the embedder's index of fresh entries (see `fresh.rs`), or `None`
    /// when the in-process tier keeps nothing to index.
    pub fn fresh_words(&self) -> Option<&Arc<FreshWords>> {
        self.store.indexes_fresh().then(|| self.inbox.fresh())
    }

    /// The embedder's touch log is full: apply it (LRU recency of the hits it served).
    pub fn apply_touches(&mut self) {
        self.store.apply_touches();
    }

    /// Offers a hit proven fresh to the embedder's index: until when no decision is due for
    /// it, for a read without options (the constructor's beta), whatever this read's beta.
    /// Whole milliseconds: `Date.now() < until` then holds for the precise time too.
    #[inline]
    fn offer_fresh(&self, env: &Envelope) {
        let beta = self.options.defaults.beta;
        let until = env.fresh_until
            - xfetch::horizon(env.fresh_until, env.hard_until, env.compute_ms, beta);
        self.inbox.fresh().offer(until.floor());
    }

    /// The hot path: a usable entry for `key`, counted in the stats, or `None`.
    /// `beta` is the XFetch beta of this read (the constructor's unless the call gave one).
    /// A fresh hit proven by the fast test is offered to the embedder's index (`offer_fresh`);
    /// any other hit offers nothing (until 0).
    #[inline]
    pub fn peek(&mut self, key: &str, beta: f64) -> Option<Hit> {
        self.apply_inbox();
        let entry = self.store.get(key)?;
        let env = entry.envelope;
        let slot = entry.slot;
        let now = self.clock.now_ms();
        // Fast proof of freshness: far enough from expiry that no XFetch draw could refresh.
        // Most hits on a hot key end here. `plain` (neither negative nor tagged) is one byte,
        // tested as `!negative` was before tags existed.
        if entry.plain
            && now
                < env.fresh_until
                    - xfetch::horizon(env.fresh_until, env.hard_until, env.compute_ms, beta)
        {
            self.stats.hits.incr();
            self.offer_fresh(&env);
            return Some(Hit::Fresh {
                slot,
                refresh: false,
            });
        }
        let mut env = env;
        if let Some(tags) = &entry.tags {
            // Cleared or tag-deleted since it was born: gone.
            match self.inbox.judge(env.born, &tags.buckets, now) {
                Verdict::Dead => {
                    self.store.remove(key);
                    return None;
                }
                // Tag-expired since it was born: stale from now on (its refresh is born after);
                // a not-found turns stale too, and is then loaded again (below).
                Verdict::Stale if env.fresh_until > now => {
                    entry.envelope.fresh_until = now.floor();
                    env = entry.envelope;
                }
                _ => {}
            }
            if !env.negative
                && now
                    < env.fresh_until
                        - xfetch::horizon(env.fresh_until, env.hard_until, env.compute_ms, beta)
            {
                self.stats.hits.incr();
                self.offer_fresh(&env);
                return Some(Hit::Fresh {
                    slot,
                    refresh: false,
                });
            }
        }
        self.inbox.fresh().offer(0.0);
        let hit = match env.state(now) {
            State::Expired => return None,
            // A not-found past its negativeTtl's freshness (only an expire makes one): nothing
            // worth serving stale, so it is loaded again.
            State::Stale if env.negative => return None,
            _ if env.negative => Hit::Negative { slot },
            State::Fresh => {
                let refresh = self.drawn_early(&env, now, beta) && self.may_refresh(key, &env, now);
                Hit::Fresh { slot, refresh }
            }
            State::Stale if !self.inbox.trusts_stale() => return None,
            State::Stale => {
                let refresh = self.may_refresh(key, &env, now);
                Hit::Stale { slot, refresh }
            }
        };
        match hit {
            Hit::Fresh { .. } => self.stats.hits.incr(),
            Hit::Stale { .. } => self.stats.stale_hits.incr(),
            Hit::Negative { .. } => self.stats.negative_hits.incr(),
        }
        Some(hit)
    }

    /// A refresh may start: none runs for the key, no error backoff holds it, and fewer than
    /// `maxConcurrentRefreshes` run in all (past it the stale value is served and a later read
    /// refreshes the key).
    fn may_refresh(&self, key: &str, env: &Envelope, now: f64) -> bool {
        env.refresh_allowed(now)
            && self.refreshing.len() < self.options.max_refreshes
            && self.flights.current(key).is_none()
    }

    /// Flight `id` ended (whichever way): if it was a background refresh, its place is free.
    fn end_refresh(&mut self, id: FlightId) {
        if !self.refreshing.is_empty() {
            self.refreshing.remove(&id);
        }
    }

    /// The fresh-until of the copy the key's running background refresh replaces (see
    /// `refreshing`), or of the in-process entry when no refresh runs.
    pub fn refresh_basis(&self, key: &str) -> Option<f64> {
        match self.flights.current(key) {
            Some(f) if f.kind == FlightKind::Refresh => self.refreshing.get(&f.id).copied(),
            _ => self.fresh_until(key),
        }
    }

    /// A caller served `env` from Redis (a cold load answered by another process's entry)
    /// should start its refresh: it is stale and no error backoff holds it, or it is fresh and
    /// an XFetch draw (at `beta`) says so, as a hit on the in-process copy would. Without this
    /// draw a cache with `l1: false`, whose every read is answered this way, would never
    /// refresh early.
    pub fn served_refresh_due(&mut self, env: &Envelope, beta: f64) -> bool {
        let now = self.clock.now_ms();
        match env.state(now) {
            State::Fresh if !env.negative => {
                env.refresh_allowed(now) && self.drawn_early(env, now, beta)
            }
            _ => env.refresh_due(now),
        }
    }

    /// One XFetch draw for a fresh entry at `beta` (0: off): refresh it early?
    fn drawn_early(&mut self, env: &Envelope, now: f64, beta: f64) -> bool {
        beta > 0.0
            && xfetch::should_refresh(
                now,
                env.fresh_until,
                env.hard_until,
                env.compute_ms,
                beta,
                1.0 - self.rng.random::<f64>(),
            )
    }

    /// Background refreshes running now (for tests and `debugCounts`).
    pub fn refreshes_running(&self) -> usize {
        self.refreshing.len()
    }

    /// After the hot path missed (or for calls with options): serve, lead a load, or join one.
    /// `force` (forceRefresh) skips any entry but still joins a running flight.
    pub fn lookup(&mut self, key: &str, beta: f64, force: bool) -> Result<Step> {
        self.ensure_open()?;
        self.apply_inbox();
        if !force {
            if let Some(hit) = self.peek(key, beta) {
                return Ok(Step::Serve(hit));
            }
        }
        // A miss until Redis answers the flight (then an l2Hit, see `adopt`).
        self.stats.misses.incr();
        // A load that began before the key was last invalidated (a write elsewhere, or here) is
        // not joined: its result is older than that write.
        let stamp = self.inbox.stamp(key).0;
        let born = self.inbox.clock();
        let role = self
            .flights
            .lead_or_join(key, FlightKind::Load, stamp, born);
        if let Role::Join(_) = role {
            self.stats.coalesced.incr();
        }
        Ok(role.into())
    }

    /// Starts the background refresh a [`Hit`] asked for; `None` if one already runs.
    ///
    /// `seen`: the fresh-until of the copy the caller was served, when it came from Redis
    /// rather than from the in-process tier (which may keep none of it); else the in-process
    /// entry's is the refresh's basis.
    pub fn begin_refresh(&mut self, key: &str, seen: Option<f64>) -> Option<FlightId> {
        if self.closed || self.refreshing.len() >= self.options.max_refreshes {
            return None;
        }
        let basis = seen.or_else(|| self.fresh_until(key)).unwrap_or(0.0);
        let stamp = self.inbox.stamp(key).0;
        let born = self.inbox.clock();
        let id = self.flights.lead(key, FlightKind::Refresh, stamp, born)?;
        self.refreshing.insert(id, basis);
        Some(id)
    }

    /// `begin_refresh` for a key of a batch refresh (`getOrLoadMany`: one `loadMany` call for all
    /// its stale keys). The bound on refreshes running is about queries in flight, and a batch is
    /// one: only its `first` key is held to it, the others join that call.
    pub fn begin_batch_refresh(
        &mut self,
        key: &str,
        first: bool,
        seen: Option<f64>,
    ) -> Option<FlightId> {
        if self.closed || (first && self.refreshing.len() >= self.options.max_refreshes) {
            return None;
        }
        let basis = seen.or_else(|| self.fresh_until(key)).unwrap_or(0.0);
        let stamp = self.inbox.stamp(key).0;
        let born = self.inbox.clock();
        let id = self.flights.lead(key, FlightKind::Refresh, stamp, born)?;
        self.refreshing.insert(id, basis);
        Some(id)
    }

    /// The loader is about to run for flight `id` (not every flight calls it: another process
    /// may have the value). Counts `loads`, and `refreshes` for a background refresh.
    pub fn note_loader_call(&mut self, key: &str, id: FlightId) {
        self.stats.loads.incr();
        if let Some(f) = self.flights.current(key) {
            if f.id == id && f.kind == FlightKind::Refresh {
                self.stats.refreshes.incr();
            }
        }
    }

    /// The loader of flight `id` returned (no Redis tier). Writes the entry unless the flight
    /// was superseded (then `None`: write it nowhere); its `slot` is where the embedder keeps
    /// the value (`None`: the in-process tier keeps nothing).
    pub fn complete(&mut self, key: &str, id: FlightId, loaded: Loaded) -> Option<Written> {
        let prepared = self.prepare(key, id, loaded, None)?;
        let envelope = prepared.as_ref().map(|p| p.envelope);
        let slot = self.finish_write(key, id, prepared, true, None);
        envelope.map(|envelope| Written { slot, envelope })
    }

    /// The loader of flight `id` returned: the envelope its result is written with, while the
    /// flight stays registered (callers keep joining it, not starting another load) until
    /// [`Cache::finish_write`]. `None`: superseded or closed, write it nowhere; `Some(None)`:
    /// nothing to cache (a zero TTL), though the flight still ends with `finish_write`.
    ///
    /// The entry is born when the flight began, or at `gate_born` (the namespace clock Redis
    /// gave as the load passed its gate, before the loader ran) if later. `inherit` (a refresh
    /// or forceRefresh): a result given no tags keeps the tags of the entry it replaces.
    pub fn prepare(
        &mut self,
        key: &str,
        id: FlightId,
        loaded: Loaded,
        gate_born: Option<u64>,
    ) -> Option<Option<Prepared>> {
        let Loaded {
            compute_ms,
            negative,
            policy,
            mut extra,
            inherit,
        } = loaded;
        // The loader has returned: the database is done with this refresh.
        self.end_refresh(id);
        self.apply_inbox();
        if self.closed {
            return None;
        }
        let born = self.flights.current(key).filter(|f| f.id == id)?.born;
        let born = born.max(gate_born.unwrap_or(0));
        if extra.tags.is_empty() && inherit {
            if let Some(tags) = self.store.peek(key).and_then(|e| e.tags.as_ref()) {
                extra.tags = tags.names.to_vec();
            }
        }
        Some(
            self.entry_envelope(compute_ms, negative, &policy, !extra.tags.is_empty())
                .map(|e| Prepared {
                    envelope: e.born_at(born),
                    extra,
                }),
        )
    }

    /// Ends flight `id` once its result was written back (or dropped). The entry is kept in
    /// process only if `keep` (Redis did not find something newer), the flight is still the
    /// key's (no `set`/`delete` here since), and no invalidation of the key arrived since
    /// `stamp` was taken (before the load asked Redis). Returns where the value goes.
    pub fn finish_write(
        &mut self,
        key: &str,
        id: FlightId,
        prepared: Option<Prepared>,
        keep: bool,
        stamp: Option<Stamp>,
    ) -> Option<Slot> {
        self.end_refresh(id);
        self.apply_inbox();
        self.flights.take(key, id)?;
        if self.closed || !keep {
            return None;
        }
        if stamp.is_some_and(|s| s != self.inbox.stamp(key)) {
            return None;
        }
        match prepared {
            // A clear, or a deleteByTag of one of its tags, since the load began: the result
            // is older than that, and so is any copy here.
            Some(p)
                if self.inbox.gone(
                    p.envelope.born,
                    &buckets(&p.extra.tags),
                    self.clock.now_ms(),
                ) =>
            {
                self.store.remove(key);
                None
            }
            Some(p) => self
                .store
                .insert(key, p.envelope, tag_set(&p.extra.tags), p.extra.size),
            None => {
                // A zero TTL caches nothing, and an older copy must not outlive it.
                self.store.remove(key);
                None
            }
        }
    }

    /// Takes an envelope found in Redis into the in-process tier, ending flight `id` if given.
    /// `stamp` is the key's invalidation stamp taken before the read was sent: if the key was
    /// invalidated since, the read may predate a write elsewhere and is not kept. `None` when
    /// not kept (superseded, invalidated since, or already expired).
    /// `extra`: the entry's tags and its value's size. The flight's callers, counted as misses
    /// while they waited, count as l2Hits instead: Redis answered them.
    pub fn adopt(
        &mut self,
        key: &str,
        id: Option<FlightId>,
        envelope: Envelope,
        extra: Extra,
        stamp: Option<Stamp>,
    ) -> Option<Option<Slot>> {
        self.apply_inbox();
        if let Some(id) = id {
            self.end_refresh(id);
            let callers = self.flights.take(key, id)?.callers();
            self.stats.misses.sub(callers);
            self.stats.l2_hits.add(callers);
        }
        if self.closed || envelope.state(self.clock.now_ms()) == State::Expired {
            return None;
        }
        if stamp.is_some_and(|s| s != self.inbox.stamp(key)) {
            return None;
        }
        if self
            .inbox
            .gone(envelope.born, &buckets(&extra.tags), self.clock.now_ms())
        {
            // Redis checked it against what it knew; an invalidation heard since wins.
            self.store.remove(key);
            return None;
        }
        Some(
            self.store
                .insert(key, envelope, tag_set(&extra.tags), extra.size),
        )
    }

    /// Ends flight `id` without writing (another process holds the refresh), and holds local
    /// refresh attempts of the key back for `hold_ms`: that process will publish its result.
    pub fn abandon(&mut self, key: &str, id: FlightId, hold_ms: f64) {
        self.end_refresh(id);
        if self.flights.finish(key, id) {
            let until = self.clock.now_ms() + hold_ms;
            if let Some(e) = self.store.get(key) {
                e.envelope.retry_after = e.envelope.retry_after.max(until);
            }
        }
    }

    /// The loader of flight `id` failed (or its value could not be serialized). Nothing is
    /// cached; a failed refresh leaves the stale value served and holds further refreshes back
    /// for `errorBackoff`.
    /// Returns the refresh's retry-after (epoch ms), for the Redis envelope; `None` otherwise.
    pub fn fail(&mut self, key: &str, id: FlightId) -> Option<f64> {
        self.end_refresh(id);
        let flight = self.flights.take(key, id)?;
        if flight.kind != FlightKind::Refresh {
            return None;
        }
        self.stats.refresh_errors.incr();
        let retry_after = self.clock.now_ms() + self.options.error_backoff;
        if let Some(e) = self.store.get(key) {
            e.envelope.retry_after = retry_after;
        }
        Some(retry_after)
    }

    /// The loader of flight `id` declined caching its result (`ctx.skipCache()`): the flight
    /// ends, nothing is written, no backoff is recorded, and the entry already there (if any) is
    /// left as it was.
    pub fn skip(&mut self, key: &str, id: FlightId) {
        self.end_refresh(id);
        self.flights.finish(key, id);
    }

    /// Writes a value given by `set`, born now; any flight of the key is superseded. `None`:
    /// nothing is cached (a zero TTL).
    pub fn set(
        &mut self,
        key: &str,
        negative: bool,
        policy: &EntryPolicy,
        extra: &Extra,
    ) -> Result<Option<Written>> {
        self.ensure_open()?;
        self.apply_inbox();
        self.flights.supersede(key);
        // A Redis read of the key already on its way predates this write: not to be kept.
        self.inbox.touch(key);
        Ok(self.write(key, 0.0, negative, policy, extra))
    }

    fn write(
        &mut self,
        key: &str,
        compute_ms: f64,
        negative: bool,
        p: &EntryPolicy,
        extra: &Extra,
    ) -> Option<Written> {
        match self.entry_envelope(compute_ms, negative, p, !extra.tags.is_empty()) {
            Some(envelope) => {
                let envelope = envelope.born_at(self.inbox.clock());
                Some(Written {
                    slot: self
                        .store
                        .insert(key, envelope, tag_set(&extra.tags), extra.size),
                    envelope,
                })
            }
            None => {
                // negativeTtl 0 caches no not-found; ttl = hardTtl = 0 caches nothing.
                self.store.remove(key);
                None
            }
        }
    }

    /// The envelope of an entry written now (ttls jittered; a `tagged` one's clamped to
    /// `tagTtl`, see [`policy::clamp_tagged`]), or `None` when its TTL caches nothing.
    fn entry_envelope(
        &mut self,
        compute_ms: f64,
        negative: bool,
        p: &EntryPolicy,
        tagged: bool,
    ) -> Option<Envelope> {
        let factor = if p.jitter > 0.0 {
            jitter::factor(p.jitter, self.rng.random::<f64>())
        } else {
            1.0
        };
        let (ttl, hard_ttl) = if negative {
            (p.negative_ttl * factor, p.negative_ttl * factor)
        } else {
            (p.ttl * factor, p.hard_ttl * factor)
        };
        let (ttl, hard_ttl) = if tagged {
            policy::clamp_tagged(ttl, hard_ttl, self.options.tag_ttl, compute_ms)
        } else {
            (ttl, hard_ttl)
        };
        if hard_ttl <= 0.0 {
            return None;
        }
        Some(Envelope::new(
            self.clock.now_ms(),
            ttl,
            hard_ttl,
            compute_ms,
            negative,
        ))
    }

    /// Removes the key and supersedes its flight. Returns the freed slot and whether a live
    /// (not yet expired) entry was removed.
    pub fn delete(&mut self, key: &str) -> Result<(Option<Slot>, bool)> {
        self.ensure_open()?;
        self.apply_inbox();
        self.flights.supersede(key);
        self.inbox.touch(key);
        let now = self.clock.now_ms();
        Ok(match self.store.remove(key) {
            Some(e) => (Some(e.slot), e.envelope.state(now) != State::Expired),
            None => (None, false),
        })
    }

    /// Fresh, stale or negative entry for `get` (never loads, never refreshes). A miss here is
    /// counted unless Redis is asked next (`count_miss` false), which counts what it finds.
    pub fn get_hit(&mut self, key: &str, count_miss: bool) -> Result<Option<Hit>> {
        self.ensure_open()?;
        let hit = self.peek(key, 0.0);
        if hit.is_none() && count_miss {
            self.stats.misses.incr();
        }
        // `get` never refreshes: a hit that asks for one is reported without the request.
        Ok(hit.map(|h| match h {
            Hit::Fresh { slot, .. } => Hit::Fresh {
                slot,
                refresh: false,
            },
            Hit::Stale { slot, .. } => Hit::Stale {
                slot,
                refresh: false,
            },
            n => n,
        }))
    }

    /// Slots freed since the last call whose values the embedder should drop (a byte budget).
    pub fn take_released(&mut self) -> Vec<Slot> {
        self.store.take_released()
    }

    /// Entries in the in-process tier, and the sum of their values' sizes.
    pub fn l1_usage(&self) -> (usize, u64) {
        (self.store.len(), self.store.bytes())
    }

    pub fn inspect(&mut self, key: &str) -> Result<Option<EntryInfo>> {
        self.ensure_open()?;
        self.apply_inbox();
        let Some(e) = self.store.peek(key) else {
            return Ok(None);
        };
        if self.tagged_dead(e) {
            return Ok(None);
        }
        let mut env = e.envelope;
        let now = self.clock.now_ms();
        if env.state(now) == State::Expired {
            return Ok(None);
        }
        if e.tags
            .as_ref()
            .is_some_and(|t| self.inbox.expired(env.born, &t.buckets))
        {
            env.fresh_until = env.fresh_until.min(now.floor());
        }
        Ok(Some(EntryInfo {
            state: EntryState::of_live(&env, now),
            fresh_until: env.fresh_until,
            hard_until: env.hard_until,
            compute_ms: env.compute_ms,
        }))
    }

    /// The envelope of the entry held for `key`, whatever its state, once what other processes
    /// replaced is dropped: the write this instance last knew of in Redis (a `set` made now
    /// while Redis cannot take it expects to find that write there when it is replayed).
    pub fn held_envelope(&mut self, key: &str) -> Option<Envelope> {
        self.apply_inbox();
        self.store.peek(key).map(|e| e.envelope)
    }

    /// The in-process copy's freshUntil, if any (a refresh compares it with Redis's copy).
    pub fn fresh_until(&self, key: &str) -> Option<f64> {
        self.store.peek(key).map(|e| e.envelope.fresh_until)
    }

    /// The slot of a live (not expired, not tag-deleted) entry, LRU order and stats untouched.
    pub fn live_slot(&mut self, key: &str) -> Option<Slot> {
        self.apply_inbox();
        let e = self.store.peek(key)?;
        (e.envelope.state(self.clock.now_ms()) != State::Expired && !self.tagged_dead(e))
            .then_some(e.slot)
    }

    /// A tagged entry cleared or tag-deleted since it was born (what a hit checks).
    fn tagged_dead(&self, e: &crate::store::memory::Entry) -> bool {
        e.tags.as_ref().is_some_and(|t| {
            self.inbox
                .gone(e.envelope.born, &t.buckets, self.clock.now_ms())
        })
    }

    /// Drops every entry and flight; later calls fail with `ERR_CLOSED`.
    pub fn close(&mut self) {
        self.closed = true;
        self.store.clear();
        self.flights.clear();
        self.refreshing.clear();
    }

    /// Flights still registered: zero once every load has ended (tests assert no leak).
    pub fn flights_in_progress(&self) -> usize {
        self.flights.len()
    }

    pub fn entries(&self) -> usize {
        self.store.len()
    }
}

impl From<Role> for Step {
    fn from(r: Role) -> Step {
        match r {
            Role::Lead(id) => Step::Lead(id),
            Role::Join(id) => Step::Join(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::{RawOptions, TtlOverrides};

    fn cache(f: impl FnOnce(&mut RawOptions)) -> (Cache<ManualClock>, ManualClock) {
        let mut raw = RawOptions::default();
        raw.ttls.jitter = Some(0.0);
        f(&mut raw);
        let clock = ManualClock::new(1_000_000.0);
        let c = Cache::with_clock(
            Options::validate(raw).unwrap(),
            clock.clone(),
            SmallRng::seed_from_u64(1),
        );
        (c, clock)
    }

    fn load(c: &mut Cache<ManualClock>, key: &str, compute_ms: f64) -> Slot {
        let policy = c.options().defaults;
        let Step::Lead(id) = c.lookup(key, policy.beta, false).unwrap() else {
            panic!("expected to lead")
        };
        c.note_loader_call(key, id);
        c.complete(key, id, Loaded::new(compute_ms, policy))
            .unwrap()
            .slot
            .unwrap()
    }

    #[test]
    fn a_live_entry_reads_fresh_stale_or_negative() {
        let e = Envelope::new(1_000.0, 100.0, 1_000.0, 5.0, false);
        assert_eq!(EntryState::of_live(&e, 1_099.0), EntryState::Fresh);
        assert_eq!(EntryState::of_live(&e, 1_100.0), EntryState::Stale);
        let n = Envelope::new(1_000.0, 100.0, 100.0, 5.0, true);
        assert_eq!(EntryState::of_live(&n, 1_000.0), EntryState::Negative);
    }

    #[test]
    fn cold_miss_leads_once_and_others_join() {
        let (mut c, _) = cache(|_| {});
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        for _ in 0..499 {
            assert_eq!(c.lookup("k", 1.0, false).unwrap(), Step::Join(id));
        }
        let p = c.options().defaults;
        c.note_loader_call("k", id);
        let slot = c
            .complete("k", id, Loaded::new(3.0, p))
            .unwrap()
            .slot
            .unwrap();
        assert_eq!(
            c.peek("k", 1.0),
            Some(Hit::Fresh {
                slot,
                refresh: false
            })
        );
        let s = c.stats.snapshot();
        assert_eq!((s.loads, s.coalesced, s.misses, s.hits), (1, 499, 500, 1));
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn a_refresh_keeps_the_basis_it_was_started_from() {
        // l1: false keeps no entry, so the basis comes from the copy Redis served.
        let (mut c, _) = cache(|r| r.l1 = Some(None));
        let id = c.begin_refresh("k", Some(1_234.0)).unwrap();
        assert_eq!(c.refresh_basis("k"), Some(1_234.0));
        c.skip("k", id);
        assert_eq!(c.refresh_basis("k"), None);
        // With an in-process entry and no copy named, the entry's own fresh-until.
        let (mut c, _) = cache(|r| r.ttls.ttl = Some(1_000.0));
        load(&mut c, "k", 10.0);
        let fresh_until = c.fresh_until("k").unwrap();
        let id = c.begin_refresh("k", None).unwrap();
        assert_eq!(c.refresh_basis("k"), Some(fresh_until));
        assert!(c.fail("k", id).is_some());
    }

    #[test]
    fn an_entry_served_from_redis_asks_for_a_refresh_when_stale_or_drawn_early() {
        let (mut c, clock) = cache(|_| {});
        let now = clock.now_ms();
        // Stale: due, unless a backoff holds it.
        let mut stale = Envelope::new(now - 2_000.0, 1_000.0, 60_000.0, 5.0, false);
        assert!(c.served_refresh_due(&stale, 1.0));
        stale.retry_after = now + 1_000.0;
        assert!(!c.served_refresh_due(&stale, 1.0));
        // Fresh, far from expiry: no draw refreshes at beta 1; an enormous beta always does.
        let fresh = Envelope::new(now, 60_000.0, 600_000.0, 5.0, false);
        assert!(!(0..1_000).any(|_| c.served_refresh_due(&fresh, 1.0)));
        assert!((0..1_000).all(|_| c.served_refresh_due(&fresh, 1e12)));
        assert!(
            !c.served_refresh_due(&fresh, 0.0),
            "beta 0 turns XFetch off"
        );
        // A fresh not-found is never refreshed early.
        let negative = Envelope::new(now, 60_000.0, 60_000.0, 5.0, true);
        assert!(!c.served_refresh_due(&negative, 1e12));
    }

    #[test]
    fn stale_entry_is_served_and_refreshed_once() {
        let (mut c, clock) = cache(|r| r.ttls.ttl = Some(1_000.0));
        let slot = load(&mut c, "k", 10.0);
        clock.advance(1_500.0);
        assert_eq!(
            c.peek("k", 1.0),
            Some(Hit::Stale {
                slot,
                refresh: true
            })
        );
        let id = c.begin_refresh("k", None).unwrap();
        c.note_loader_call("k", id);
        // While the refresh runs, readers are served stale and start nothing.
        assert_eq!(
            c.peek("k", 1.0),
            Some(Hit::Stale {
                slot,
                refresh: false
            })
        );
        assert_eq!(c.begin_refresh("k", None), None);
        let p = c.options().defaults;
        assert_eq!(
            c.complete("k", id, Loaded::new(10.0, p)).unwrap().slot,
            Some(slot)
        );
        assert!(matches!(c.peek("k", 1.0), Some(Hit::Fresh { .. })));
        let s = c.stats.snapshot();
        assert_eq!((s.loads, s.refreshes, s.stale_hits), (2, 1, 2));
    }

    #[test]
    fn expired_entry_is_a_miss() {
        let (mut c, clock) = cache(|r| {
            r.ttls.ttl = Some(100.0);
            r.ttls.hard_ttl = Some(200.0);
        });
        load(&mut c, "k", 1.0);
        clock.advance(200.0);
        assert_eq!(c.peek("k", 1.0), None);
        assert!(matches!(c.lookup("k", 1.0, false).unwrap(), Step::Lead(_)));
        assert_eq!(c.inspect("k").unwrap(), None);
    }

    #[test]
    fn background_refreshes_are_bounded_and_every_end_frees_a_place() {
        let (mut c, clock) = cache(|r| {
            r.ttls.ttl = Some(1_000.0);
            r.max_refreshes = Some(2.0);
        });
        let keys = ["a", "b", "c", "d", "e"];
        for k in keys {
            load(&mut c, k, 10.0);
        }
        clock.advance(1_500.0);
        let a = c.begin_refresh("a", None).unwrap();
        let b = c.begin_refresh("b", None).unwrap();
        // Past the bound: still served at once, stale, with no refresh asked for or started.
        assert!(matches!(
            c.peek("c", 1.0),
            Some(Hit::Stale { refresh: false, .. })
        ));
        assert_eq!(c.begin_refresh("c", None), None);
        // Cold loads are never held back by refreshes.
        assert!(matches!(c.lookup("cold", 1.0, false), Ok(Step::Lead(_))));
        assert_eq!(c.refreshes_running(), 2);

        // A refresh superseded by a write still runs: its place is freed only when it ends.
        let p = c.options().defaults;
        c.set("a", false, &p, &Extra::default()).unwrap();
        assert_eq!(c.begin_refresh("c", None), None);
        assert!(c.complete("a", a, Loaded::new(10.0, p)).is_none());
        let c_id = c.begin_refresh("c", None).unwrap();
        assert!(matches!(
            c.peek("d", 1.0),
            Some(Hit::Stale { refresh: false, .. })
        ));

        // fail, abandon, skip, adopt and a write-back each end a refresh.
        assert!(c.fail("b", b).is_some());
        let d = c.begin_refresh("d", None).unwrap();
        c.abandon("c", c_id, 0.0);
        let e = c.begin_refresh("e", None).unwrap();
        assert_eq!(c.refreshes_running(), 2);
        c.skip("d", d);
        let env = c.store.peek("e").unwrap().envelope;
        assert!(c.adopt("e", Some(e), env, Extra::default(), None).is_some());
        assert_eq!(c.refreshes_running(), 0);
        clock.advance(10_000.0);
        let b2 = c.begin_refresh("b", None).unwrap();
        let prepared = c
            .prepare(
                "b",
                b2,
                Loaded {
                    inherit: true,
                    ..Loaded::new(5.0, p)
                },
                None,
            )
            .unwrap();
        assert_eq!(c.refreshes_running(), 0, "freed once the loader returned");
        c.finish_write("b", b2, prepared, true, None);
        assert_eq!(c.flights_in_progress(), 1, "only the cold load is left");
        c.close();
        assert_eq!(c.refreshes_running(), 0);
    }

    #[test]
    fn failed_refresh_backs_off_and_keeps_serving_stale() {
        let (mut c, clock) = cache(|r| {
            r.ttls.ttl = Some(1_000.0);
            r.error_backoff = Some(5_000.0);
        });
        let slot = load(&mut c, "k", 1.0);
        clock.advance(1_000.0);
        assert!(c.peek("k", 1.0).unwrap().wants_refresh());
        let id = c.begin_refresh("k", None).unwrap();
        c.fail("k", id);
        assert_eq!(c.stats.snapshot().refresh_errors, 1);
        clock.advance(4_999.0);
        assert_eq!(
            c.peek("k", 1.0),
            Some(Hit::Stale {
                slot,
                refresh: false
            })
        );
        clock.advance(1.0);
        assert_eq!(
            c.peek("k", 1.0),
            Some(Hit::Stale {
                slot,
                refresh: true
            })
        );
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn failed_cold_load_caches_nothing() {
        let (mut c, _) = cache(|_| {});
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        c.fail("k", id);
        assert_eq!(c.peek("k", 1.0), None);
        assert!(matches!(c.lookup("k", 1.0, false).unwrap(), Step::Lead(_)));
        assert_eq!(c.stats.snapshot().refresh_errors, 0);
    }

    #[test]
    fn xfetch_refreshes_early_near_expiry_only() {
        // hardTtl == ttl: no stale window, so XFetch is the paper's (see xfetch.rs).
        let (mut c, clock) = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.hard_ttl = Some(10_000.0);
        });
        load(&mut c, "k", 100.0);
        let early = (0..1_000)
            .filter(|_| c.peek("k", 1.0).unwrap().wants_refresh())
            .count();
        assert_eq!(
            early, 0,
            "10 s before expiry a 100 ms value is never refreshed early"
        );
        clock.advance(9_950.0); // 50 ms left: P = exp(-50/100) = 0.61
        let early = (0..1_000)
            .filter(|_| c.peek("k", 1.0).unwrap().wants_refresh())
            .count();
        assert!((550..670).contains(&early), "{early}");
        assert!(
            !(0..1_000).any(|_| c.peek("k", 0.0).unwrap().wants_refresh()),
            "beta 0 turns it off"
        );
    }

    /// What a hit offers the embedder's index: until the earliest time a decision could be due
    /// (expiry, or the first instant an XFetch draw at the constructor's beta could refresh),
    /// whatever the read's own beta; nothing for a hit near it, stale or negative.
    #[test]
    fn a_fresh_hit_offers_the_index_until_no_decision_can_be_due() {
        let (mut c, clock) = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.hard_ttl = Some(10_000.0);
        });
        load(&mut c, "k", 10.0);
        let words = c.fresh_words().unwrap().clone();
        // Reach: 10 ms x beta 1 x 37 = 370 ms before expiry at 1_010_000.
        assert!(c.peek("k", 0.0).is_some());
        assert_eq!(words.until(), 1_010_000.0 - 370.0);
        clock.advance(9_700.0); // inside the reach: a draw may refresh, no index
        assert!(matches!(c.peek("k", 1.0), Some(Hit::Fresh { .. })));
        assert_eq!(words.until(), 0.0);
        let (mut c, clock) = cache(|r| r.ttls.ttl = Some(10_000.0));
        load(&mut c, "k", 10.0);
        let words = c.fresh_words().unwrap().clone();
        // A stale window that covers a refresh: no draw, fresh until expiry.
        c.peek("k", 1.0);
        assert_eq!(words.until(), 1_010_000.0);
        clock.advance(10_000.0);
        assert!(matches!(c.peek("k", 1.0), Some(Hit::Stale { .. })));
        assert_eq!(words.until(), 0.0);
        let (mut c, _) = cache(|r| r.l1 = Some(None));
        assert!(c.fresh_words().is_none(), "l1 off: nothing to index");
        assert!(c.peek("k", 1.0).is_none());
    }

    #[test]
    fn a_stale_window_that_covers_a_refresh_leaves_it_to_the_first_stale_read() {
        // The default hardTtl (10 x ttl): a 90 s window covers the 3.7 s reach of a 100 ms load.
        let (mut c, clock) = cache(|r| r.ttls.ttl = Some(10_000.0));
        load(&mut c, "k", 100.0);
        clock.advance(9_950.0); // 50 ms left: without the window, P = exp(-50/100) = 0.61
        assert!(
            !(0..1_000).any(|_| c.peek("k", 1.0).unwrap().wants_refresh()),
            "no early refresh while a stale value can be served during one"
        );
        clock.advance(50.0);
        assert!(matches!(
            c.peek("k", 1.0),
            Some(Hit::Stale { refresh: true, .. })
        ));
        assert_eq!(c.stats.snapshot().stale_hits, 1);
    }

    #[test]
    fn negative_results_live_for_negative_ttl() {
        let (mut c, clock) = cache(|r| r.ttls.negative_ttl = Some(500.0));
        let p = c.options().defaults;
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        let slot = c
            .complete(
                "k",
                id,
                Loaded {
                    negative: true,
                    ..Loaded::new(1.0, p)
                },
            )
            .unwrap()
            .slot
            .unwrap();
        assert_eq!(c.peek("k", 1.0), Some(Hit::Negative { slot }));
        assert_eq!(c.inspect("k").unwrap().unwrap().state, EntryState::Negative);
        clock.advance(500.0);
        assert_eq!(c.peek("k", 1.0), None);
        assert_eq!(c.stats.snapshot().negative_hits, 1);
    }

    #[test]
    fn zero_negative_ttl_caches_no_not_found() {
        let (mut c, _) = cache(|r| r.ttls.negative_ttl = Some(0.0));
        let p = c.options().defaults;
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        assert_eq!(
            c.complete(
                "k",
                id,
                Loaded {
                    negative: true,
                    ..Loaded::new(1.0, p)
                }
            ),
            None
        );
        assert_eq!(c.entries(), 0);
    }

    #[test]
    fn delete_and_set_supersede_a_running_load() {
        let (mut c, _) = cache(|_| {});
        let p = c.options().defaults;
        let Step::Lead(old) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        let (_, removed) = c.delete("k").unwrap();
        assert!(!removed);
        assert_eq!(
            c.complete("k", old, Loaded::new(1.0, p)),
            None,
            "a load started before delete must not write"
        );
        let slot = c
            .set("k", false, &p, &Extra::default())
            .unwrap()
            .unwrap()
            .slot
            .unwrap();
        let (freed, removed) = c.delete("k").unwrap();
        assert_eq!((freed, removed), (Some(slot), true));
    }

    #[test]
    fn force_refresh_loads_past_a_fresh_entry_but_still_coalesces() {
        let (mut c, _) = cache(|_| {});
        load(&mut c, "k", 1.0);
        let Step::Lead(id) = c.lookup("k", 1.0, true).unwrap() else {
            panic!()
        };
        assert_eq!(c.lookup("k", 1.0, true).unwrap(), Step::Join(id));
    }

    #[test]
    fn jitter_spreads_expiry() {
        let (mut c, _) = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.jitter = Some(0.2);
        });
        let p = c.options().defaults;
        let mut until = Vec::new();
        for i in 0..200 {
            let key = format!("k{i}");
            let Step::Lead(id) = c.lookup(&key, 1.0, false).unwrap() else {
                panic!()
            };
            c.complete(&key, id, Loaded::new(1.0, p));
            let info = c.inspect(&key).unwrap().unwrap();
            let ttl = info.fresh_until - c.now();
            assert!((8_000.0..12_000.0).contains(&ttl), "{ttl}");
            // ttl and hardTtl are scaled by the same factor (up to rounding to whole ms).
            assert!(((info.hard_until - c.now()) / ttl - 10.0).abs() < 1e-3);
            until.push(ttl);
        }
        let spread = until.iter().cloned().fold(f64::MIN, f64::max)
            - until.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread > 3_000.0, "{spread}");
    }

    #[test]
    fn closed_cache_refuses_work() {
        let (mut c, _) = cache(|_| {});
        load(&mut c, "k", 1.0);
        c.close();
        assert_eq!(
            c.lookup("k", 1.0, false).unwrap_err().code,
            ErrorCode::Closed
        );
        assert_eq!(c.peek("k", 1.0), None);
        assert_eq!(c.begin_refresh("k", None), None);
    }

    #[test]
    fn call_policy_ttl_applies_to_its_entry() {
        let (mut c, _) = cache(|_| {});
        let p = c
            .options()
            .resolve(&TtlOverrides {
                ttl: Some(50.0),
                ..Default::default()
            })
            .unwrap();
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        c.complete("k", id, Loaded::new(1.0, p));
        let info = c.inspect("k").unwrap().unwrap();
        assert_eq!(info.fresh_until - c.now(), 50.0);
        assert_eq!(info.hard_until - c.now(), 500.0);
    }
}

#[cfg(test)]
mod inbox_tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::RawOptions;

    fn cache() -> (Cache<ManualClock>, ManualClock) {
        let mut raw = RawOptions::default();
        raw.ttls.jitter = Some(0.0);
        raw.ttls.ttl = Some(1_000.0);
        let clock = ManualClock::new(0.0);
        (
            Cache::with_clock(
                Options::validate(raw).unwrap(),
                clock.clone(),
                SmallRng::seed_from_u64(3),
            ),
            clock,
        )
    }

    fn fill(c: &mut Cache<ManualClock>, key: &str) {
        let p = c.options().defaults;
        let Step::Lead(id) = c.lookup(key, 1.0, false).unwrap() else {
            panic!()
        };
        c.complete(key, id, Loaded::new(1.0, p)).unwrap();
    }

    #[test]
    fn invalidations_from_elsewhere_drop_entries_before_the_next_read() {
        let (mut c, _) = cache();
        fill(&mut c, "a");
        fill(&mut c, "b");
        c.inbox().invalidate("a");
        assert_eq!(c.peek("a", 1.0), None);
        assert!(c.peek("b", 1.0).is_some());
        c.inbox().invalidate_all();
        assert_eq!(c.peek("b", 1.0), None);
    }

    #[test]
    fn callers_after_a_write_elsewhere_do_not_join_a_load_that_began_before_it() {
        let (mut c, _) = cache();
        let Step::Lead(old) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        assert_eq!(c.lookup("k", 1.0, false).unwrap(), Step::Join(old));
        c.inbox().invalidate("k"); // another process set or deleted the key
        let Step::Lead(new) = c.lookup("k", 1.0, false).unwrap() else {
            panic!("a caller after the write must not join the older load")
        };
        assert_ne!(new, old);
        assert_eq!(c.lookup("k", 1.0, false).unwrap(), Step::Join(new));
        let p = c.options().defaults;
        assert_eq!(
            c.complete("k", old, Loaded::new(1.0, p)),
            None,
            "the older load writes nothing"
        );
        assert!(c.complete("k", new, Loaded::new(1.0, p)).is_some());
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn applied_invalidations_are_kept_in_order_only_while_observed() {
        let (mut c, _) = cache();
        fill(&mut c, "a");
        c.inbox().invalidate("a");
        assert_eq!(c.peek("a", 1.0), None);
        assert!(
            c.take_applied().is_empty(),
            "nothing is kept while unobserved"
        );
        c.observe_invalidations(true);
        fill(&mut c, "a");
        c.inbox().invalidate_all();
        c.inbox().invalidate("b");
        assert_eq!(c.peek("a", 1.0), None);
        assert_eq!(c.take_applied(), vec![None, Some("b".into())]);
        assert!(c.take_applied().is_empty(), "taken once");
        for i in 0..MAX_APPLIED / crate::inbox::MAX_PENDING_KEYS + 2 {
            for k in 0..crate::inbox::MAX_PENDING_KEYS {
                c.inbox().invalidate(&format!("{i}:{k}"));
            }
            c.peek("x", 1.0);
        }
        assert_eq!(c.take_applied().len(), MAX_APPLIED, "bounded");
        c.inbox().invalidate("c");
        c.observe_invalidations(false);
        c.peek("c", 1.0);
        assert!(c.take_applied().is_empty());
    }

    #[test]
    fn untrusted_stale_copies_are_not_served() {
        let (mut c, clock) = cache();
        fill(&mut c, "a");
        clock.advance(1_500.0);
        c.inbox().set_trust_stale(false);
        assert_eq!(c.peek("a", 1.0), None);
        c.inbox().set_trust_stale(true);
        assert!(matches!(c.peek("a", 1.0), Some(Hit::Stale { .. })));
    }

    #[test]
    fn adopted_envelopes_keep_their_times() {
        let (mut c, clock) = cache();
        let env = Envelope::new(clock.now_ms(), 200.0, 400.0, 7.0, false);
        let Step::Lead(id) = c.lookup("k", 1.0, false).unwrap() else {
            panic!()
        };
        let slot = c
            .adopt("k", Some(id), env, Extra::default(), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            c.peek("k", 0.0),
            Some(Hit::Fresh {
                slot,
                refresh: false
            })
        );
        let info = c.inspect("k").unwrap().unwrap();
        assert_eq!(
            (info.fresh_until, info.hard_until, info.compute_ms),
            (200.0, 400.0, 7.0)
        );
        assert_eq!(c.flights_in_progress(), 0);
        let expired = Envelope::new(clock.now_ms() - 1_000.0, 10.0, 20.0, 0.0, false);
        assert_eq!(c.adopt("x", None, expired, Extra::default(), None), None);
    }

    #[test]
    fn a_read_older_than_an_invalidation_is_not_kept() {
        let (mut c, clock) = cache();
        let stamp = c.inbox().stamp("k");
        c.inbox().invalidate("k"); // a write elsewhere, announced while our read was on its way
        let env = Envelope::new(clock.now_ms(), 200.0, 400.0, 1.0, false);
        assert_eq!(c.adopt("k", None, env, Extra::default(), Some(stamp)), None);
        assert_eq!(c.peek("k", 0.0), None);
        let fresh_stamp = c.inbox().stamp("k");
        assert!(c
            .adopt("k", None, env, Extra::default(), Some(fresh_stamp))
            .is_some());
    }

    #[test]
    fn a_written_back_load_is_kept_only_if_nothing_newer_is_known() {
        let (mut c, _) = cache();
        let p = c.options().defaults;
        let lead = |c: &mut Cache<ManualClock>, key: &str| {
            let Step::Lead(id) = c.lookup(key, 1.0, false).unwrap() else {
                panic!()
            };
            id
        };
        // Kept: Redis took it and nothing was heard since the stamp.
        let id = lead(&mut c, "a");
        let stamp = c.inbox().stamp("a");
        let env = c.prepare("a", id, Loaded::new(1.0, p), None).unwrap();
        assert_eq!(
            c.flights_in_progress(),
            1,
            "callers keep joining while it is written"
        );
        assert!(c.finish_write("a", id, env, true, Some(stamp)).is_some());
        assert_eq!(c.flights_in_progress(), 0);
        // Dropped by Redis (a newer write there): kept nowhere.
        let id = lead(&mut c, "b");
        let env = c.prepare("b", id, Loaded::new(1.0, p), None).unwrap();
        assert_eq!(c.finish_write("b", id, env, false, None), None);
        assert_eq!(c.peek("b", 0.0), None);
        // Another process announced the key while the load ran.
        let id = lead(&mut c, "c");
        let stamp = c.inbox().stamp("c");
        let env = c.prepare("c", id, Loaded::new(1.0, p), None).unwrap();
        c.inbox().invalidate("c");
        assert_eq!(c.finish_write("c", id, env, true, Some(stamp)), None);
        // A set here while it was written back: the flight was superseded.
        let id = lead(&mut c, "d");
        let env = c.prepare("d", id, Loaded::new(1.0, p), None).unwrap();
        let slot = c
            .set("d", false, &p, &Extra::default())
            .unwrap()
            .unwrap()
            .slot;
        assert_eq!(c.finish_write("d", id, env, true, None), None);
        assert_eq!(c.live_slot("d"), slot, "the set's entry stays");
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn a_read_sent_before_a_local_write_is_not_kept_over_it() {
        // Seed 2012 of the history test: get() read v6 from Redis, set(v7) ran here, then the
        // read's answer arrived and was kept over v7.
        let (mut c, clock) = cache();
        let p = c.options().defaults;
        for write in ["set", "delete"] {
            let stamp = c.inbox().stamp("k");
            if write == "set" {
                c.set("k", false, &p, &Extra::default()).unwrap();
            } else {
                c.delete("k").unwrap();
            }
            let older = Envelope::new(clock.now_ms(), 200.0, 400.0, 1.0, false);
            assert_eq!(
                c.adopt("k", None, older, Extra::default(), Some(stamp)),
                None,
                "{write}"
            );
        }
    }

    #[test]
    fn abandoned_refresh_holds_local_retries() {
        let (mut c, clock) = cache();
        fill(&mut c, "k");
        clock.advance(1_100.0);
        assert!(c.peek("k", 1.0).unwrap().wants_refresh());
        let id = c.begin_refresh("k", None).unwrap();
        c.abandon("k", id, 500.0);
        assert!(!c.peek("k", 1.0).unwrap().wants_refresh());
        clock.advance(500.0);
        assert!(c.peek("k", 1.0).unwrap().wants_refresh());
    }
}

#[cfg(test)]
mod tag_tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::policy::{RawOptions, TtlOverrides};

    /// A result of `compute_ms` carrying `extra` (tags, size).
    fn with_extra(compute_ms: f64, p: EntryPolicy, extra: Extra) -> Loaded {
        Loaded {
            extra,
            ..Loaded::new(compute_ms, p)
        }
    }

    fn cache(f: impl FnOnce(&mut RawOptions)) -> Cache<ManualClock> {
        let mut raw = RawOptions::default();
        raw.ttls.jitter = Some(0.0);
        f(&mut raw);
        Cache::with_clock(
            Options::validate(raw).unwrap(),
            ManualClock::new(0.0),
            SmallRng::seed_from_u64(5),
        )
    }

    fn tags(names: &[&str]) -> Extra {
        Extra {
            tags: names.iter().map(|t| t.to_string()).collect(),
            size: 10,
        }
    }

    fn lead(c: &mut Cache<ManualClock>, key: &str) -> FlightId {
        let Step::Lead(id) = c.lookup(key, 1.0, false).unwrap() else {
            panic!("expected to lead")
        };
        id
    }

    fn load(c: &mut Cache<ManualClock>, key: &str, extra: Extra) -> Option<Slot> {
        let p = c.options().defaults;
        let id = lead(c, key);
        c.complete(key, id, with_extra(1.0, p, extra))?.slot
    }

    #[test]
    fn tagged_entries_live_at_most_tag_ttl_from_their_loads_start() {
        let mut c = cache(|r| {
            r.ttls.ttl = Some(60_000.0);
            r.ttls.hard_ttl = Some(600_000.0);
            r.tag_ttl = Some(100_000.0);
        });
        let p = c.options().defaults;
        // A load of 30 s began 30 s ago: 70 s left of its tag's bound.
        let id = lead(&mut c, "slow");
        c.complete("slow", id, with_extra(30_000.0, p, tags(&["t"])));
        let info = c.inspect("slow").unwrap().unwrap();
        assert_eq!(info.hard_until - c.now(), 70_000.0);
        assert_eq!(
            info.fresh_until - c.now(),
            60_000.0,
            "ttl within reach stays"
        );
        // A set is born now: the full tagTtl, and its ttl never past its hardTtl.
        let short = TtlOverrides {
            ttl: Some(200_000.0),
            ..Default::default()
        };
        let p2 = c.options().resolve(&short).unwrap();
        c.set("set", false, &p2, &tags(&["t"])).unwrap();
        let info = c.inspect("set").unwrap().unwrap();
        assert_eq!(info.hard_until - c.now(), 100_000.0);
        assert_eq!(info.fresh_until - c.now(), 100_000.0);
        // Untagged entries keep their hardTtl.
        let id = lead(&mut c, "plain");
        c.complete("plain", id, Loaded::new(30_000.0, p));
        let info = c.inspect("plain").unwrap().unwrap();
        assert_eq!(info.hard_until - c.now(), 600_000.0);
    }

    #[test]
    fn a_tagged_load_longer_than_tag_ttl_caches_nothing() {
        let mut c = cache(|r| r.tag_ttl = Some(1_000.0));
        let p = c.options().defaults;
        load(&mut c, "k", tags(&["t"])).unwrap();
        let Step::Lead(id) = c.lookup("k", 1.0, true).unwrap() else {
            panic!("a forced refresh leads")
        };
        let written = c.complete("k", id, with_extra(1_000.0, p, tags(&["t"])));
        assert!(written.is_none_or(|w| w.slot.is_none()));
        assert_eq!(c.peek("k", 1.0), None, "the older copy does not outlive it");
    }

    #[test]
    fn delete_tags_drops_the_entries_carrying_them_and_nothing_else() {
        let mut c = cache(|_| {});
        load(&mut c, "a", tags(&["t1"])).unwrap();
        load(&mut c, "b", tags(&["t2", "t1"])).unwrap();
        load(&mut c, "c", tags(&["t2"])).unwrap();
        load(&mut c, "u", Extra::default()).unwrap();
        c.delete_tags(&["t1".to_string()], true).unwrap();
        assert_eq!(c.peek("a", 1.0), None);
        assert_eq!(c.peek("b", 1.0), None);
        assert!(c.peek("c", 1.0).is_some(), "another tag");
        assert!(c.peek("u", 1.0).is_some(), "untagged");
        // Loaded again after the deleteByTag: alive.
        load(&mut c, "a", tags(&["t1"])).unwrap();
        assert!(c.peek("a", 1.0).is_some());
    }

    #[test]
    fn a_load_that_began_before_delete_tags_or_clear_is_not_kept() {
        let mut c = cache(|_| {});
        let p = c.options().defaults;
        let id = lead(&mut c, "k");
        c.delete_tags(&["t".to_string()], true).unwrap();
        // The loader adds the tag (ctx.setTags) only as it returns.
        let w = c.complete("k", id, with_extra(1.0, p, tags(&["t"])));
        assert_eq!(w.and_then(|w| w.slot), None, "born before the deleteByTag");
        assert_eq!(c.peek("k", 1.0), None);
        // An untagged result of a load that began before is kept: the tag was not its.
        let id = lead(&mut c, "u");
        c.delete_tags(&["t".to_string()], true).unwrap();
        assert!(c
            .complete("u", id, Loaded::new(1.0, p))
            .unwrap()
            .slot
            .is_some());
        // clear supersedes every running load.
        let id = lead(&mut c, "x");
        c.clear(true).unwrap();
        assert_eq!(c.complete("x", id, Loaded::new(1.0, p)), None);
        assert_eq!((c.entries(), c.flights_in_progress()), (0, 0));
    }

    #[test]
    fn expire_keeps_the_value_stale_until_its_hard_ttl_and_one_refresh_makes_it_fresh() {
        let mut c = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.hard_ttl = Some(100_000.0);
        });
        let p = c.options().defaults;
        let slot = load(&mut c, "k", Extra::default()).unwrap();
        assert!(matches!(c.peek("k", 0.0), Some(Hit::Fresh { .. })));
        let epoch = c.inbox().fresh().epoch();
        let now = c.now();
        assert!(c.expire("k", now).unwrap(), "there was an entry");
        assert_ne!(c.inbox().fresh().epoch(), epoch, "the fresh index is void");
        let info = c.inspect("k").unwrap().unwrap();
        assert_eq!((info.state, info.fresh_until), (EntryState::Stale, now));
        assert_eq!(info.hard_until, 100_000.0, "hardTtl as before");
        // Served stale, the same value, with one refresh asked for; a second read asks none
        // while it runs.
        let Some(Hit::Stale {
            slot: s,
            refresh: true,
        }) = c.peek("k", 0.0)
        else {
            panic!("stale with a refresh")
        };
        assert_eq!(s, slot);
        let id = c.begin_refresh("k", None).unwrap();
        assert!(matches!(
            c.peek("k", 0.0),
            Some(Hit::Stale { refresh: false, .. })
        ));
        c.complete("k", id, Loaded::new(1.0, p)).unwrap();
        assert!(matches!(c.peek("k", 0.0), Some(Hit::Fresh { .. })));
        // Nothing there, or only a dead entry: false, and nothing happens.
        assert!(!c.expire("none", c.now()).unwrap());
        c.clock.advance(100_000.0);
        assert!(!c.expire("k", c.now()).unwrap(), "past its hardTtl");
    }

    #[test]
    fn a_load_that_began_before_expire_is_not_the_refresh_after_it() {
        let mut c = cache(|r| r.ttls.ttl = Some(10_000.0));
        let p = c.options().defaults;
        load(&mut c, "k", Extra::default()).unwrap();
        c.clock.advance(20_000.0);
        let id = c.begin_refresh("k", None).unwrap();
        c.clock.advance(1.0);
        assert!(c.expire("k", c.now()).unwrap());
        // Its result (maybe what the expire was about) is not written...
        assert_eq!(c.complete("k", id, Loaded::new(1.0, p)), None);
        // ...and the next read starts the refresh after the expire.
        assert!(matches!(
            c.peek("k", 0.0),
            Some(Hit::Stale { refresh: true, .. })
        ));
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn an_expired_not_found_is_loaded_again() {
        let mut c = cache(|r| r.ttls.negative_ttl = Some(5_000.0));
        let p = c.options().defaults;
        let id = lead(&mut c, "n");
        c.complete(
            "n",
            id,
            Loaded {
                negative: true,
                ..Loaded::new(1.0, p)
            },
        );
        assert!(matches!(c.peek("n", 0.0), Some(Hit::Negative { .. })));
        assert!(c.expire("n", c.now()).unwrap());
        assert_eq!(c.peek("n", 0.0), None);
        assert!(matches!(c.lookup("n", 0.0, false).unwrap(), Step::Lead(_)));
    }

    #[test]
    fn expire_tags_makes_the_entries_carrying_them_stale_and_their_refresh_fresh() {
        let mut c = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.hard_ttl = Some(100_000.0);
        });
        let p = c.options().defaults;
        load(&mut c, "a", tags(&["t1"])).unwrap();
        load(&mut c, "b", tags(&["t2", "t1"])).unwrap();
        load(&mut c, "c", tags(&["t2"])).unwrap();
        load(&mut c, "u", Extra::default()).unwrap();
        let epoch = c.inbox().fresh().epoch();
        // A load of "l" began before the expiry; it carries the tag only as it returns.
        let late = lead(&mut c, "l");
        c.expire_tags(&["t1".to_string()], true, f64::INFINITY)
            .unwrap();
        assert_ne!(c.inbox().fresh().epoch(), epoch, "the fresh index is void");
        assert_eq!(c.inspect("a").unwrap().unwrap().state, EntryState::Stale);
        for key in ["a", "b"] {
            assert!(
                matches!(c.peek(key, 0.0), Some(Hit::Stale { refresh: true, .. })),
                "{key}: served stale, refresh asked"
            );
        }
        assert!(
            matches!(c.peek("c", 0.0), Some(Hit::Fresh { .. })),
            "another tag"
        );
        assert!(
            matches!(c.peek("u", 0.0), Some(Hit::Fresh { .. })),
            "untagged"
        );
        // The load begun before is written, but stale: it may predate what changed.
        c.complete("l", late, with_extra(1.0, p, tags(&["t1"])))
            .unwrap();
        assert!(matches!(c.peek("l", 0.0), Some(Hit::Stale { .. })));
        // A refresh begun after the expiry is born after it: fresh.
        let id = c.begin_refresh("a", None).unwrap();
        c.complete("a", id, with_extra(1.0, p, tags(&["t1"])));
        assert!(matches!(c.peek("a", 0.0), Some(Hit::Fresh { .. })));
        assert_eq!(c.inspect("a").unwrap().unwrap().state, EntryState::Fresh);
        // Stale until its hardTtl, then gone.
        c.clock.advance(100_000.0);
        assert_eq!(c.peek("b", 0.0), None);
    }

    #[test]
    fn expire_tags_with_a_window_ends_what_was_not_refreshed_when_it_is_over() {
        let mut c = cache(|r| {
            r.ttls.ttl = Some(10_000.0);
            r.ttls.hard_ttl = Some(1_000_000.0);
        });
        let p = c.options().defaults;
        load(&mut c, "read", tags(&["t"])).unwrap();
        load(&mut c, "unread", tags(&["t"])).unwrap();
        load(&mut c, "other", tags(&["u"])).unwrap();
        let until = c.now() + 5_000.0;
        c.expire_tags(&["t".to_string()], true, until).unwrap();
        // Within the window: stale; "read" is refreshed (born after the mark: untouched by it).
        assert!(matches!(
            c.peek("read", 0.0),
            Some(Hit::Stale { refresh: true, .. })
        ));
        let id = c.begin_refresh("read", None).unwrap();
        c.complete("read", id, with_extra(1.0, p, tags(&["t"])));
        c.clock.advance(5_000.0);
        assert_eq!(c.peek("unread", 0.0), None, "the window is over: gone");
        assert_eq!(c.inspect("unread").unwrap(), None);
        assert!(
            matches!(c.peek("read", 0.0), Some(Hit::Fresh { .. })),
            "refreshed in it"
        );
        assert!(matches!(c.peek("other", 0.0), Some(Hit::Fresh { .. })));
        // A later mark once the window is over keeps what the first one ended dead, and gives
        // entries born since their own window.
        load(&mut c, "unread", tags(&["t"])).unwrap();
        let before_second = c.inbox().tag_clock(tag_bucket("t"));
        c.expire_tags(&["t".to_string()], true, f64::INFINITY)
            .unwrap();
        assert!(
            c.inbox().tag_clock(tag_bucket("t")) > before_second,
            "folded into a death"
        );
        assert!(matches!(c.peek("unread", 0.0), Some(Hit::Stale { .. })));
        c.clock.advance(100_000.0);
        assert!(
            matches!(c.peek("unread", 0.0), Some(Hit::Stale { .. })),
            "no window: stale until its own expiry"
        );
    }

    #[test]
    fn a_stale_mark_redis_did_not_take_is_put_back() {
        let mut c = cache(|_| {});
        load(&mut c, "k", tags(&["t"])).unwrap();
        let t = c
            .expire_tags(&["t".to_string()], false, f64::INFINITY)
            .unwrap();
        assert!(t.stale);
        let b = tag_bucket("t");
        assert_eq!(c.inbox().tag_stale_clock(b), t.clock);
        c.revert_tags(&t);
        assert_eq!(c.inbox().tag_stale_clock(b), 0);
        assert_eq!(c.inbox().tag_clock(b), 0, "the dead marks untouched");
        assert_eq!(
            c.inspect("k").unwrap().unwrap().state,
            EntryState::Stale,
            "its effect here is kept"
        );
        load(&mut c, "k2", tags(&["t"])).unwrap();
        assert_eq!(c.inspect("k2").unwrap().unwrap().state, EntryState::Fresh);
    }

    #[test]
    fn a_refresh_given_no_tags_keeps_the_entry_s_tags() {
        let mut c = cache(|r| r.ttls.ttl = Some(10.0));
        let p = c.options().defaults;
        load(&mut c, "k", tags(&["t"])).unwrap();
        let id = c.begin_refresh("k", None).unwrap();
        c.complete(
            "k",
            id,
            Loaded {
                inherit: true,
                ..Loaded::new(1.0, p)
            },
        )
        .unwrap();
        c.delete_tags(&["t".to_string()], true).unwrap();
        assert_eq!(
            c.peek("k", 1.0),
            None,
            "the refreshed entry still carries t"
        );
        // A cold load given none has none.
        load(&mut c, "k", Extra::default()).unwrap();
        c.delete_tags(&["t".to_string()], true).unwrap();
        assert!(c.peek("k", 1.0).is_some());
    }

    #[test]
    fn adopted_entries_born_before_a_known_invalidation_are_not_kept() {
        let mut c = cache(|_| {});
        let env = Envelope::new(0.0, 1_000.0, 2_000.0, 1.0, false).born_at(3);
        c.inbox().invalidate_tag(tag_bucket("t"), 5);
        assert_eq!(c.adopt("k", None, env, tags(&["t"]), None), None);
        assert!(c
            .adopt("k", None, env.born_at(5), tags(&["t"]), None)
            .is_some());
        c.inbox().clear_at(9);
        assert_eq!(
            c.adopt("j", None, env.born_at(8), Extra::default(), None),
            None
        );
    }

    #[test]
    fn callers_answered_by_redis_count_as_l2_hits_not_misses() {
        let mut c = cache(|_| {});
        let p = c.options().defaults;
        let id = lead(&mut c, "a");
        for _ in 0..4 {
            c.lookup("a", 1.0, false).unwrap();
        }
        let env = Envelope::new(0.0, 1_000.0, 2_000.0, 1.0, false);
        assert_eq!(c.stats.snapshot().misses, 5, "misses while they wait");
        c.adopt("a", Some(id), env, Extra::default(), None).unwrap();
        let s = c.stats.snapshot();
        assert_eq!((s.l2_hits, s.misses, s.coalesced), (5, 0, 4));
        let id = lead(&mut c, "b");
        c.lookup("b", 1.0, false).unwrap();
        c.complete("b", id, Loaded::new(1.0, p));
        let id = lead(&mut c, "s");
        c.skip("s", id);
        let s = c.stats.snapshot();
        assert_eq!((s.l2_hits, s.misses), (5, 3));
        assert_eq!(c.peek("s", 1.0), None, "skipCache: nothing cached");
        assert_eq!(c.flights_in_progress(), 0);
    }

    #[test]
    fn a_delete_tags_redis_did_not_take_keeps_its_effect_here_and_no_more() {
        let mut c = cache(|_| {});
        // Marks one past the clock, as with Redis (not owning the clock).
        c.inbox().observe_clock(10);
        load(&mut c, "a", tags(&["t"])).unwrap();
        load(&mut c, "b", tags(&["u"])).unwrap();
        let tentative = c.delete_tags(&["t".to_string()], false).unwrap();
        assert_eq!(tentative.clock, 11);
        c.revert_tags(&tentative);
        assert_eq!(
            c.peek("a", 1.0),
            None,
            "removed, not resurrected by the revert"
        );
        assert!(c.peek("b", 1.0).is_some());
        // Loads born at the clock known here (10) live again.
        load(&mut c, "a", tags(&["t"])).unwrap();
        assert!(c.peek("a", 1.0).is_some());
    }

    #[test]
    fn the_byte_budget_bounds_the_tier_and_reports_its_usage() {
        let mut c = cache(|r| {
            r.l1 = Some(Some(100.0));
            r.l1_max_bytes = Some(25_000.0);
        });
        let sized = |size| Extra {
            tags: Vec::new(),
            size,
        };
        for k in ["a", "b", "c"] {
            load(&mut c, k, sized(10_000)).unwrap();
        }
        assert_eq!(c.l1_usage(), (2, 20_000));
        assert_eq!(c.take_released().len(), 1);
        assert_eq!(load(&mut c, "big", sized(25_001)), None, "served, not kept");
        assert_eq!(c.l1_usage(), (2, 20_000));
    }
}
