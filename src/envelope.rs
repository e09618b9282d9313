//! The envelope around a cached value: when it stops being fresh (soft TTL), when it is gone
//! (hard TTL), how long it took to compute (for XFetch), whether it is a not-found marker, and
//! until when a failed refresh holds further refreshes back (errorBackoff).
//!
//! The same fields travel as JSON in Redis; `decode` treats anything it did not write as a miss.

use serde::Deserialize;
use serde_json::value::RawValue;

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
        }
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

    /// Milliseconds the entry has left to live at `now`, rounded up, at least 1 (a Redis PX).
    pub fn remaining_ms(&self, now: f64) -> u64 {
        (self.hard_until - now).ceil().max(1.0) as u64
    }

    /// The JSON written to Redis. `value_json` is the value already serialized by the caller
    /// (`None`: the loader returned `undefined`), embedded as is, so it is never re-serialized.
    /// `generation` (alphanumeric) names this write; it comes first, where the Lua scripts read
    /// it without parsing the JSON (a load began from another generation is not written back).
    pub fn encode(&self, value_json: Option<&str>, generation: &str) -> String {
        debug_assert!(generation.bytes().all(|b| b.is_ascii_alphanumeric()));
        let value = value_json.unwrap_or("null");
        let mut out = String::with_capacity(value.len() + 128);
        out.push_str("{\"sc\":1,\"gen\":\"");
        out.push_str(generation);
        out.push_str("\",\"freshUntil\":");
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
        if value_json.is_none() {
            out.push_str(",\"undefined\":true");
        }
        // The value goes last, as given: never re-serialized.
        out.push_str(",\"value\":");
        out.push_str(value);
        out.push('}');
        out
    }

    /// Reads what [`Envelope::encode`] wrote. Anything else (other JSON, another format version,
    /// nonsense numbers) is `None`: a miss, never an error.
    pub fn decode(text: &str) -> Option<Decoded<'_>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            sc: u32,
            #[serde(default, borrow)]
            gen: &'a str,
            fresh_until: f64,
            hard_until: f64,
            compute_ms: f64,
            #[serde(default)]
            retry_after: f64,
            #[serde(default)]
            negative: bool,
            #[serde(default)]
            undefined: bool,
            #[serde(borrow)]
            value: &'a RawValue,
        }
        let wire: Wire<'_> = serde_json::from_str(text).ok()?;
        let sane = wire.sc == 1
            && wire.fresh_until.is_finite()
            && wire.hard_until.is_finite()
            && wire.compute_ms.is_finite()
            && wire.retry_after.is_finite()
            && wire.hard_until >= wire.fresh_until
            && wire.compute_ms >= 0.0;
        if !sane {
            return None;
        }
        Some(Decoded {
            generation: wire.gen,
            envelope: Envelope {
                fresh_until: wire.fresh_until,
                hard_until: wire.hard_until,
                compute_ms: wire.compute_ms,
                negative: wire.negative,
                retry_after: wire.retry_after,
            },
            value_json: if wire.undefined {
                None
            } else {
                Some(wire.value.get())
            },
        })
    }
}

/// An envelope read back from its JSON, the value still as JSON text borrowed from the input.
#[derive(Debug, PartialEq)]
pub struct Decoded<'a> {
    pub envelope: Envelope,
    /// The write that made it ('' for none).
    pub generation: &'a str,
    /// `None` when the cached value is `undefined`.
    pub value_json: Option<&'a str>,
}

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
    use super::*;

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
        let text = e.encode(Some(value), "g1");
        assert!(text.starts_with(r#"{"sc":1,"gen":"g1","#), "{text}");
        let back = Envelope::decode(&text).unwrap();
        assert_eq!(back.envelope, e);
        assert_eq!(back.value_json, Some(value));
        assert_eq!(back.generation, "g1");
    }

    #[test]
    fn negative_null_and_undefined_are_distinct() {
        let e = Envelope::new(0.0, 5.0, 5.0, 1.0, true);
        let null_text = e.encode(Some("null"), "g");
        let null = Envelope::decode(&null_text).unwrap();
        assert!(null.envelope.negative);
        assert_eq!(null.value_json, Some("null"));
        let undef_text = e.encode(None, "g");
        let undef = Envelope::decode(&undef_text).unwrap();
        assert_eq!(undef.value_json, None);
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
            assert!(Envelope::decode(text).is_none(), "{text}");
        }
    }

    #[test]
    fn remaining_ms_is_a_positive_px() {
        let e = Envelope::new(0.0, 10.0, 20.5, 0.0, false);
        assert_eq!(e.remaining_ms(0.0), 21);
        assert_eq!(e.remaining_ms(100.0), 1);
    }
}
