//! The libuv lane (Node): the socket watched by the JS thread's own libuv loop, its timer, TLS,
//! and every raw libuv call and the N-API calls around the loop's callbacks, each with its
//! SAFETY argument.

use super::*;

impl Lane {
    /// Closes a libuv lane's handles (the socket closes with its poll handle); once, as the
    /// lane shuts (`shut` guards): their close callbacks free them and drop the lane's
    /// references.
    pub(super) fn close_handles(&mut self) {
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: live handles of this thread's loop, closed once (the caller set `shut`).
        unsafe {
            (uv.close)(self.poll, Some(on_close_poll));
            (uv.close)(self.timer, Some(on_close_timer));
        }
    }

    pub(super) fn install(
        uv: &'static Uv,
        env: sys::napi_env,
        tier: Arc<RedisTier>,
        socket: LaneSocket,
    ) -> napi::Result<Rc<RefCell<Lane>>> {
        let mut uv_loop = ptr::null_mut();
        // SAFETY: on the JS thread, inside a napi call on `env`.
        let status = unsafe { sys::napi_get_uv_event_loop(env, &mut uv_loop) };
        if status != sys::Status::napi_ok || uv_loop.is_null() {
            return Err(napi::Error::from_reason("no event loop"));
        }
        let uv_loop = uv_loop.cast::<c_void>();
        // Made here, inside a napi call: the loop's callbacks have no scope to make it in.
        if async_context(env).is_none() {
            return Err(napi::Error::from_reason("napi_async_init failed"));
        }
        let poll = uv.alloc(UV_POLL);
        let timer = uv.alloc(UV_TIMER);
        let fd = raw_fd(&socket.stream);
        // SAFETY: `poll` and `timer` are zeroed blocks of the size libuv gives for their types;
        // `uv_loop` is this thread's loop; `fd` is an open non-blocking socket that the lane
        // owns until both handles have closed.
        let (a, b) = unsafe {
            (
                (uv.poll_init)(uv_loop, poll, fd),
                (uv.timer_init)(uv_loop, timer),
            )
        };
        if a != 0 || b != 0 {
            // SAFETY: never initialized: only freed.
            unsafe {
                uv.free(poll, UV_POLL);
                uv.free(timer, UV_TIMER);
            }
            return Err(napi::Error::from_reason("uv_poll_init failed"));
        }
        let lane = Rc::new(RefCell::new(Lane {
            stream: Some(socket.stream),
            tls: socket.tls,
            poll,
            timer,
            refd: true,
            ..Lane::idle(env, tier, socket.opened_at_replacement)
        }));
        // Each handle holds the lane until its close callback.
        // SAFETY: initialized handles of this thread's loop; their data is a leaked Rc, taken
        // back in `on_close`. The loop is not kept alive by an idle lane.
        unsafe {
            (uv.set_data)(poll, Rc::into_raw(lane.clone()) as *mut c_void);
            (uv.set_data)(timer, Rc::into_raw(lane.clone()) as *mut c_void);
            (uv.poll_start)(poll, UV_READABLE, on_poll);
            (uv.unref)(poll);
            (uv.unref)(timer);
        }
        lane.borrow_mut().refd = false;
        register_for_teardown(env, &lane);
        Ok(lane)
    }

