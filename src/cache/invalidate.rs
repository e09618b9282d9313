//! Invalidation in the in-process tier: `deleteByTag`, `expireByTag` and `clear` applied here at
//! once (tag clocks marked, put back if Redis cannot take them), and `expire` of one key. Part of
//! [`Cache`]: these are its methods, kept apart from the read and flight decisions in `cache.rs`.

use super::*;

impl<C: Clock> Cache<C> {
    /// `deleteByTag` here, at once: every entry carrying one of `tags` (and every load that
    /// began before and will carry one) is dead. `owns_clock` (no Redis): the clock advances
    /// here. With Redis, the tags are marked one past the clock known here until Redis gives
    /// the deleteByTag's own clock; the [`Tentative`] says what to put back if Redis cannot
    /// take it.
    pub fn delete_tags(&mut self, tags: &[String], owns_clock: bool) -> Result<Tentative> {
        self.mark_tags(tags, owns_clock, None)
    }

    /// `expireByTag` here, at once: every entry carrying one of `tags` and born before now is
    /// stale (served while one refresh runs; the refresh is born after, so fresh). A load that
    /// began before writes its result stale too: it may carry what the expiry was about, so it
    /// does not count as the refresh after it. `until` (epoch ms; infinity: none) ends the
    /// window in which they are served stale: past it, those not refreshed are dead (Next.js's
    /// `revalidateTag(tag, { expire })`). Marked as [`Cache::delete_tags`] marks.
    pub fn expire_tags(
        &mut self,
        tags: &[String],
        owns_clock: bool,
        until: f64,
    ) -> Result<Tentative> {
        self.mark_tags(tags, owns_clock, Some(until))
    }

    /// `stale_until`: an expireByTag's window end; `None`: a deleteByTag.
    fn mark_tags(
        &mut self,
        tags: &[String],
        owns_clock: bool,
        stale_until: Option<f64>,
    ) -> Result<Tentative> {
        self.ensure_open()?;
        self.apply_inbox();
        let clock = if owns_clock {
            self.inbox.tick()
        } else {
            self.inbox.clock() + 1
        };
        let now = self.clock.now_ms();
        let mut before = Vec::with_capacity(tags.len());
        let mut untils = Vec::new();
        for b in buckets(tags) {
            if let Some(until) = stale_until {
                before.push((b, self.inbox.tag_stale_clock(b)));
                untils.push(self.inbox.tag_stale_until(b).to_bits());
                self.inbox.stale_tag(b, clock, until, now);
            } else {
                before.push((b, self.inbox.tag_clock(b)));
                self.inbox.invalidate_tag(b, clock);
            }
        }
        Ok(Tentative {
            clock,
            tags: before,
            stale: stale_until.is_some(),
            untils,
            cleared: None,
        })
    }

    /// `expire(key)` here: the entry keeps its value and its hardTtl but is stale from `now`
    /// (epoch ms, whole: the same instant is written to Redis, so a refresh's basis here and
    /// Redis's copy agree). A not-found is stale too, and then loaded again. Its running load,
    /// if any, is superseded as by `delete`: begun before the expire, it may carry what the
    /// expire was about, so it is not the refresh after it. Returns whether a live entry was
    /// there.
    pub fn expire(&mut self, key: &str, now: f64) -> Result<bool> {
        self.ensure_open()?;
        self.apply_inbox();
        self.flights.supersede(key);
        self.inbox.touch(key);
        let inbox = &self.inbox;
        let Some(e) = self.store.get(key) else {
            return Ok(false);
        };
        let dead = e
            .tags
            .as_ref()
            .is_some_and(|t| inbox.gone(e.envelope.born, &t.buckets, now));
        if dead || e.envelope.state(now) == State::Expired {
            return Ok(false);
        }
        e.envelope.fresh_until = e.envelope.fresh_until.min(now);
        // The embedder's index may hold the entry as fresh: void it.
        inbox.fresh().bump();
        Ok(true)
    }

    /// A `deleteByTag` or `expireByTag` Redis did not take: its effect here is kept (the entries
    /// it killed are removed now, as `delete` would; those it made stale stay stale), and its
    /// marks are put back, so entries loaded from now
    /// on are not dead for a deletion that never happened in Redis.
    pub fn revert_tags(&mut self, tentative: &Tentative) {
        let inbox = &self.inbox;
        if tentative.stale {
            // An expireByTag: the entries it made stale here stay stale.
            let now = self.clock.now_ms().floor();
            self.store.stale_where(now, |e| {
                e.tags
                    .as_ref()
                    .is_some_and(|t| inbox.expired(e.envelope.born, &t.buckets))
            });
        }
        let now = self.clock.now_ms();
        self.store.remove_where(|e| {
            e.tags
                .as_ref()
                .is_some_and(|t| inbox.gone(e.envelope.born, &t.buckets, now))
        });
        self.inbox.revert(tentative);
    }

    /// `clear` here, at once: every entry dropped, every running load superseded, and (with
    /// Redis) every Redis entry born up to now treated as dead until Redis gives the clear's
    /// own clock (see [`Cache::delete_tags`]).
    pub fn clear(&mut self, owns_clock: bool) -> Result<Tentative> {
        self.ensure_open()?;
        self.apply_inbox();
        let before = self.inbox.cleared();
        let clock = if owns_clock {
            self.inbox.tick()
        } else {
            self.inbox.clock() + 1
        };
        self.inbox.clear_at(clock);
        self.flights.clear();
        self.store.clear();
        // A Redis read already on its way predates the clear: not to be kept.
        self.inbox.touch_all();
        Ok(Tentative {
            clock,
            tags: Vec::new(),
            stale: false,
            untils: Vec::new(),
            cleared: Some(before),
        })
    }
}
