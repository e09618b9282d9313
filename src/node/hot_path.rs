//! The hot path: `peek`, a raw N-API function, and the hit encoding it shares with the other
//! reads. Every `unsafe` block of the binding is in this file (the raw N-API calls, the one
//! conversion of a JS value whose type napi cannot check for us, `checked_cast`, and `js_string`),
//! in `settle.rs` (the threadsafe function Redis promises settle through), or in `lane/` (the
//! read lane's libuv calls), so the code the compiler cannot check is read in three places.
//! (`RedisAnswer`'s `ToNapiValue` in `redis.rs` is an `unsafe fn` because the trait's is; it
//! only hands its fields to napi-rs's own conversions.)

use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;

use std::sync::Arc;

use super::codes::{encode_hit, HIT_REFRESH, MISS};
use super::engines::ENGINES;
use crate::fresh::FreshWords;
use crate::key;

/// N-API copies at most `KEY_BUF - 1` bytes and cuts at a character boundary (up to 3 bytes
/// short), so a copy of at most MAX_KEY_BYTES bytes is the whole string: a longer string would
/// have filled at least `KEY_BUF - 4` = MAX_KEY_BYTES + 1 bytes.
const KEY_BUF: usize = key::MAX_KEY_BYTES + 5;

/// What a hot-path read is for: `getOrLoad` may start a refresh (XFetch at `beta`, below 0 the
/// constructor's; stale), `get` never does (it has no loader).
#[derive(Clone, Copy)]
enum Read {
    GetOrLoad { beta: f64 },
    Get,
}

/// `getOrLoad`'s hot path: a usable entry for a string key under the default policy, as
/// `encode_hit` (refresh = 1 asks the facade to start a background refresh), or -1.
///
/// Registered as a raw N-API callback rather than through `#[napi]`: the macro's per-call
/// machinery (argument validation, borrow scopes) cost more than the lookup itself, and this
/// function only reads two primitives and returns an int. The key is read into a stack buffer,
/// so a hit allocates nothing and never converts or copies the cached value.
unsafe extern "C" fn peek_raw(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    // SAFETY: as for `peek_call`, whose contract is this callback's.
    unsafe { peek_call(env, info, Read::GetOrLoad { beta: -1.0 }) }
}

/// `get`'s hot path: the same lookup, counted in the same stats as `getEntry` counts a hit, but
/// with XFetch off (beta 0, no random draw) and never a refresh request: `get` never loads.
/// `getEntry` took 3x as long per hit (profiled): its `#[napi]` `String` argument
/// measures the key, then allocates, copies and frees it, on top of the macro's machinery.
unsafe extern "C" fn peek_get_raw(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    // SAFETY: as for `peek_call`, whose contract is this callback's.
    unsafe { peek_call(env, info, Read::Get) }
}

/// The body of both raw callbacks. Safety: called by Node on the JS thread, with the `env` and
/// `info` of the call being made.
#[inline(always)]
unsafe fn peek_call(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    read: Read,
) -> sys::napi_value {
    let mut argc = 2usize;
    let mut argv = [std::ptr::null_mut(); 2];
    let mut out = std::ptr::null_mut();
    // Not zeroed: N-API writes the bytes it reports, and only those are read.
    let mut buf = std::mem::MaybeUninit::<[u8; KEY_BUF]>::uninit();
    // SAFETY: Node calls this on the JS thread with a valid env and callback info; every
    // out-pointer is a live local; `buf`'s length is passed with it, and the slice reads only the
    // `len` bytes N-API reports having written there (at most `KEY_BUF - 1`).
    unsafe {
        let mut code = MISS;
        if sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ) == sys::Status::napi_ok
            && argc == 2
        {
            let mut id = 0u32;
            let mut len = 0usize;
            if sys::napi_get_value_uint32(env, argv[0], &mut id) == sys::Status::napi_ok
                && sys::napi_get_value_string_utf8(
                    env,
                    argv[1],
                    buf.as_mut_ptr().cast(),
                    KEY_BUF,
                    &mut len,
                ) == sys::Status::napi_ok
            {
                let written =
                    std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len.min(KEY_BUF));
                code = peek_key(id, written, read);
            }
        }
        sys::napi_create_int32(env, code, &mut out);
    }
    out
}

/// `getOrLoad`'s hot path at a call's own XFetch `beta`, what `peek` answers: for
/// `getOrLoadMany` with a beta of its own, whose held keys are decided as `lookup` decides them
/// at that beta, without leading a flight for the others (they are read from Redis first). A
/// `#[napi]` function, not a raw one: it is not on a single read's path.
#[napi]
pub fn peek_at(id: u32, key: String, beta: f64) -> i32 {
    peek_key(id, key.as_bytes(), Read::GetOrLoad { beta })
}

