//! The socket lane (Bun, Deno, whose `uv_*` are not libuv's): a socket of the runtime's own,
//! driven by `lib/lane.js`, whose chunks are framed here, one call each.

use super::*;

impl Lane {
    /// Opens a socket lane to `target`: `lib/lane.js` connects a socket of the runtime's own and
    /// writes the handshake; its replies, framed here (`feed`), open the lane. Inside a napi call.
    pub(super) fn connect_socket(
        env: sys::napi_env,
        tier: &Arc<RedisTier>,
        target: LaneTarget,
        replacement: u64,
    ) -> napi::Result<Rc<RefCell<Lane>>> {
        let (hello, required) = target.handshake_packed();
        let id = NEXT_SOCKET_LANE.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1));
            id
        });
        let (host, port, path) = target.address();
        // SAFETY: on the JS thread, inside a napi call on `env` (a handle scope is open).
        let (write, end) = unsafe {
            call_opener(
                env,
                Opening {
                    id,
                    host,
                    port,
                    path,
                    hello: &hello,
                    connect_ms: tier.lane_connect_timeout().as_millis() as f64,
                    command_ms: tier.lane_timeout().as_millis() as f64,
                },
            )?
        };
        let lane = Rc::new(RefCell::new(Lane {
            socket: Some(SocketIo {
                id,
                write,
                end,
                handshake: required.into(),
            }),
            ..Lane::idle(env, tier.clone(), replacement)
        }));
        SOCKET_LANES.with_borrow_mut(|lanes| lanes.insert(id, Rc::downgrade(&lane)));
        Ok(lane)
    }

    /// A chunk the socket lane's socket read: the handshake's replies first, then the reads'.
    pub(super) fn feed(&mut self, chunk: &[u8]) -> (Vec<(Sent, Framed)>, Option<String>) {
        self.input.extend_from_slice(chunk);
        if let Some(socket) = self.socket.as_mut() {
            let mut at = 0;
            let mut failure = None;
            while let Some(&required) = socket.handshake.front() {
                match frame(&self.input[at..]) {
                    Ok(Some((reply, len))) => {
                        if let Err(why) = handshake_reply(reply, required) {
                            failure = Some(why);
                            break;
                        }
                        socket.handshake.pop_front();
                        at += len;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        failure = Some("Redis answered the read lane out of protocol".into());
                        break;
                    }
                }
            }
            self.input.drain(..at);
            if failure.is_some() || !socket.handshake.is_empty() {
                return (Vec::new(), failure);
            }
        }
        self.frame_input(None)
    }
}

/// A socket lane's connection: the object `lib/lane.js` made for it.
pub(super) struct SocketIo {
    /// This lane's number, which `lib/lane.js` gives back with every chunk.
    pub(super) id: u32,
    /// Its `write(bytes)` and `end()` functions, held while the lane is open.
    pub(super) write: sys::napi_ref,
    pub(super) end: sys::napi_ref,
    /// The handshake's replies still awaited, oldest first: whether each one's refusal refuses
    /// the lane. Empty: open.
    pub(super) handshake: VecDeque<bool>,
}

impl SocketIo {
    /// Ends the socket (`end()`) and lets its functions go.
    ///
    /// SAFETY: on the JS thread of `env`, inside a napi call.
    pub(super) unsafe fn end(self, env: sys::napi_env) {
        // SAFETY: the caller's promise; the references are this connection's, deleted once.
        unsafe {
            let _ = call_ref(env, self.end, &[]);
            sys::napi_delete_reference(env, self.write);
            sys::napi_delete_reference(env, self.end);
        }
    }
}

/// What `lib/lane.js` is asked to connect to.
pub(super) struct Opening<'a> {
    id: u32,
    host: &'a str,
    port: u16,
    path: Option<&'a str>,
    /// The handshake's commands, written as soon as the socket is made.
    hello: &'a [u8],
    connect_ms: f64,
    command_ms: f64,
}

/// The facade's function that opens a socket lane (`setLaneOpener`), held for the life of this
/// JS thread's environment.
#[derive(Clone, Copy)]
pub(super) struct Opener(sys::napi_ref);

