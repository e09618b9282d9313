//! One instance's writes of a key reach Redis in the order they were asked for. Each write would
//! otherwise be its own task on a multi-threaded runtime, and `set(k, 1); set(k, 2)` could land
//! as 2 then 1. Writes of one key run one after another; writes of different keys do not wait
//! for each other.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;

pub type Job = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

#[derive(Default)]
pub struct WriteOrder {
    /// Per key with a write running: the writes queued behind it. A key is present exactly
    /// while a drain task runs for it.
    queues: Mutex<HashMap<String, VecDeque<Job>>>,
}

impl WriteOrder {
    /// Queues `job` behind the key's earlier writes. Call it in call order (the JS thread does,
    /// synchronously, when the write is asked for).
    pub fn push(self: &Arc<Self>, runtime: &Handle, key: &str, job: Job) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get_mut(key) {
            queue.push_back(job);
            return;
        }
        queues.insert(key.to_string(), VecDeque::new());
        drop(queues);
        runtime.spawn(self.clone().drain(key.to_string(), job));
    }

    async fn drain(self: Arc<Self>, key: String, first: Job) {
        let mut job = first;
        loop {
            job.await;
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            match queues.get_mut(&key).and_then(VecDeque::pop_front) {
                Some(next) => job = next,
                None => {
                    queues.remove(&key);
                    return;
                }
            }
        }
    }

    /// Writes queued or running (for tests: none may be left behind).
    pub fn pending(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.values().map(|q| q.len() + 1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn writes_of_a_key_run_in_push_order_and_keys_run_side_by_side() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let order = Arc::new(WriteOrder::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..50u64 {
            for key in ["a", "b"] {
                let log = log.clone();
                order.push(
                    rt.handle(),
                    key,
                    Box::pin(async move {
                        // Later writes are quicker: unordered tasks would finish out of order.
                        tokio::time::sleep(Duration::from_micros(50 * (50 - i))).await;
                        log.lock().unwrap().push((key, i));
                    }),
                );
            }
        }
        rt.block_on(async {
            while order.pending() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let log = log.lock().unwrap();
        for key in ["a", "b"] {
            let seen: Vec<u64> = log.iter().filter(|(k, _)| *k == key).map(|e| e.1).collect();
            assert_eq!(seen, (0..50).collect::<Vec<_>>());
        }
        assert_eq!(order.pending(), 0);
    }
}
