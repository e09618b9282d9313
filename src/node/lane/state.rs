//! A lane's reads: sending them, the alignment marks after them, framing their replies and
//! delivering them once proven, and shutting the lane (its reads asked again elsewhere).

use super::*;

impl Lane {
    /// A lane with nothing sent, and no socket yet (`install` and `connect_socket` give it one).
    pub(super) fn idle(env: sys::napi_env, tier: Arc<RedisTier>, replacement: u64) -> Lane {
        Lane {
            env,
            tier,
            socket: None,
            stream: None,
            tls: None,
            replacement,
            poll: ptr::null_mut(),
            timer: ptr::null_mut(),
            out: Vec::new(),
            input: Vec::with_capacity(16 * 1024),
            sent: VecDeque::new(),
            framed: VecDeque::new(),
            marks: VecDeque::new(),
            reads_written: 0,
            reads_delivered: 0,
            next_mark: 0,
            // The first reads are marked.
            rule: MarkRule::new(Instant::now()),
            unproven: false,
            writable: false,
            refd: false,
            timer_armed: false,
            shut: false,
        }
    }

    /// Whether a batch read (`Asked::Many`) is in flight on the lane.
    pub fn carrying_batch(&self) -> bool {
        self.sent
            .iter()
            .any(|s| matches!(s.asked, Asked::Many { .. }))
    }

    pub(super) fn send(lane: &Rc<RefCell<Lane>>, sent: Sent) {
        // A socket lane does not join the libuv lanes' batch: that is written after a libuv
        // callback, outside any napi call, where the socket's `write` cannot be called. In a
        // hold (see `HOLDING`) it writes its first read at once, the rest at the release.
        let socket = lane.borrow().socket.is_some();
        let held = socket
            && HOLDING.with_borrow_mut(|holding| match holding {
                Some(lanes) if lanes.iter().any(|l| Rc::ptr_eq(l, lane)) => true,
                Some(lanes) => {
                    lanes.push(lane.clone());
                    false
                }
                None => false,
            });
        let batching = !socket
            && BATCH.with_borrow_mut(|batch| match batch {
                Some(lanes) => {
                    if !lanes.iter().any(|l| Rc::ptr_eq(l, lane)) {
                        lanes.push(lane.clone());
                    }
                    true
                }
                None => false,
            });
        let failed = {
            let mut l = lane.borrow_mut();
            let l = &mut *l;
            match &sent.asked {
                Asked::One { get, .. } => l.tier.lane_request(&get.key, &mut l.out),
                Asked::Many { keys, .. } => l.tier.lane_request_many(keys, &mut l.out),
            }
            l.sent.push_back(sent);
            l.reads_written += 1;
            let failed = if l.writable || batching || held {
                Ok(())
            } else {
                l.flush()
            };
            l.arm_timer();
            l.update_ref();
            failed
        };
        if let Err(e) = failed {
            Lane::shut(
                lane,
                Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
            );
        }
    }

    /// Ends the batch of reads written since the last mark with a mark of its own (an ECHO of
    /// a sequence number), when one is due. Replies are matched to reads by order only; the
    /// mark's echo, found exactly where it must be, proves that none was added or lost before it
    /// (an extra reply of the same key, which the envelope's key mark cannot tell, included).
    ///
    /// Marks are amortised (`store::redis::lane::marks` has the rule and why it is safe): a
    /// batch goes without one unless it reads a key this process wrote since the last mark,
    /// something was heard since, or 16 reads or 50 ms passed; its replies are then delivered as
    /// they come, and the next mark proves them after the fact. A shift is caught at the latest
    /// by the next mark, and then every in-process copy is dropped, so nothing the lane
    /// delivered unproven stays in process.
    pub(super) fn mark(&mut self) {
        if self.shut {
            return;
        }
        let seen = self.tier.lane_seen();
        // The reads written since the last decision are the newest sent.
        let undecided = self.rule.undecided(self.reads_written);
        let undecided = self.sent.iter().rev().take(undecided);
        let keys = undecided.flat_map(|s| s.keys());
        if self.rule.decide(self.reads_written, keys, &seen) != Some(true) {
            return;
        }
        let seq = self.next_mark;
        self.next_mark += 1;
        self.tier.lane_mark(seq, &mut self.out);
        self.marks.push_back((self.reads_written, seq));
    }

    /// Whether the read at `position` (counted since the lane opened) is followed by a mark,
    /// so its reply waits for the mark's proof; one that is not is delivered as it comes.
    pub(super) fn marked(&self, position: u64) -> bool {
        self.marks
            .back()
            .is_some_and(|&(before, _)| before > position)
    }

