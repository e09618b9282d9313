//! Request coalescing: at most one load in flight per key in this process.
//!
//! The registry decides who leads and who joins, and remembers which flight is current for each
//! key. The shared result itself lives with the embedder (in Node, the leader's JS promise, which
//! every joiner awaits), so a leader's failure or abort reaches every waiter as the same error.
//! A flight that was superseded (by `set`, `delete` or `close`) may finish, but `finish` tells its
//! leader not to write its now-outdated result.

use std::collections::HashMap;

/// Identifies one flight; never reused within a registry.
pub type FlightId = u64;

/// Why a flight runs: a caller is waiting (cold miss, forceRefresh) or a refresh in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlightKind {
    Load,
    Refresh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flight {
    pub id: FlightId,
    pub kind: FlightKind,
    /// What the embedder knew of the key when the flight began (the cache: its invalidation
    /// stamp); a caller that knows something newer does not join.
    pub tag: u64,
    /// Callers that joined instead of leading.
    pub joined: u64,
    /// The namespace clock when it began (see `inbox.rs`): its result is born at it.
    pub born: u64,
}

impl Flight {
    /// Callers waiting for it: the leader of a load, and every joiner (a background refresh is
    /// led by no caller).
    pub fn callers(&self) -> u64 {
        self.joined + u64::from(self.kind == FlightKind::Load)
    }
}

/// What a caller does about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Run the load and report its end with [`Singleflight::finish`].
    Lead(FlightId),
    /// Await the result of the flight already running.
    Join(FlightId),
}

#[derive(Debug, Default)]
pub struct Singleflight {
    /// The current flight of each key with one running.
    flights: HashMap<Box<str>, Flight>,
    next_id: FlightId,
}

impl Singleflight {
    /// Joins the key's flight if one runs and began with the same `tag`, else starts one of
    /// `kind`, born at `born` (the namespace clock), with the caller as leader (a flight that
    /// began with another tag is detached: it began before something the caller knows of, so its
    /// result is older).
    pub fn lead_or_join(&mut self, key: &str, kind: FlightKind, tag: u64, born: u64) -> Role {
        if let Some(f) = self.flights.get_mut(key) {
            if f.tag == tag {
                f.joined += 1;
                return Role::Join(f.id);
            }
        }
        Role::Lead(self.start(key, kind, tag, born))
    }

    /// Starts a flight unless one runs; `None` when one does (its leader will refresh the key).
    pub fn lead(&mut self, key: &str, kind: FlightKind, tag: u64, born: u64) -> Option<FlightId> {
        if self.flights.contains_key(key) {
            return None;
        }
        Some(self.start(key, kind, tag, born))
    }

    fn start(&mut self, key: &str, kind: FlightKind, tag: u64, born: u64) -> FlightId {
        self.next_id += 1;
        let id = self.next_id;
        self.flights.insert(
            key.into(),
            Flight {
                id,
                kind,
                tag,
                joined: 0,
                born,
            },
        );
        id
    }

    pub fn current(&self, key: &str) -> Option<&Flight> {
        self.flights.get(key)
    }

    /// Ends flight `id` of `key`. True when it was still the key's current flight, i.e. its
    /// result is the newest thing known about the key and may be written.
    pub fn finish(&mut self, key: &str, id: FlightId) -> bool {
        self.take(key, id).is_some()
    }

    /// Ends flight `id` of `key` like `finish`, returning it if it was still current.
    pub fn take(&mut self, key: &str, id: FlightId) -> Option<Flight> {
        match self.flights.get(key) {
            Some(f) if f.id == id => self.flights.remove(key),
            _ => None,
        }
    }

    /// Detaches the key's flight: it runs on for its callers, but its result will not be written.
    pub fn supersede(&mut self, key: &str) {
        self.flights.remove(key);
    }

    /// Detaches every flight (as `supersede`).
    pub fn clear(&mut self) {
        self.flights.clear();
    }

    pub fn len(&self) -> usize {
        self.flights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flights.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_leads_the_rest_join() {
        let mut sf = Singleflight::default();
        let Role::Lead(id) = sf.lead_or_join("k", FlightKind::Load, 0, 0) else {
            panic!()
        };
        for _ in 0..499 {
            assert_eq!(sf.lead_or_join("k", FlightKind::Load, 0, 0), Role::Join(id));
        }
        assert_eq!(sf.current("k").unwrap().joined, 499);
        assert!(sf.finish("k", id));
        assert!(sf.is_empty());
    }

    #[test]
    fn keys_fly_independently() {
        let mut sf = Singleflight::default();
        let a = sf.lead_or_join("a", FlightKind::Load, 0, 0);
        let b = sf.lead_or_join("b", FlightKind::Load, 0, 0);
        assert!(matches!((a, b), (Role::Lead(x), Role::Lead(y)) if x != y));
        assert_eq!(sf.len(), 2);
    }

    #[test]
    fn superseded_flight_may_not_write() {
        let mut sf = Singleflight::default();
        let Role::Lead(old) = sf.lead_or_join("k", FlightKind::Refresh, 0, 0) else {
            panic!()
        };
        sf.supersede("k");
        let Role::Lead(new) = sf.lead_or_join("k", FlightKind::Load, 0, 0) else {
            panic!()
        };
        assert_ne!(old, new);
        assert!(
            !sf.finish("k", old),
            "the old flight must not write over the new one"
        );
        assert!(sf.finish("k", new));
        assert!(sf.is_empty());
    }

    #[test]
    fn a_caller_that_knows_something_newer_does_not_join() {
        let mut sf = Singleflight::default();
        let Role::Lead(old) = sf.lead_or_join("k", FlightKind::Load, 1, 0) else {
            panic!()
        };
        assert_eq!(
            sf.lead_or_join("k", FlightKind::Load, 1, 0),
            Role::Join(old)
        );
        let Role::Lead(new) = sf.lead_or_join("k", FlightKind::Load, 2, 0) else {
            panic!("a newer tag must lead")
        };
        assert!(!sf.finish("k", old), "the older flight was detached");
        assert!(sf.finish("k", new));
    }

    #[test]
    fn lead_refuses_while_a_flight_runs() {
        let mut sf = Singleflight::default();
        let id = sf.lead("k", FlightKind::Refresh, 0, 0).unwrap();
        assert_eq!(sf.lead("k", FlightKind::Refresh, 0, 0), None);
        assert_eq!(sf.lead_or_join("k", FlightKind::Load, 0, 0), Role::Join(id));
        assert!(sf.finish("k", id));
        assert!(sf.lead("k", FlightKind::Refresh, 0, 0).is_some());
    }
}
