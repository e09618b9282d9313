//! Failures waiting for the embedder's `onError`, rate-limited per operation kind, and where an
//! outage began and ended (the embedder warns of those once each when nobody handles errors).
//! Shared with the embedder, which keeps draining it after the tier is gone.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockOrRecover;

/// At most one `onError` report per operation kind per this interval.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Failures waiting at most (the rate-limited ones); and with the each-reported ones
/// (`push_each`), at most `EACH_BOUND`.
const BOUND: usize = 64;
const EACH_BOUND: usize = 10_000;

/// Where a report stands in an outage (Redis taken for down, then answering again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Any failure but an outage's first.
    None,
    /// The failure that took Redis down (the first since it last answered).
    Began,
    /// Redis answers again after an outage that began (not a failure: never for `onError`).
    Ended,
}

/// A background failure for `onError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub op: &'static str,
    pub key: Option<String>,
    pub message: String,
    pub outage: Outage,
}

/// Failures waiting for `onError`, at most one per operation kind per REPORT_INTERVAL.
#[derive(Default)]
pub struct Reports {
    /// The queue, and when each kind was last reported.
    log: Mutex<ReportLog>,
    /// The queue is not empty (read without the lock: a report pushed just after a read of it
    /// is taken at the next one).
    waiting: AtomicBool,
    /// An outage began and has not ended (read without the lock by every successful command,
    /// so an answer costs a lock only when it ends one).
    down: AtomicBool,
}

#[derive(Default)]
struct ReportLog {
    queue: VecDeque<Report>,
    last: HashMap<&'static str, Instant>,
    /// The latest failure's message, rate limit or not: why a write Redis could not take was
    /// refused (`latest`).
    latest: Option<String>,
}

impl ReportLog {
    /// Queues `report`, first dropping one if `bound` or more wait (one only: the each-reported
    /// ones may make the queue longer than a rate-limited one's bound).
    fn enqueue(&mut self, report: Report, bound: usize) {
        if self.queue.len() >= bound {
            // The oldest plain failure goes first: an outage's ends are what a warning needs.
            let plain = self.queue.iter().position(|r| r.outage == Outage::None);
            self.queue.remove(plain.unwrap_or(0));
        }
        self.queue.push_back(report);
    }
}

impl Reports {
    pub(super) fn push(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.log.lock_or_recover();
        log.latest = Some(message.clone());
        let now = Instant::now();
        if log
            .last
            .get(op)
            .is_some_and(|t| now.duration_since(*t) < REPORT_INTERVAL)
        {
            return;
        }
        log.last.insert(op, now);
        log.enqueue(
            Report {
                op,
                key: key.map(str::to_string),
                message,
                outage: Outage::None,
            },
            BOUND,
        );
        self.waiting.store(true, Ordering::Release);
    }

    /// A report that is not rate-limited (each dropped change is reported): at most
    /// `EACH_BOUND` wait, the oldest going first.
    pub(super) fn push_each(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.log.lock_or_recover();
        log.enqueue(
            Report {
                op,
                key: key.map(str::to_string),
                message,
                outage: Outage::None,
            },
            EACH_BOUND,
        );
        self.waiting.store(true, Ordering::Release);
    }

    /// A failure that takes Redis down: an outage's first is queued whatever the rate limit
    /// (and marked `Began`), the others as `push` queues them.
    pub(super) fn went_down(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.log.lock_or_recover();
        if self.down.swap(true, Ordering::AcqRel) {
            drop(log);
            return self.push(op, key, message);
        }
        log.last.insert(op, Instant::now());
        log.latest = Some(message.clone());
        log.enqueue(
            Report {
                op,
                key: key.map(str::to_string),
                message,
                outage: Outage::Began,
            },
            BOUND,
        );
        self.waiting.store(true, Ordering::Release);
    }

    /// Redis answered: the outage that began, if one did, ended (queued as `Ended`).
    pub(super) fn answered(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut log = self.log.lock_or_recover();
        if !self.down.swap(false, Ordering::AcqRel) {
            return;
        }
        log.latest = None;
        log.enqueue(
            Report {
                op: "recovered",
                key: None,
                message: "Redis answers again".to_string(),
                outage: Outage::Ended,
            },
            BOUND,
        );
        self.waiting.store(true, Ordering::Release);
    }

    /// The latest failure's message since Redis last answered after an outage, if any.
    pub fn latest(&self) -> Option<String> {
        self.log.lock_or_recover().latest.clone()
    }

    pub fn take(&self) -> Vec<Report> {
        let mut log = self.log.lock_or_recover();
        self.waiting.store(false, Ordering::Release);
        log.queue.drain(..).collect()
    }

    /// Reports wait to be taken.
    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }
}