thread_local! {
    /// How socket lanes write the reads that a chunk's answers' continuations send. Those run
    /// after `lane_data` returns, in the microtasks that follow, where the libuv lane's callback
    /// scope batches them (`BATCH`). A chunk that answered several reads begins a hold: each
    /// socket lane (a Cluster's continuations read on other nodes' lanes too) writes its first
    /// read at once (a sequential reader waits for nothing) and the rest together, with one
    /// mark, when `lib/lane.js` calls `lane_release` after those microtasks, instead of a write
    /// and a mark each. `Some`: the lanes that wrote their first read in the hold.
    pub(super) static HOLDING: RefCell<Option<Vec<Rc<RefCell<Lane>>>>> = const { RefCell::new(None) };
    /// Set while a collected cache's lanes close (see `closing_in_finalizer`).
    pub(super) static FINALIZING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Socket lanes shut in a finalizer, whose sockets are ended at the next lane call.
    pub(super) static UNENDED: RefCell<Vec<SocketIo>> = const { RefCell::new(Vec::new()) };
    pub(super) static SOCKET_OPENER: std::cell::Cell<Option<Opener>> = const { std::cell::Cell::new(None) };
    /// This thread's socket lanes by number (a lane dropped without shutting is gone here too:
    /// its chunks are then refused and its socket ended).
    pub(super) static SOCKET_LANES: RefCell<std::collections::HashMap<u32, Weak<RefCell<Lane>>>> =
        RefCell::new(std::collections::HashMap::new());
    pub(super) static NEXT_SOCKET_LANE: std::cell::Cell<u32> = const { std::cell::Cell::new(1) };
}

/// Whether reads take the socket lane only: on a host whose `uv_*` are not libuv's (Bun, Deno:
/// `refuseReadLane`), or when `STAMPEDE_CACHE_LANE=socket` asks for it (to run the socket lane
/// under Node, as the tests do).
pub(super) fn socket_lane_only() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    NOT_LIBUV.load(std::sync::atomic::Ordering::Relaxed)
        || *FORCED
            .get_or_init(|| std::env::var_os("STAMPEDE_CACHE_LANE").is_some_and(|v| v == "socket"))
}

/// Whether this thread can open a socket lane: the facade registered its opener, and
/// `STAMPEDE_CACHE_NO_LANE=1` does not turn lanes off.
pub(super) fn socket_opener_registered() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var_os("STAMPEDE_CACHE_NO_LANE").is_some_and(|v| v == "1"))
        && SOCKET_OPENER.get().is_some()
}

/// Registers the facade's socket lane opener (`lib/lane.js`); called once as the facade loads,
/// on each JS thread that loads it.
#[napi_derive::napi]
pub fn set_lane_opener(env: Env, opener: Unknown<'_>) -> napi::Result<()> {
    if opener.get_type()? != ValueType::Function {
        return Err(napi::Error::from_reason(
            "the lane opener must be a function",
        ));
    }
    let mut r = ptr::null_mut();
    // SAFETY: on the JS thread, inside this napi call; `opener` is a live value of `env`. The
    // reference keeps the function alive as long as the thread's environment.
    napi::check_status!(unsafe { sys::napi_create_reference(env.raw(), opener.raw(), 1, &mut r) })?;
    if let Some(Opener(old)) = SOCKET_OPENER.replace(Some(Opener(r))) {
        // SAFETY: a reference made on this thread's environment, no longer held.
        unsafe { sys::napi_delete_reference(env.raw(), old) };
    }
    Ok(())
}

/// Runs `close` (which closes lanes) in a finalizer, where no JS may run: the sockets of the
/// socket lanes it shuts are ended later, inside a napi call (`end_unended`).
pub fn closing_in_finalizer(close: impl FnOnce()) {
    let was = FINALIZING.replace(true);
    close();
    FINALIZING.set(was);
}

/// Ends the sockets of socket lanes shut in a finalizer. Inside a napi call on `env`.
pub(super) fn end_unended(env: sys::napi_env) {
    if UNENDED.with_borrow(Vec::is_empty) {
        return;
    }
    for socket in UNENDED.with_borrow_mut(std::mem::take) {
        // SAFETY: the caller's promise (a napi call on this thread's environment); each was
        // taken from its shut lane once.
        unsafe { socket.end(env) };
    }
}

pub(super) fn socket_lane(id: u32) -> Option<Rc<RefCell<Lane>>> {
    SOCKET_LANES.with_borrow(|lanes| lanes.get(&id).and_then(Weak::upgrade))
}

