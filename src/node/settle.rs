//! Promises of Redis operations, settled in batches on the JS thread.
//!
//! napi's `Env::spawn_future` makes a threadsafe function for every call (an allocation, an env
//! cleanup hook, and a wake-up of the JS thread of its own when the future ends). A profile of
//! sequential Redis reads put a third of the process's time in the kernel behind those
//! wake-ups. Here each JS thread has one threadsafe function and one queue: a future that ends
//! pushes its settlement and wakes the JS thread only if the queue was empty, and the JS thread
//! settles everything queued in one callback, so reads in flight together cost one wake-up.
//!
//! The futures run on napi's multi-thread tokio runtime, as before. (A single I/O thread for
//! every future and connection driver was tried: 3.8 context switches per sequential read
//! instead of 4.9, but with 64 reads in flight one thread did all the Redis work while the other
//! core idled, and throughput fell from 0.98x to 0.64x of ioredis.)
//!
//! Every raw N-API call of this module is here, each with its SAFETY argument.

use std::cell::RefCell;
use std::future::Future;
use std::ptr;
use std::sync::{Arc, Mutex};

use crate::sync::LockOrRecover;
use napi::bindgen_prelude::*;
use napi::sys;

/// Makes the JS value a settled promise resolves with, on the JS thread.
type Settlement = Box<dyn FnOnce(sys::napi_env) -> napi::Result<sys::napi_value> + Send>;

/// The threadsafe function, callable from any thread (what N-API makes it for).
#[derive(Clone, Copy)]
struct Tsfn(sys::napi_threadsafe_function);
// SAFETY: N-API documents napi_call_threadsafe_function as callable from any thread; the
// pointer is only used that way off the JS thread, and only while `Shared::tsfn` holds it
// (cleared under the same lock when Node finalizes it).
unsafe impl Send for Tsfn {}

/// What futures on the runtime share with the JS thread.
struct Shared {
    inner: Mutex<Pending>,
}

struct Pending {
    /// Settlements waiting for the JS thread, by promise id.
    queue: Vec<(u32, Settlement)>,
    /// `None` once Node finalized the threadsafe function (its environment is torn down):
    /// settlements are dropped, their promises with them.
    tsfn: Option<Tsfn>,
}

impl Shared {
    fn push(&self, id: u32, settlement: Settlement) {
        let mut p = self.inner.lock_or_recover();
        let Some(tsfn) = p.tsfn else { return };
        let wake = p.queue.is_empty();
        p.queue.push((id, settlement));
        if wake {
            // Under the lock, so finalization cannot free the function meanwhile; the call only
            // queues and signals (nonblocking, unbounded queue), it never calls back into us.
            // SAFETY: `tsfn` is live while `p.tsfn` holds it (see `finalize`).
            unsafe {
                sys::napi_call_threadsafe_function(
                    tsfn.0,
                    ptr::null_mut(),
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                );
            }
        }
    }
}

/// The JS thread's side: its threadsafe function and the deferreds of its promises in flight.
struct Local {
    shared: Arc<Shared>,
    tsfn: sys::napi_threadsafe_function,
    deferreds: Vec<Option<sys::napi_deferred>>,
    free: Vec<u32>,
    /// Promises not settled yet; while any is, the threadsafe function keeps the event loop
    /// alive (as a pending `spawn_future` did), and an idle cache lets the process exit.
    in_flight: usize,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
}

fn check(status: sys::napi_status, what: &str) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::new(
            napi::Status::from(status),
            format!("{what} failed"),
        ))
    }
}

