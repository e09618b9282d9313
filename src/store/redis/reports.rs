//! Failures waiting for the embedder's `onError`, rate-limited per operation kind. Shared with
//! the embedder, which keeps draining it after the tier is gone.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockOrRecover;

/// At most one `onError` report per operation kind per this interval.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// Reports that are each reported (`push_each`) waiting at most.
const EACH_BOUND: usize = 10_000;

/// A background failure for `onError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub op: &'static str,
    pub key: Option<String>,
    pub message: String,
}

/// Failures waiting for `onError`, at most one per operation kind per REPORT_INTERVAL.
#[derive(Default)]
pub struct Reports {
    /// The queue, and when each kind was last reported.
    log: Mutex<ReportLog>,
    /// The queue is not empty (read without the lock: a report pushed just after a read of it
    /// is taken at the next one).
    waiting: AtomicBool,
}

#[derive(Default)]
struct ReportLog {
    queue: VecDeque<Report>,
    last: HashMap<&'static str, Instant>,
}

impl Reports {
    pub(super) fn push(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.log.lock_or_recover();
        let now = Instant::now();
        if log
            .last
            .get(op)
            .is_some_and(|t| now.duration_since(*t) < REPORT_INTERVAL)
        {
            return;
        }
        log.last.insert(op, now);
        self.enqueue(&mut log, 64, op, key, message);
    }

    /// A report that is not rate-limited (each dropped change is reported): at most
    /// `EACH_BOUND` wait, the oldest going first.
    pub(super) fn push_each(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.log.lock_or_recover();
        self.enqueue(&mut log, EACH_BOUND, op, key, message);
    }

    /// Queues a report, first dropping the oldest if `bound` or more wait (one only: the
    /// each-reported ones may make the queue longer than a rate-limited one's bound).
    fn enqueue(
        &self,
        log: &mut ReportLog,
        bound: usize,
        op: &'static str,
        key: Option<&str>,
        message: String,
    ) {
        if log.queue.len() >= bound {
            log.queue.pop_front();
        }
        log.queue.push_back(Report {
            op,
            key: key.map(str::to_string),
            message,
        });
        self.waiting.store(true, Ordering::Release);
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