/// `lib/lane.js`: a chunk socket lane `id` read (the first `length` bytes of `buffer`). Answers, once open, twice the reads in flight
/// on it (the socket is let go at 0), plus 1 if it answered several (then call `lane_release`
/// after the microtasks that follow); -1 while its handshake runs, -2 if the lane is gone or
/// shut (the socket is then ended). The reads it answered are settled inside this call.
#[napi_derive::napi]
pub fn lane_data(id: u32, buffer: &[u8], length: u32) -> i32 {
    // The lane's read buffer and how much of it this chunk filled (no view made per chunk).
    let chunk = &buffer[..(length as usize).min(buffer.len())];
    let Some(lane) = socket_lane(id) else {
        return -2;
    };
    let (answered, failure) = {
        let mut l = lane.borrow_mut();
        if l.shut {
            return -2;
        }
        l.feed(chunk)
    };
    // One answer (a sequential reader): its continuation's read is written at once, and
    // there is nothing to release.
    let answers = answered.len() > 1;
    if answers {
        HOLDING.with_borrow_mut(|holding| {
            holding.get_or_insert_with(Vec::new);
        });
    }
    if !answered.is_empty() {
        let (env, tier) = {
            let l = lane.borrow();
            (l.env, l.tier.clone())
        };
        for (s, read) in answered {
            s.answer(env, &tier, Some(read));
        }
    }
    if let Some(why) = failure {
        Lane::shut(&lane, Some(Failure::Lost(why)));
    }
    let l = lane.borrow();
    match &l.socket {
        _ if l.shut => -2,
        Some(s) if !s.handshake.is_empty() => -1,
        _ => (l.sent.len().min(i32::MAX as usize >> 1) as i32) << 1 | i32::from(answers),
    }
}

/// `lib/lane.js`: the microtasks after a chunk that answered several reads have run: the hold
/// ends, and the reads held on each socket lane (see `HOLDING`) are written together, with one
/// mark each.
#[napi_derive::napi]
pub fn lane_release() {
    let held = HOLDING.with_borrow_mut(Option::take).unwrap_or_default();
    for lane in held {
        let flushed = {
            let mut l = lane.borrow_mut();
            if l.shut {
                continue;
            }
            l.flush()
        };
        if let Err(e) = flushed {
            Lane::shut(
                &lane,
                Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
            );
        }
    }
}

/// `lib/lane.js`: socket lane `id`'s timer fired (and the chunks the socket had meanwhile were
/// fed first: a busy thread is not a Redis failure). Answers the milliseconds until the oldest
/// read in flight times out (arm again), or -1 when none is in flight; a read past the command
/// timeout shuts the lane, as on the libuv lane.
#[napi_derive::napi]
pub fn lane_timer(id: u32) -> i32 {
    let Some(lane) = socket_lane(id) else {
        return -1;
    };
    {
        let l = lane.borrow();
        if l.shut {
            return -1;
        }
        let Some(first) = l.sent.front() else {
            return -1;
        };
        let now = Instant::now();
        if now < first.deadline {
            return (first.deadline - now).as_millis().min(i32::MAX as u128) as i32;
        }
    }
    let timeout = lane.borrow().tier.lane_timeout();
    Lane::shut(
        &lane,
        Some(Failure::TimedOut(format!(
            "Redis get timed out after {timeout:?} (read lane)"
        ))),
    );
    -1
}

/// `lib/lane.js`: socket lane `id`'s socket closed or failed (`why`): the reads it carried are
/// asked again on the command connection.
#[napi_derive::napi]
pub fn lane_closed(id: u32, why: String) {
    if let Some(lane) = socket_lane(id) {
        Lane::shut(&lane, Some(Failure::Lost(why)));
    }
    SOCKET_LANES.with_borrow_mut(|lanes| lanes.remove(&id));
}