impl Local {
    fn new(env: sys::napi_env) -> napi::Result<Local> {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Pending {
                queue: Vec::new(),
                tsfn: None,
            }),
        });
        let name = "stampede-cache:redis";
        let mut js_name = ptr::null_mut();
        check(
            // SAFETY: `env` is the current JS thread's environment (we are in a napi call);
            // the string is valid UTF-8 of the length given.
            unsafe {
                sys::napi_create_string_utf8(
                    env,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    &mut js_name,
                )
            },
            "napi_create_string_utf8",
        )?;
        let mut tsfn = ptr::null_mut();
        // The finalizer gets its own reference to `shared`, released there.
        let finalize_data = Arc::into_raw(shared.clone()) as *mut std::ffi::c_void;
        // SAFETY: no JS function (call_js settles), no queue limit, one owning thread (never
        // released: Node finalizes it with the environment, which calls `finalize` with
        // `finalize_data`, a leaked Arc it takes back).
        let status = unsafe {
            sys::napi_create_threadsafe_function(
                env,
                ptr::null_mut(),
                ptr::null_mut(),
                js_name,
                0,
                1,
                finalize_data,
                Some(finalize),
                ptr::null_mut(),
                Some(call_js),
                &mut tsfn,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: not handed to Node: take the reference back.
            drop(unsafe { Arc::from_raw(finalize_data as *const Shared) });
            check(status, "napi_create_threadsafe_function")?;
        }
        // Idle until a promise is in flight.
        check(
            // SAFETY: on the JS thread that made it.
            unsafe { sys::napi_unref_threadsafe_function(env, tsfn) },
            "napi_unref_threadsafe_function",
        )?;
        shared.inner.lock_or_recover().tsfn = Some(Tsfn(tsfn));
        Ok(Local {
            shared,
            tsfn,
            deferreds: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
        })
    }

    fn insert(&mut self, env: sys::napi_env, d: sys::napi_deferred) -> u32 {
        if self.in_flight == 0 {
            // SAFETY: on the JS thread that made it, while it is live (LOCAL holds it only then).
            unsafe { sys::napi_ref_threadsafe_function(env, self.tsfn) };
        }
        self.in_flight += 1;
        match self.free.pop() {
            Some(id) => {
                self.deferreds[id as usize] = Some(d);
                id
            }
            None => {
                self.deferreds.push(Some(d));
                (self.deferreds.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, env: sys::napi_env, id: u32) -> Option<sys::napi_deferred> {
        let d = self.deferreds.get_mut(id as usize)?.take()?;
        self.free.push(id);
        self.in_flight -= 1;
        if self.in_flight == 0 {
            // SAFETY: as in `insert`.
            unsafe { sys::napi_unref_threadsafe_function(env, self.tsfn) };
        }
        Some(d)
    }
}

/// A promise made on this JS thread and not settled yet: settled exactly once, by
/// `spawn_into` (from the runtime) or `settle_here` (on the JS thread), which take it.
pub struct Promised {
    id: u32,
    shared: Arc<Shared>,
}

/// Makes a promise on this JS thread (inside a napi call or a handle scope on `env`).
pub fn promise(env: sys::napi_env) -> napi::Result<(Promised, sys::napi_value)> {
    LOCAL.with_borrow_mut(|local| {
        if local.is_none() {
            *local = Some(Local::new(env)?);
        }
        let local = local.as_mut().expect("made above");
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        check(
            // SAFETY: on the JS thread, inside a napi call (or handle scope) on `env`.
            unsafe { sys::napi_create_promise(env, &mut deferred, &mut promise) },
            "napi_create_promise",
        )?;
        let id = local.insert(env, deferred);
        Ok((
            Promised {
                id,
                shared: local.shared.clone(),
            },
            promise,
        ))
    })
}

/// Runs `fut` on napi's tokio runtime and settles `promised` with its result, on this JS
/// thread in a batch with whatever else ended meanwhile.
pub fn spawn_into<T, F>(promised: Promised, fut: F)
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    // Boxed first: an unboxed future is copied whole each time tokio moves it (into the task
    // cell, out of it, over it when it ends), and the Redis gate's is about 8 KB: those copies
    // were 13 % of the CPU profile with 64 reads in flight on the runtime path (TLS), and 3.6 %
    // after. The task then holds a pointer, and the future is copied once, into its box.
    let fut = Box::pin(fut);
    napi::bindgen_prelude::spawn(async move {
        let result = fut.await;
        let settlement: Settlement = Box::new(move |env| {
            // SAFETY: called by `call_js` on the JS thread with its live environment.
            result.and_then(|v| unsafe { T::to_napi_value(env, v) })
        });
        promised.shared.push(promised.id, settlement);
    });
}

/// Settles `promised` now. On the JS thread that made it, inside a handle scope on `env`.
pub fn settle_here<T: ToNapiValue>(
    env: sys::napi_env,
    promised: Promised,
    result: napi::Result<T>,
) {
    let Some(deferred) =
        LOCAL.with_borrow_mut(|l| l.as_mut().and_then(|l| l.take(env, promised.id)))
    else {
        return;
    };
    // SAFETY: on the JS thread, in a handle scope on `env` (the caller's promise).
    let value = result.and_then(|v| unsafe { T::to_napi_value(env, v) });
    settle_deferred(env, deferred, value);
}

fn settle_deferred(
    env: sys::napi_env,
    deferred: sys::napi_deferred,
    value: napi::Result<sys::napi_value>,
) {
    match value {
        // SAFETY: `deferred` came from napi_create_promise on this environment and is
        // settled exactly once (taken out of the table by the caller).
        Ok(value) => unsafe {
            sys::napi_resolve_deferred(env, deferred, value);
        },
        // SAFETY: as for resolving: this environment's deferred, settled once.
        Err(e) => unsafe {
            let reason = JsError::from(e).into_value(env);
            sys::napi_reject_deferred(env, deferred, reason);
        },
    }
}

/// Runs `fut` on napi's tokio runtime and returns a promise of its result, settled on this JS
/// thread in a batch with whatever else ended meanwhile.
pub fn spawn_settled<'env, T, F>(env: &'env Env, fut: F) -> napi::Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    let (promised, promise) = promise(env.raw())?;
    spawn_into(promised, fut);
    Ok(PromiseRaw::new(env.raw(), promise))
}

/// The JS thread settles everything queued. `env` is null while Node tears the environment
/// down: then the settlements are only dropped.
unsafe extern "C" fn call_js(
    env: sys::napi_env,
    _js_callback: sys::napi_value,
    _context: *mut std::ffi::c_void,
    _data: *mut std::ffi::c_void,
) {
    let shared = LOCAL
        .try_with(|l| l.borrow().as_ref().map(|l| l.shared.clone()))
        .ok()
        .flatten();
    let Some(shared) = shared else { return };
    let batch = std::mem::take(&mut shared.inner.lock_or_recover().queue);
    if env.is_null() {
        return;
    }
    for (id, settlement) in batch {
        let Some(deferred) = LOCAL.with_borrow_mut(|l| l.as_mut().and_then(|l| l.take(env, id)))
        else {
            continue;
        };
        settle_deferred(env, deferred, settlement(env));
    }
}

/// Node finalized the threadsafe function (environment teardown): nothing may call it again.
unsafe extern "C" fn finalize(
    _env: sys::napi_env,
    data: *mut std::ffi::c_void,
    _hint: *mut std::ffi::c_void,
) {
    // SAFETY: `data` is the Arc leaked for this in `Local::new`, taken back once.
    let shared = unsafe { Arc::from_raw(data as *const Shared) };
    let mut p = shared.inner.lock_or_recover();
    p.tsfn = None;
    p.queue.clear();
    drop(p);
    // The thread may be exiting (a worker thread), its locals gone already.
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        if l.as_ref().is_some_and(|l| Arc::ptr_eq(&l.shared, &shared)) {
            *l = None;
        }
    });
}