#[inline]
fn peek_key(id: u32, key: &[u8], read: Read) -> i32 {
    // Empty or longer than the limit (maybe truncated): never stored, so a miss; the slow path
    // reports the invalid key. U+FFFD may stand for a lone surrogate that UTF-8 cannot carry,
    // which would alias another key: the slow path decides those too.
    if key.is_empty() || key.len() > key::MAX_KEY_BYTES || has_replacement_char(key) {
        return MISS;
    }
    let Ok(key) = std::str::from_utf8(key) else {
        return MISS;
    };
    ENGINES.with_borrow(|engines| {
        let Some(Some(engine)) = engines.get(id as usize) else {
            return MISS;
        };
        let cache = &mut engine.borrow_mut().cache;
        // Invalidations from other processes are applied on the slow path, where the facade
        // reports them to its invalidation channel if anyone listens (once per delivery).
        if cache.inbox().has_pending() {
            return MISS;
        }
        match read {
            Read::GetOrLoad { beta } => {
                let beta = if beta >= 0.0 {
                    beta
                } else {
                    cache.options().defaults.beta
                };
                cache.peek(key, beta).map_or(MISS, encode_hit)
            }
            // As `Cache::get_hit`: beta 0, and a stale hit's refresh request dropped.
            Read::Get => cache
                .peek(key, 0.0)
                .map_or(MISS, |hit| encode_hit(hit) & !(HIT_REFRESH as i32)),
        }
    })
}

/// U+FFFD is EF BF BD in UTF-8.
#[inline]
fn has_replacement_char(key: &[u8]) -> bool {
    key.contains(&0xEF) && key.windows(3).any(|w| w == [0xEF, 0xBF, 0xBD])
}

/// `freshIndex(id)`: the engine's words shared with the facade's index of fresh entries (see
/// `src/fresh.rs`), as an ArrayBuffer over the engine's own memory, or `null` (no such engine,
/// the in-process tier off, or a runtime that cannot make an external ArrayBuffer: then every
/// hit takes `peek`). The words are written from other threads (an invalidation heard from the
/// bus bumps the epoch as it arrives), so the facade cannot own them: the buffer holds an `Arc`
/// of them, dropped by its finalizer, and the words outlive whichever of the engine and the
/// buffer goes last.
unsafe extern "C" fn fresh_index_raw(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    let mut argc = 1usize;
    let mut argv = [std::ptr::null_mut(); 1];
    let mut id = u32::MAX;
    let mut out = std::ptr::null_mut();
    // SAFETY: Node calls this on the JS thread with a valid env and callback info; every
    // out-pointer is a live local.
    unsafe {
        if sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ) != sys::Status::napi_ok
            || argc != 1
            || sys::napi_get_value_uint32(env, argv[0], &mut id) != sys::Status::napi_ok
        {
            id = u32::MAX;
        }
    }
    let words = ENGINES.with_borrow(|engines| match engines.get(id as usize) {
        Some(Some(engine)) => engine.borrow().cache.fresh_words().cloned(),
        _ => None,
    });
    if let Some(words) = words {
        let data = Arc::as_ptr(&words).cast_mut().cast::<std::ffi::c_void>();
        let hint = Box::into_raw(Box::new(words));
        // SAFETY: on the JS thread. `data` points at `FreshWords::byte_len()` bytes kept alive
        // by the `Arc` behind `hint` until the finalizer takes it back (exactly once: N-API calls
        // it once, and only if the buffer was made). The words are atomics (interior
        // mutability), so JS writing them through its views aliases nothing Rust holds by
        // reference; JS writes only the touch log, read by Rust on this same thread.
        unsafe {
            if sys::napi_create_external_arraybuffer(
                env,
                data,
                FreshWords::byte_len(),
                Some(release_words),
                hint.cast(),
                &mut out,
            ) == sys::Status::napi_ok
            {
                return out;
            }
            drop(Box::from_raw(hint));
        }
    }
    // SAFETY: on the JS thread with a valid env; `out` is a live local.
    unsafe { sys::napi_get_null(env, &mut out) };
    out
}

/// The finalizer of `freshIndex`'s buffer: drops the buffer's `Arc` of the words.
unsafe extern "C" fn release_words(
    _env: sys::napi_env,
    _data: *mut std::ffi::c_void,
    hint: *mut std::ffi::c_void,
) {
    // SAFETY: `hint` is the `Box<Arc<FreshWords>>` `fresh_index_raw` leaked for this buffer,
    // and N-API calls its finalizer once.
    drop(unsafe { Box::from_raw(hint.cast::<Arc<FreshWords>>()) });
}

/// Adds `peek(id, key)` (getOrLoad), `peekGet(id, key)` (get) and `freshIndex(id)` to the
/// module's exports. One
/// function for every engine keeps each facade call site monomorphic (a function per engine made
/// it ~15% slower with 3 caches).
#[napi(module_exports)]
pub fn register_raw_functions(exports: Object, env: Env) -> napi::Result<()> {
    type Callback = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;
    let raw: [(&std::ffi::CStr, Callback); 3] = [
        (c"peek", peek_raw),
        (c"peekGet", peek_get_raw),
        (c"freshIndex", fresh_index_raw),
    ];
    for (name, callback) in raw {
        let mut f = std::ptr::null_mut();
        // SAFETY: env and exports come from Node's module initialisation on the JS thread; the
        // name is a NUL-terminated literal, passed with its length.
        unsafe {
            napi::check_status!(sys::napi_create_function(
                env.raw(),
                name.as_ptr(),
                name.to_bytes().len() as isize,
                Some(callback),
                std::ptr::null_mut(),
                &mut f
            ))?;
            napi::check_status!(sys::napi_set_named_property(
                env.raw(),
                exports.raw(),
                name.as_ptr(),
                f
            ))?;
        }
    }
    Ok(())
}