/// Calls the opener with `o` as one record, `{ id, host, port, path, hello, connectMs,
/// commandMs }` (`path`: null over TCP): the connection's `write` and `end` functions.
///
/// SAFETY: on the JS thread of `env`, inside a napi call (a handle scope is open).
pub(super) unsafe fn call_opener(
    env: sys::napi_env,
    o: Opening<'_>,
) -> napi::Result<(sys::napi_ref, sys::napi_ref)> {
    let Some(Opener(opener)) = SOCKET_OPENER.get() else {
        return Err(napi::Error::from_reason("no lane opener is registered"));
    };
    // SAFETY: the caller's promise; every value is made in the open scope and set at once.
    unsafe {
        let mut record = ptr::null_mut();
        napi::check_status!(sys::napi_create_object(env, &mut record))?;
        let mut id = ptr::null_mut();
        napi::check_status!(sys::napi_create_uint32(env, o.id, &mut id))?;
        let mut port = ptr::null_mut();
        napi::check_status!(sys::napi_create_uint32(env, u32::from(o.port), &mut port))?;
        let path = match o.path {
            Some(p) => js_string(env, p)?,
            None => {
                let mut null = ptr::null_mut();
                napi::check_status!(sys::napi_get_null(env, &mut null))?;
                null
            }
        };
        let mut connect_ms = ptr::null_mut();
        napi::check_status!(sys::napi_create_double(env, o.connect_ms, &mut connect_ms))?;
        let mut command_ms = ptr::null_mut();
        napi::check_status!(sys::napi_create_double(env, o.command_ms, &mut command_ms))?;
        let fields = [
            (c"id", id),
            (c"host", js_string(env, o.host)?),
            (c"port", port),
            (c"path", path),
            (c"hello", js_buffer(env, o.hello)?),
            (c"connectMs", connect_ms),
            (c"commandMs", command_ms),
        ];
        for (name, value) in fields {
            napi::check_status!(sys::napi_set_named_property(
                env,
                record,
                name.as_ptr(),
                value
            ))?;
        }
        let conn = call_ref(env, opener, &[record])?;
        let mut refs = [ptr::null_mut(); 2];
        for (r, name) in refs.iter_mut().zip([c"write", c"end"]) {
            let mut f = ptr::null_mut();
            napi::check_status!(sys::napi_get_named_property(
                env,
                conn,
                name.as_ptr(),
                &mut f
            ))?;
            napi::check_status!(sys::napi_create_reference(env, f, 1, r))?;
        }
        Ok((refs[0], refs[1]))
    }
}

/// Calls the connection's `write` with `bytes` as a Latin-1 string (one character a byte, which
/// `socket.write(s, 'latin1')` writes back byte for byte): cheaper to make than a Buffer, and
/// written from a copy, so nothing made here is held by the socket after.
///
/// SAFETY: on the JS thread of `env`, inside a napi call.
pub(super) unsafe fn call_write(
    env: sys::napi_env,
    write: sys::napi_ref,
    bytes: &[u8],
) -> napi::Result<()> {
    let mut text = ptr::null_mut();
    // SAFETY: the caller's promise; `bytes` is readable for its length, copied by the call.
    unsafe {
        napi::check_status!(sys::napi_create_string_latin1(
            env,
            bytes.as_ptr().cast(),
            bytes.len() as isize,
            &mut text
        ))?;
        call_ref(env, write, &[text]).map(|_| ())
    }
}

/// Calls the function `f` refers to with `args`; a throw is cleared and returned as an error
/// (it must not surface in the napi call that wrote or ended the socket).
///
/// SAFETY: on the JS thread of `env`, inside a napi call; `args` are values of `env`.
pub(super) unsafe fn call_ref(
    env: sys::napi_env,
    f: sys::napi_ref,
    args: &[sys::napi_value],
) -> napi::Result<sys::napi_value> {
    // SAFETY: the caller's promise; `f` is a live reference of `env`.
    unsafe {
        let mut func = ptr::null_mut();
        let mut this = ptr::null_mut();
        let mut out = ptr::null_mut();
        napi::check_status!(sys::napi_get_reference_value(env, f, &mut func))?;
        napi::check_status!(sys::napi_get_undefined(env, &mut this))?;
        let status = sys::napi_call_function(env, this, func, args.len(), args.as_ptr(), &mut out);
        if status != sys::Status::napi_ok {
            let mut pending = false;
            sys::napi_is_exception_pending(env, &mut pending);
            if pending {
                let mut thrown = ptr::null_mut();
                sys::napi_get_and_clear_last_exception(env, &mut thrown);
            }
            return Err(napi::Error::from_reason("the lane's socket threw"));
        }
        Ok(out)
    }
}

/// SAFETY: on the JS thread of `env`, in a handle scope.
pub(super) unsafe fn js_string(env: sys::napi_env, s: &str) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    // SAFETY: the caller's promise; `s` is valid UTF-8 of the length given.
    napi::check_status!(unsafe {
        sys::napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut out)
    })?;
    Ok(out)
}

/// SAFETY: on the JS thread of `env`, in a handle scope.
pub(super) unsafe fn js_buffer(env: sys::napi_env, bytes: &[u8]) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    let mut data = ptr::null_mut();
    // SAFETY: the caller's promise; `bytes` is readable for its length, copied by the call.
    napi::check_status!(unsafe {
        sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out)
    })?;
    Ok(out)
}