    /// Writes what it can of `out` (over TLS: encrypts it and writes the records); watches for
    /// writability while some is left. Marks the reads written since the last mark first.
    pub(super) fn flush(&mut self) -> io::Result<()> {
        self.mark();
        if let Some(socket) = &self.socket {
            if self.out.is_empty() {
                return Ok(());
            }
            // SAFETY: on the JS thread, inside a napi call (a socket lane is only sent on and
            // fed from napi calls).
            let written = unsafe { call_write(self.env, socket.write, &self.out) };
            self.out.clear();
            return written.map_err(|e| io::Error::other(e.reason));
        }
        let want = match &mut self.tls {
            None => {
                let mut stream = connected(&self.stream)?;
                let mut written = 0;
                while written < self.out.len() {
                    match stream.write(&self.out[written..]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                self.out.drain(..written);
                !self.out.is_empty()
            }
            Some(tls) => {
                let mut stream = connected(&self.stream)?;
                let mut taken = 0;
                loop {
                    let before = taken;
                    // The session takes plaintext up to its buffer limit; what it cannot take
                    // waits in `out` until its records are written.
                    while taken < self.out.len() {
                        match tls.writer().write(&self.out[taken..]) {
                            Ok(0) => break,
                            Ok(n) => taken += n,
                            Err(e) => return Err(e),
                        }
                    }
                    let mut blocked = false;
                    let mut wrote = false;
                    while tls.wants_write() {
                        match tls.write_tls(&mut stream) {
                            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                            Ok(_) => wrote = true,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                blocked = true;
                                break;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if blocked || taken == self.out.len() {
                        break;
                    }
                    if taken == before && !wrote {
                        // Neither took nor wrote anything: the session is closed for writing.
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                }
                self.out.drain(..taken);
                !self.out.is_empty() || tls.wants_write()
            }
        };
        if want != self.writable {
            self.writable = want;
            let events = if want {
                UV_READABLE | UV_WRITABLE
            } else {
                UV_READABLE
            };
            let uv = uv().expect("a lane exists only with libuv");
            // SAFETY: the lane's live poll handle (not shut: `shut` closes it and nothing
            // flushes after).
            unsafe { (uv.poll_start)(self.poll, events, on_poll) };
        }
        Ok(())
    }

    /// Reads what the socket has and frames the replies: each settles the oldest read sent.
    /// What was answered before a failure is answered still; the failure is returned with it.
    pub(super) fn receive(&mut self) -> (Vec<(Sent, Framed)>, Option<String>) {
        let failure = if self.tls.is_some() {
            self.receive_tls()
        } else {
            self.receive_plain()
        };
        self.frame_input(failure)
    }

    /// Reads what the socket has into `input`; a failure, if it failed.
    pub(super) fn receive_plain(&mut self) -> Option<String> {
        loop {
            if self.input.capacity() - self.input.len() < 4096 {
                self.input.reserve(16 * 1024);
            }
            let spare = self.input.capacity() - self.input.len();
            let stream = match connected(&self.stream) {
                Ok(stream) => stream,
                Err(e) => return Some(format!("Redis read lane failed: {e}")),
            };
            match read_into_spare(stream, &mut self.input) {
                Ok(0) => return Some("Redis closed the read lane".to_string()),
                // Short of the space given: the socket is drained for now.
                Ok(n) if n < spare => return None,
                Ok(_) => {}
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return None,
                    io::ErrorKind::Interrupted => {}
                    _ => return Some(format!("Redis read lane failed: {e}")),
                },
            }
        }
    }

    /// Reads the records the socket has into the TLS session, and its plaintext into `input`
    /// (replies that arrived are delivered even when a failure follows them). A failure, if any.
    pub(super) fn receive_tls(&mut self) -> Option<String> {
        use std::io::BufRead;
        let tls = self.tls.as_mut()?;
        let mut stream = match connected(&self.stream) {
            Ok(stream) => stream,
            Err(e) => return Some(format!("Redis read lane failed: {e}")),
        };
        loop {
            let mut failure = None;
            let mut drained = false;
            match tls.read_tls(&mut stream) {
                // The TCP end: the reader below says whether TLS closed cleanly first.
                Ok(0) => drained = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => failure = Some(format!("Redis read lane failed: {e}")),
            }
            if let Err(e) = tls.process_new_packets() {
                failure.get_or_insert_with(|| format!("Redis read lane failed (TLS): {e}"));
            }
            loop {
                let mut reader = tls.reader();
                match reader.fill_buf() {
                    Ok([]) => {
                        failure.get_or_insert_with(|| "Redis closed the read lane".to_string());
                        break;
                    }
                    Ok(chunk) => {
                        let n = chunk.len();
                        self.input.extend_from_slice(chunk);
                        reader.consume(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        failure.get_or_insert_with(|| format!("Redis read lane failed: {e}"));
                        break;
                    }
                }
            }
            if failure.is_some() {
                return failure;
            }
            if drained {
                break;
            }
        }
        // The session may have something to say back (a key update): written with the requests.
        if tls.wants_write() {
            if let Err(e) = self.flush() {
                return Some(format!("Redis read lane failed: {e}"));
            }
        }
        None
    }

    pub(super) fn arm_timer(&mut self) {
        // A socket lane's timer is `lib/lane.js`'s, armed as it writes (see `lane_timer`).
        if self.timer_armed || self.shut || self.socket.is_some() {
            return;
        }
        let Some(first) = self.sent.front() else {
            return;
        };
        let left = first.deadline.saturating_duration_since(Instant::now());
        self.timer_armed = true;
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: the lane's live timer handle; +1 ms so it fires after the deadline.
        unsafe { (uv.timer_start)(self.timer, on_timer, left.as_millis() as u64 + 1, 0) };
    }

    pub(super) fn update_ref(&mut self) {
        // A socket lane's socket is held by `lib/lane.js` while it writes, let go when
        // `lane_data` says no read is left in flight.
        if self.socket.is_some() {
            return;
        }
        let want = !self.sent.is_empty() && !self.shut;
        if want == self.refd {
            return;
        }
        self.refd = want;
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: the lane's poll handle, live until its close callback.
        unsafe {
            if want {
                (uv.ref_)(self.poll)
            } else {
                (uv.unref)(self.poll)
            }
        }
    }
}

/// The loop's callback: the socket is readable (or writable, or failed).
pub(super) unsafe extern "C" fn on_poll(handle: *mut c_void, status: c_int, events: c_int) {
    // SAFETY: the handle's data is the lane's Rc until `on_close_poll`, and libuv calls no
    // callback of a closing handle.
    let Some(lane) = (unsafe { lane_of(handle) }) else {
        return;
    };
    let (answered, failure) = {
        let mut l = lane.borrow_mut();
        if l.shut {
            return;
        }
        if status < 0 {
            (
                Vec::new(),
                Some(format!("Redis read lane failed (libuv status {status})")),
            )
        } else {
            let flushed = if events & UV_WRITABLE != 0 {
                l.flush()
                    .map_err(|e| format!("Redis read lane failed: {e}"))
            } else {
                Ok(())
            };
            match flushed {
                Ok(()) if events & UV_READABLE != 0 => l.receive(),
                Ok(()) => (Vec::new(), None),
                Err(e) => (Vec::new(), Some(e)),
            }
        }
    };
    deliver(&lane, answered, failure);
}

/// Settles the reads `receive` answered, writes the reads their continuations sent, and shuts
/// the lane if it failed.
pub(super) fn deliver(
    lane: &Rc<RefCell<Lane>>,
    answered: Vec<(Sent, Framed)>,
    failure: Option<String>,
) {
    if !answered.is_empty() {
        let (env, tier) = {
            let l = lane.borrow();
            (l.env, l.tier.clone())
        };
        // Reads the settled promises' continuations ask for are written together, after them.
        BATCH.with_borrow_mut(|b| *b = Some(Vec::new()));
        // SAFETY: on the JS thread, in the loop's callback, outside any napi call.
        unsafe {
            in_callback_scope(env, || {
                for (s, read) in answered {
                    s.answer(env, &tier, Some(read));
                }
            })
        };
        let batched = BATCH.with_borrow_mut(Option::take).unwrap_or_default();
        for other in batched {
            let flushed = {
                let mut l = other.borrow_mut();
                if l.shut || l.writable {
                    Ok(())
                } else {
                    l.flush()
                }
            };
            if let Err(e) = flushed {
                Lane::shut(
                    &other,
                    Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
                );
            }
        }
    }
    if let Some(why) = failure {
        Lane::shut(lane, Some(Failure::Lost(why)));
    }
}

/// The timer's callback: the oldest read in flight may have outlived the command timeout.
///
/// libuv runs timers before it polls for I/O, so after the JS thread was blocked (a GC pause,
/// a long synchronous task) this fires before the poll callback that would read the replies
/// waiting in the socket. They are read here first: a reply that arrived in time is used, and
/// only a read still unanswered then has timed out.
pub(super) unsafe extern "C" fn on_timer(handle: *mut c_void) {
    // SAFETY: as in `on_poll`.
    let Some(lane) = (unsafe { lane_of(handle) }) else {
        return;
    };
    let overdue = {
        let l = lane.borrow();
        !l.shut && l.sent.front().is_some_and(|f| Instant::now() >= f.deadline)
    };
    if overdue {
        let (answered, failure) = lane.borrow_mut().receive();
        deliver(&lane, answered, failure);
    }
    let expired = {
        let mut l = lane.borrow_mut();
        l.timer_armed = false;
        if l.shut {
            return;
        }
        match l.sent.front() {
            Some(first) if Instant::now() >= first.deadline => true,
            _ => {
                l.arm_timer();
                false
            }
        }
    };
    if expired {
        let timeout = lane.borrow().tier.lane_timeout();
        Lane::shut(
            &lane,
            Some(Failure::TimedOut(format!(
                "Redis get timed out after {timeout:?} (read lane)"
            ))),
        );
    }
}

/// The lane a handle's data names (a new reference).
pub(super) unsafe fn lane_of(handle: *mut c_void) -> Option<Rc<RefCell<Lane>>> {
    let uv = uv()?;
    // SAFETY: the caller's handle is live; its data is an Rc leaked by `install`.
    let data = unsafe { (uv.get_data)(handle) } as *const RefCell<Lane>;
    if data.is_null() {
        return None;
    }
    // SAFETY: the leaked Rc is alive until the handle's close callback.
    unsafe {
        Rc::increment_strong_count(data);
        Some(Rc::from_raw(data))
    }
}

pub(super) unsafe extern "C" fn on_close_poll(handle: *mut c_void) {
    // The socket closes with its poll handle, not with the last reference to the lane: the
    // engine's slot keeps a shut lane until its next read, which may never come (a cache that
    // serves everything in process), and a server flooding the lane would be left open. libuv
    // watches the fd no more once the handle has closed.
    // SAFETY: the handle's data is still the lane's Rc (taken back just below).
    if let Some(lane) = unsafe { lane_of(handle) } {
        if let Ok(mut l) = lane.try_borrow_mut() {
            l.stream = None;
            l.tls = None;
            l.input = Vec::new();
        }
    }
    // SAFETY: the poll handle closed; nothing refers to it any more.
    unsafe { release_handle(handle, UV_POLL) }
}

pub(super) unsafe extern "C" fn on_close_timer(handle: *mut c_void) {
    // SAFETY: as in `on_close_poll`.
    unsafe { release_handle(handle, UV_TIMER) }
}

pub(super) unsafe fn release_handle(handle: *mut c_void, kind: c_int) {
    let Some(uv) = uv() else { return };
    // SAFETY: a closed handle whose data is the Rc leaked by `install`, taken back once.
    unsafe {
        let data = (uv.get_data)(handle) as *const RefCell<Lane>;
        if !data.is_null() {
            drop(Rc::from_raw(data));
        }
        uv.free(handle, kind);
    }
}

/// Runs `f` (which settles promises) the way Node runs a callback: in a handle scope and a
/// callback scope, whose end runs the microtasks the settlements queued.
pub(super) unsafe fn in_callback_scope(env: sys::napi_env, f: impl FnOnce()) {
    let Some(context) = async_context(env) else {
        return;
    };
    let mut handles = ptr::null_mut();
    // SAFETY: on the JS thread with its live environment, outside any other napi call; scopes
    // are closed in reverse order.
    unsafe {
        if sys::napi_open_handle_scope(env, &mut handles) != sys::Status::napi_ok {
            return;
        }
        let mut resource = ptr::null_mut();
        let mut scope = ptr::null_mut();
        if sys::napi_create_object(env, &mut resource) == sys::Status::napi_ok
            && sys::napi_open_callback_scope(env, resource, context, &mut scope)
                == sys::Status::napi_ok
        {
            f();
            sys::napi_close_callback_scope(env, scope);
        }
        sys::napi_close_handle_scope(env, handles);
    }
}

pub(super) struct AsyncContext(sys::napi_async_context);

thread_local! {
    /// While the lane's callback settles promises: the lanes that reads were queued on
    /// meanwhile, written once the callback's microtasks have run (one write for many reads).
    pub(super) static BATCH: RefCell<Option<Vec<Rc<RefCell<Lane>>>>> = const { RefCell::new(None) };
    /// This JS thread's async context for the lane's callbacks, made once.
    pub(super) static CONTEXT: RefCell<Option<AsyncContext>> = const { RefCell::new(None) };
    /// Lanes open on this thread, closed when its environment is torn down.
    pub(super) static OPEN: RefCell<Option<Vec<Weak<RefCell<Lane>>>>> = const { RefCell::new(None) };
}

/// This thread's async context, made on first use (inside a napi call).
pub(super) fn async_context(env: sys::napi_env) -> Option<sys::napi_async_context> {
    CONTEXT.with_borrow_mut(|c| {
        if c.is_none() {
            let name = "stampede-cache:redis-lane";
            let mut js_name = ptr::null_mut();
            let mut context = ptr::null_mut();
            // SAFETY: on the JS thread, in a handle scope; the name is valid UTF-8 of the
            // length given; no resource object (Node makes one).
            let ok = unsafe {
                sys::napi_create_string_utf8(
                    env,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    &mut js_name,
                ) == sys::Status::napi_ok
                    && sys::napi_async_init(env, ptr::null_mut(), js_name, &mut context)
                        == sys::Status::napi_ok
            };
            if !ok {
                return None;
            }
            *c = Some(AsyncContext(context));
        }
        c.as_ref().map(|c| c.0)
    })
}

/// Closes this thread's lanes when its environment goes (a worker thread ending): a loop may
/// not be closed with handles still open.
pub(super) fn register_for_teardown(env: sys::napi_env, lane: &Rc<RefCell<Lane>>) {
    OPEN.with_borrow_mut(|open| {
        let first = open.is_none();
        let list = open.get_or_insert_with(Vec::new);
        list.retain(|l| l.strong_count() > 0);
        list.push(Rc::downgrade(lane));
        if first {
            // SAFETY: on the JS thread of `env`; the hook takes no data.
            unsafe { sys::napi_add_env_cleanup_hook(env, Some(teardown), ptr::null_mut()) };
        }
    });
}

pub(super) unsafe extern "C" fn teardown(_arg: *mut c_void) {
    let lanes = OPEN
        .try_with(|open| open.borrow_mut().take())
        .ok()
        .flatten()
        .unwrap_or_default();
    let _ = CONTEXT.try_with(|c| c.borrow_mut().take());
    for lane in lanes.iter().filter_map(Weak::upgrade) {
        // The environment is going: the reads in flight go with it, unsettled.
        let mut l = lane.borrow_mut();
        if l.shut {
            continue;
        }
        l.shut = true;
        l.sent.clear();
        l.close_handles();
    }
}

// ---- libuv, as the host process exports it ----

pub(super) const UV_POLL: c_int = 8;
pub(super) const UV_TIMER: c_int = 13;
pub(super) const UV_READABLE: c_int = 1;
pub(super) const UV_WRITABLE: c_int = 2;

pub(super) type PollCb = unsafe extern "C" fn(*mut c_void, c_int, c_int);
pub(super) type TimerCb = unsafe extern "C" fn(*mut c_void);
pub(super) type CloseCb = Option<unsafe extern "C" fn(*mut c_void)>;

pub(super) type HandleSizeFn = unsafe extern "C" fn(c_int) -> usize;
pub(super) type PollInitFn = unsafe extern "C" fn(*mut c_void, *mut c_void, c_int) -> c_int;
pub(super) type PollStartFn = unsafe extern "C" fn(*mut c_void, c_int, PollCb) -> c_int;
pub(super) type TimerInitFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
pub(super) type TimerStartFn = unsafe extern "C" fn(*mut c_void, TimerCb, u64, u64) -> c_int;
pub(super) type CloseFn = unsafe extern "C" fn(*mut c_void, CloseCb);
pub(super) type HandleFn = unsafe extern "C" fn(*mut c_void);
pub(super) type SetDataFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
pub(super) type GetDataFn = unsafe extern "C" fn(*const c_void) -> *mut c_void;

/// The libuv functions the lane uses (stable since libuv 1.19; Node 20 ships 1.46).
pub(super) struct Uv {
    handle_size: HandleSizeFn,
    poll_init: PollInitFn,
    poll_start: PollStartFn,
    timer_init: TimerInitFn,
    timer_start: TimerStartFn,
    close: CloseFn,
    ref_: HandleFn,
    unref: HandleFn,
    set_data: SetDataFn,
    get_data: GetDataFn,
}

impl Uv {
    pub(super) fn layout(&self, kind: c_int) -> std::alloc::Layout {
        // SAFETY: uv_handle_size only reads a table.
        let size = unsafe { (self.handle_size)(kind) };
        std::alloc::Layout::from_size_align(size.max(8), 16).expect("a handle's size")
    }

    pub(super) fn alloc(&self, kind: c_int) -> *mut c_void {
        let layout = self.layout(kind);
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        p.cast()
    }

    /// SAFETY: `p` came from `alloc(kind)` and libuv no longer refers to it.
    pub(super) unsafe fn free(&self, p: *mut c_void, kind: c_int) {
        // SAFETY: the caller's promise.
        unsafe { std::alloc::dealloc(p.cast(), self.layout(kind)) }
    }
}

/// The lane's socket, unless it closed with its poll handle (nothing reads or writes a shut lane).
pub(super) fn connected(stream: &Option<LaneStream>) -> io::Result<&LaneStream> {
    stream
        .as_ref()
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
}

/// Reads from the socket into `buf`'s spare capacity (not zeroed first), extending it.
#[cfg(unix)]
pub(super) fn read_into_spare(stream: &LaneStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is writable memory of `spare.len()` bytes owned by `buf`; recv writes at
    // most that many and says how many it wrote, and only those become part of `buf`.
    unsafe {
        let n = libc::recv(raw_fd(stream), spare.as_mut_ptr().cast(), spare.len(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        buf.set_len(buf.len() + n);
        Ok(n)
    }
}

#[cfg(not(unix))]
pub(super) fn read_into_spare(_stream: &LaneStream, _buf: &mut Vec<u8>) -> io::Result<usize> {
    unreachable!("no lane without libuv's Unix poll")
}

#[cfg(unix)]
pub(super) fn raw_fd(stream: &LaneStream) -> c_int {
    std::os::fd::AsRawFd::as_raw_fd(stream)
}

#[cfg(not(unix))]
pub(super) fn raw_fd(_stream: &LaneStream) -> c_int {
    unreachable!("no lane without libuv's Unix poll")
}

#[cfg(unix)]
pub(super) fn uv() -> Option<&'static Uv> {
    static UV: std::sync::OnceLock<Option<Uv>> = std::sync::OnceLock::new();
    UV.get_or_init(|| {
        // For side-by-side measurements (`STAMPEDE_CACHE_NO_LANE=1 node bench/redis-read.js`).
        if std::env::var_os("STAMPEDE_CACHE_NO_LANE").is_some_and(|v| v == "1") {
            return None;
        }
        fn find(name: &std::ffi::CStr) -> Option<*mut c_void> {
            // SAFETY: dlsym with RTLD_DEFAULT searches the process's global symbols.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        }
        // SAFETY: each symbol is libuv's function of that name, whose C signature the field's
        // type spells (uv.h).
        unsafe {
            macro_rules! sym {
                ($name:literal, $t:ty) => {
                    std::mem::transmute::<*mut c_void, $t>(find($name)?)
                };
            }
            Some(Uv {
                handle_size: sym!(c"uv_handle_size", HandleSizeFn),
                poll_init: sym!(c"uv_poll_init", PollInitFn),
                poll_start: sym!(c"uv_poll_start", PollStartFn),
                timer_init: sym!(c"uv_timer_init", TimerInitFn),
                timer_start: sym!(c"uv_timer_start", TimerStartFn),
                close: sym!(c"uv_close", CloseFn),
                ref_: sym!(c"uv_ref", HandleFn),
                unref: sym!(c"uv_unref", HandleFn),
                set_data: sym!(c"uv_handle_set_data", SetDataFn),
                get_data: sym!(c"uv_handle_get_data", GetDataFn),
            })
        }
    })
    .as_ref()
}

#[cfg(not(unix))]
pub(super) fn uv() -> Option<&'static Uv> {
    None
}