    /// Frames the replies in `input`: each settles the oldest read sent, once its batch's mark
    /// proves it aligned. `failure`: the read's, returned unless framing finds a worse one.
    pub(super) fn frame_input(
        &mut self,
        mut failure: Option<String>,
    ) -> (Vec<(Sent, Framed)>, Option<String>) {
        let mut answered = Vec::new();
        let mut at = 0;
        // Failures of the replies' framing below: the lane is out of step.
        let read_failure = failure.is_some();
        while at < self.input.len() {
            let position = self.reads_delivered + self.framed.len() as u64;
            let mark = self
                .marks
                .front()
                .filter(|&&(before, _)| before == position)
                .map(|&(_, seq)| seq);
            let sent = self.sent.get(self.framed.len());
            let framed = match (mark, sent.map(|s| &s.asked)) {
                (
                    None,
                    Some(Asked::Many {
                        keys,
                        stamps,
                        count,
                        ..
                    }),
                ) => {
                    // A batch read: its MGET's reply, one element per key.
                    let (values, len) = match frame_values(&self.input[at..], keys.len()) {
                        Ok(Some(framed)) => framed,
                        Ok(None) => break,
                        Err(_) => {
                            failure = Some("Redis answered the read lane out of protocol".into());
                            break;
                        }
                    };
                    match self.tier.lane_answer_many(keys, stamps, values, *count) {
                        Ok(reads) => (Framed::Many(reads), len),
                        Err(why) => {
                            // Not this batch's answer: every read not delivered is asked again
                            // when the lane shuts.
                            failure = Some(why.to_string());
                            break;
                        }
                    }
                }
                (mark, sent) => {
                    let (reply, len) = match frame(&self.input[at..]) {
                        Ok(Some(framed)) => framed,
                        Ok(None) => break,
                        Err(_) => {
                            failure = Some("Redis answered the read lane out of protocol".into());
                            break;
                        }
                    };
                    if let Some(seq) = mark {
                        // This reply must be the mark's echo; then the batch before it is
                        // aligned.
                        if !self.tier.lane_mark_answered(seq, reply) {
                            failure = Some(
                                "Redis's replies on the read lane are out of step with its requests"
                                    .into(),
                            );
                            break;
                        }
                        self.marks.pop_front();
                        while let Some(read) = self.framed.pop_front() {
                            let sent = self.sent.pop_front().expect("a framed read was sent");
                            answered.push((sent, read));
                        }
                        self.reads_delivered = position;
                        // Everything delivered so far came before this mark: proven.
                        self.unproven = false;
                        at += len;
                        continue;
                    }
                    let Some(Asked::One { get, .. }) = sent else {
                        failure = Some("Redis answered a read the lane did not send".into());
                        break;
                    };
                    let read = self
                        .tier
                        .lane_answer(&get.key, get.stamp, reply, get.ask.counted());
                    if let LaneRead::Misaligned(why) = read {
                        // Not this read's answer: every read not delivered is asked again when
                        // the lane shuts.
                        failure = Some(why.to_string());
                        break;
                    }
                    (Framed::One(read), len)
                }
            };
            let (read, len) = framed;
            at += len;
            if self.framed.is_empty() && !self.marked(position) {
                // No mark after it (see `mark`): delivered now, proven by the next mark.
                let sent = self.sent.pop_front().expect("a framed read was sent");
                answered.push((sent, read));
                self.reads_delivered = position + 1;
                self.unproven = true;
                continue;
            }
            self.framed.push_back(read);
        }
        if failure.is_some() && !read_failure && self.unproven {
            // Out of step after delivering replies no mark proved: none of them stays in process.
            self.tier.lane_shifted_unproven();
            self.unproven = false;
        }
        self.input.drain(..at);
        if self.input.is_empty() && self.input.capacity() > 1024 * 1024 {
            // A large value passed: give its buffer back.
            self.input = Vec::with_capacity(16 * 1024);
        }
        self.update_ref();
        (answered, failure)
    }

    /// Closes the lane: its handles close (the socket with them), and the reads it carries are
    /// asked again on the command connection. `failure`: why, when it failed.
    pub(super) fn shut(lane: &Rc<RefCell<Lane>>, failure: Option<Failure>) {
        let (tier, env, left, socket) = {
            let mut l = lane.borrow_mut();
            if l.shut {
                return;
            }
            l.shut = true;
            l.refd = false;
            let socket = l.socket.take();
            if socket.is_none() {
                l.close_handles();
            }
            l.input = Vec::new();
            // Framed but not proven aligned: asked again, like the rest.
            l.framed.clear();
            let left: Vec<Sent> = l.sent.drain(..).collect();
            (l.tier.clone(), l.env, left, socket)
        };
        if let Some(socket) = socket {
            SOCKET_LANES.with_borrow_mut(|lanes| lanes.remove(&socket.id));
            if FINALIZING.get() {
                // A cache collected without close(): no JS may run in a finalizer. The socket
                // is ended at this thread's next lane call (and a chunk for it ends it at once).
                UNENDED.with_borrow_mut(|u| u.push(socket));
            } else {
                // SAFETY: a socket lane is shut on the JS thread inside a napi call (a read, a
                // chunk, its timer, close()); the references are this lane's, released once.
                unsafe { socket.end(env) };
            }
        }
        let key = left.first().and_then(Sent::key);
        match failure {
            Some(Failure::Lost(why)) => tier.lane_lost(key, why),
            Some(Failure::TimedOut(why)) => tier.lane_timed_out(key, why),
            None => {}
        }
        for s in left {
            s.answer(env, &tier, None);
        }
    }
}