/// `v` as a `T`, once napi's own check says that it is one (`ValidateNapiValue`: the JS type, or
/// `Array.isArray`, or `Buffer.isBuffer`); an error if not. Every conversion of an argument whose
/// type varies (an option, a key) goes through here.
pub(super) fn checked_cast<T: FromNapiValue + ValidateNapiValue>(
    v: &Unknown<'_>,
) -> napi::Result<T> {
    let raw = v.value();
    // SAFETY: `raw` is `v`'s env and value, handed to the call running now on the JS thread, so
    // both are live for `validate`; and `cast` (`T::from_napi_value`) requires a value that is a
    // `T`, which `validate` has just checked.
    unsafe {
        T::validate(raw.env, raw.value)?;
        v.cast::<T>()
    }
}

/// A JS string of `text`. ASCII (most JSON) is made as Latin-1, which V8 copies as is; other
/// text goes through V8's UTF-8 decoder, which for a 10 KB value cost more than the socket read.
pub(super) fn js_string(env: sys::napi_env, text: &str) -> napi::Result<sys::napi_value> {
    let mut out = std::ptr::null_mut();
    // SAFETY: on the JS thread with its live environment (the caller is a ToNapiValue
    // conversion); `text` is valid for `len` bytes, and ASCII is valid Latin-1.
    let status = unsafe {
        if text.is_ascii() {
            sys::napi_create_string_latin1(env, text.as_ptr().cast(), text.len() as isize, &mut out)
        } else {
            sys::napi_create_string_utf8(env, text.as_ptr().cast(), text.len() as isize, &mut out)
        }
    };
    if status == sys::Status::napi_ok {
        Ok(out)
    } else {
        Err(napi::Error::new(
            napi::Status::from(status),
            "a string could not be made",
        ))
    }
}

/// The facade's function that makes a Redis answer object of its arguments (`setAnswerMaker`),
/// held for the life of this JS thread's environment.
#[derive(Clone, Copy)]
struct AnswerMaker(sys::napi_ref);

thread_local! {
    static ANSWER_MAKER: std::cell::Cell<Option<AnswerMaker>> = const { std::cell::Cell::new(None) };
}

/// Registers the facade's answer maker (see `make_answer`); called once as the facade loads, on
/// each JS thread that loads it.
#[napi]
pub fn set_answer_maker(env: Env, maker: Unknown<'_>) -> napi::Result<()> {
    if maker.get_type()? != ValueType::Function {
        return Err(napi::Error::from_reason(
            "the answer maker must be a function",
        ));
    }
    let mut r = std::ptr::null_mut();
    // SAFETY: on the JS thread, inside this napi call; `maker` is a live value of `env`. The
    // reference (count 1) keeps the function alive as long as the thread's environment.
    napi::check_status!(unsafe { sys::napi_create_reference(env.raw(), maker.raw(), 1, &mut r) })?;
    if let Some(AnswerMaker(old)) = ANSWER_MAKER.replace(Some(AnswerMaker(r))) {
        // SAFETY: a reference made above on this thread's environment, no longer held.
        unsafe { sys::napi_delete_reference(env.raw(), old) };
    }
    Ok(())
}

/// The facade's answer object for `args`, made by the facade's own function: a JS object
/// literal is made by the JIT at a fraction of the cost of setting an array's elements one N-API
/// call at a time (3.4 µs of a 91 B Redis read went there, timed in the lane's callback).
pub(super) fn make_answer(
    env: sys::napi_env,
    args: &[sys::napi_value],
) -> napi::Result<sys::napi_value> {
    let Some(AnswerMaker(r)) = ANSWER_MAKER.get() else {
        return Err(napi::Error::from_reason("no answer maker is registered"));
    };
    let mut maker = std::ptr::null_mut();
    let mut this = std::ptr::null_mut();
    let mut out = std::ptr::null_mut();
    // SAFETY: on the JS thread with its live environment, in a handle scope (the caller is a
    // ToNapiValue conversion); `r` is this thread's reference to a function; `args` are values
    // of `env` made in that scope.
    unsafe {
        napi::check_status!(sys::napi_get_reference_value(env, r, &mut maker))?;
        napi::check_status!(sys::napi_get_undefined(env, &mut this))?;
        napi::check_status!(sys::napi_call_function(
            env,
            this,
            maker,
            args.len(),
            args.as_ptr(),
            &mut out
        ))?;
    }
    Ok(out)
}
