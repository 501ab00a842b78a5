//! The scheduler: owns the connections, the request queue and the engine.
//! Up to the engine's [`Engine::max_sequences`] requests run together (each
//! engine step advances all of them), the rest wait in arrival order; a
//! `bench` waits until nothing runs. Transports feed it bytes and connection
//! events and call [`Service::poll`] to advance work one engine step at a
//! time; everything is plain data, with no threads, no clock of its own and
//! no I/O.

use alloc::borrow::Cow;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

mod constraint;
mod intake;

use crate::active::Active;
use crate::calls::Calls;
use crate::codec::Codec;
pub use crate::connection::ConnId;
use crate::connection::{ConnState, Connection};
use crate::emit::{Deltas, Emitter, Mode};
use crate::engine::{
    BenchRequest, Clock, Engine, EngineError, EngineInfo, GenParams, SeqId, StepOut,
};
use crate::framing::Frame;
use kore_protocol::{
    parse_line, BenchEvent, DeltaEvent, DoneEvent, ErrorBody, ErrorCode, ErrorEvent, Finish, Id,
    InfoBody, InfoEvent, Request, Stats, TokenLogprob, TopLogprob, PROTOCOL_VERSION,
};

/// Limits of a service instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Longest request line in bytes (newline excluded).
    pub max_line_bytes: usize,
    /// Requests that may wait behind the running ones.
    pub queue_limit: usize,
    /// Open connections; more are answered `overloaded` and closed.
    pub max_connections: usize,
    /// Unsent response bytes per connection before it is dropped.
    pub max_output_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_line_bytes: 1 << 20,
            queue_limit: 64,
            max_connections: 256,
            max_output_bytes: 16 << 20,
        }
    }
}

/// Work waiting in the queue.
#[derive(Debug)]
enum JobKind {
    Generate {
        prompt: Vec<u32>,
        params: GenParams,
        mode: Mode,
        stop: Vec<String>,
        tools: Option<kore_grammar::ToolSet>,
    },
    Bench(BenchRequest),
}

#[derive(Debug)]
struct Job {
    conn: ConnId,
    id: Id,
    key: String,
    kind: JobKind,
}

/// The chat service: connections, queue, and the engine they share.
#[derive(Debug)]
pub struct Service<E, C: Codec, K> {
    engine: E,
    codec: C,
    clock: K,
    config: Config,
    info: EngineInfo,
    conns: BTreeMap<ConnId, Connection>,
    next_conn: u64,
    queue: VecDeque<Job>,
    active: BTreeMap<SeqId, Active<C::Decoder>>,
    next_seq: SeqId,
    max_active: usize,
    step_buf: Vec<StepOut>,
}

impl<E: Engine, C: Codec, K: Clock> Service<E, C, K> {
    /// A service driving `engine`, tokenizing with `codec`, timing with `clock`.
    pub fn new(engine: E, codec: C, clock: K, config: Config) -> Self {
        let info = engine.info();
        let max_active = engine.max_sequences().max(1);
        Self {
            engine,
            codec,
            clock,
            config,
            info,
            conns: BTreeMap::new(),
            next_conn: 0,
            queue: VecDeque::new(),
            active: BTreeMap::new(),
            next_seq: 0,
            max_active,
            step_buf: Vec::new(),
        }
    }

    /// The engine (for inspection in tests).
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// The engine, e.g. to hand it checkpoint files between requests.
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }

    /// Model facts as reported by the engine.
    pub fn engine_info(&self) -> &EngineInfo {
        &self.info
    }

    /// The limits in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Registers a new connection. Past `max_connections` it is answered
    /// with an `overloaded` error and marked to close once that is sent.
    pub fn open(&mut self) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        let mut conn = Connection::new(self.config.max_line_bytes, self.config.max_output_bytes);
        if self.conns.len() >= self.config.max_connections {
            let message = format!(
                "too many connections (limit {}); retry later",
                self.config.max_connections
            );
            conn.send(&ErrorEvent {
                id: Cow::Borrowed(&Id::NULL),
                error: ErrorBody { code: ErrorCode::Overloaded, message: message.into() },
            });
            conn.drain();
        }
        self.conns.insert(id, conn);
        id
    }

    /// Bytes received on `conn`; complete lines are handled at once.
    pub fn on_bytes(&mut self, conn: ConnId, bytes: &[u8]) {
        let mut frames = Vec::new();
        match self.conns.get_mut(&conn) {
            Some(c) => c.on_bytes(bytes, &mut frames),
            None => return,
        }
        self.handle_frames(conn, frames);
    }

    /// The client closed its sending side; its requests still complete.
    pub fn on_eof(&mut self, conn: ConnId) {
        let mut frames = Vec::new();
        match self.conns.get_mut(&conn) {
            Some(c) => c.on_eof(&mut frames),
            None => return,
        }
        self.handle_frames(conn, frames);
    }

    /// The connection is gone: its queued and running requests are cancelled
    /// silently and its state is freed.
    pub fn on_closed(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.drop_requests_of(conn);
    }

    /// Forgets every queued and running request of `conn`, silently.
    fn drop_requests_of(&mut self, conn: ConnId) {
        self.queue.retain(|j| j.conn != conn);
        let gone: Vec<SeqId> =
            self.active.iter().filter(|(_, a)| a.conn == conn).map(|(s, _)| *s).collect();
        for seq in gone {
            self.active.remove(&seq);
            self.engine.finish(seq);
        }
    }

    /// Unsent response bytes of `conn` (empty if unknown).
    pub fn output(&self, conn: ConnId) -> &[u8] {
        self.conns.get(&conn).map_or(&[], |c| c.output())
    }

    /// Marks `n` bytes of `conn`'s output as sent.
    pub fn consume_output(&mut self, conn: ConnId, n: usize) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.consume(n);
        }
    }

    /// Takes all unsent output of `conn`.
    pub fn take_output(&mut self, conn: ConnId) -> Vec<u8> {
        self.conns.get_mut(&conn).map_or_else(Vec::new, Connection::take_output)
    }

    /// Whether the transport should close `conn` now (after sending its
    /// output), then call [`Service::on_closed`]. Unknown ids are closed.
    pub fn should_close(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_none_or(Connection::should_close)
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Requests waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether a request is being generated.
    pub fn busy(&self) -> bool {
        !self.active.is_empty()
    }

    /// Requests being generated now.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// Whether [`Service::poll`] has something to do.
    pub fn has_work(&self) -> bool {
        !self.active.is_empty() || !self.queue.is_empty()
    }

    /// Does one unit of work: starts queued requests while fewer than the
    /// engine's limit run (a queued `bench` only once nothing runs), then
    /// runs one engine step of every running request and sends what it
    /// produced. Returns whether more work remains.
    pub fn poll(&mut self) -> bool {
        self.admit_queued();
        if !self.active.is_empty() {
            self.step_active();
        }
        self.has_work()
    }

    /// Starts queued work in order while there is room.
    fn admit_queued(&mut self) {
        while self.active.len() < self.max_active {
            let bench_next =
                matches!(self.queue.front(), Some(Job { kind: JobKind::Bench(_), .. }));
            if bench_next && !self.active.is_empty() {
                return;
            }
            if let Some(Job { kind: JobKind::Generate { prompt, params, .. }, .. }) =
                self.queue.front()
            {
                if !self.active.is_empty() && !self.engine.has_room(prompt.len(), params.max_tokens)
                {
                    return;
                }
            }
            let Some(job) = self.queue.pop_front() else { return };
            self.start_job(job);
            if bench_next {
                return;
            }
        }
    }

    fn handle_frames(&mut self, conn: ConnId, frames: Vec<Frame>) {
        for frame in frames {
            match frame {
                Frame::Line(line) => self.handle_line(conn, &line),
                Frame::TooLong { seen } => {
                    let message = format!(
                        "request line exceeds {} bytes (saw {seen} before giving up); \
                         it was skipped up to its newline",
                        self.config.max_line_bytes
                    );
                    self.send_error(conn, &Id::NULL, ErrorCode::LineTooLong, &message);
                }
            }
        }
        self.reap_killed(conn);
    }

    fn handle_line(&mut self, conn: ConnId, line: &[u8]) {
        match parse_line(line) {
            Ok(None) => {}
            Ok(Some(Request::Generate(g))) => self.handle_generate(conn, g),
            Ok(Some(Request::Cancel(target))) => self.cancel(conn, &target),
            Ok(Some(Request::Info(id))) => self.send_info(conn, &id),
            Ok(Some(Request::Bench(id, b))) => self.enqueue(conn, id, JobKind::Bench(b)),
            Err(e) => self.send_error(conn, &e.id, e.code, &e.message),
        }
    }

    fn cancel(&mut self, conn: ConnId, target: &Id) {
        let key = target.key();
        if let Some(pos) = self.queue.iter().position(|j| j.conn == conn && j.key == key) {
            if let Some(job) = self.queue.remove(pos) {
                let prompt_tokens = match &job.kind {
                    JobKind::Generate { prompt, .. } => prompt.len() as u32,
                    JobKind::Bench(_) => 0,
                };
                let chat = matches!(job.kind, JobKind::Generate { mode: Mode::Chat { .. }, .. });
                let stats = Stats {
                    prompt_tokens,
                    context_used: prompt_tokens,
                    context_limit: self.info.context_limit,
                    ..Stats::default()
                };
                let done = DoneEvent {
                    id: Cow::Borrowed(&job.id),
                    done: true,
                    finish: Finish::Cancelled,
                    token_ids: Cow::Borrowed(&[]),
                    text: Cow::Borrowed(""),
                    thinking: chat.then_some(Cow::Borrowed("")),
                    stats: Cow::Borrowed(&stats),
                    tool_calls: Cow::Borrowed(&[]),
                    logprobs: None,
                    stop_sequence: None,
                };
                self.send(conn, &done);
                self.release(conn, &job.key);
            }
            return;
        }
        let running = self.active.iter().find(|(_, a)| a.conn == conn && a.key == key);
        if let Some((&seq, _)) = running {
            self.end_active(seq, Finish::Cancelled, Deltas::new());
        }
    }

    fn send_info(&mut self, conn: ConnId, id: &Id) {
        let info = InfoBody {
            model: self.info.model.clone(),
            context_limit: self.info.context_limit,
            vocab_size: self.info.vocab_size,
            version: Cow::Borrowed(env!("CARGO_PKG_VERSION")),
            protocol: PROTOCOL_VERSION,
            scheduling: Cow::Borrowed(if self.max_active > 1 { "batched" } else { "fifo" }),
            max_active: self.max_active,
            active: self.active.len(),
            max_line_bytes: self.config.max_line_bytes,
            queue_limit: self.config.queue_limit,
            queued: self.queue.len(),
            busy: !self.active.is_empty(),
            connections: self.conns.len(),
            cache: self.engine.cache_info(),
        };
        self.send(conn, &InfoEvent { id: Cow::Borrowed(id), info: Cow::Borrowed(&info) });
    }

    fn start_job(&mut self, job: Job) {
        let (prompt, params, mode, stop, tools) = match job.kind {
            JobKind::Bench(b) => return self.run_bench(job.conn, &job.id, &job.key, &b),
            JobKind::Generate { prompt, params, mode, stop, tools } => {
                (prompt, params, mode, stop, tools)
            }
        };
        let t_start = self.clock.now_ns();
        let seq = self.next_seq;
        self.next_seq += 1;
        let cached_tokens = match self.engine.start(seq, &prompt, &params) {
            Ok(n) => n,
            Err(e) => {
                self.send_engine_error(job.conn, &job.id, &e);
                return self.release(job.conn, &job.key);
            }
        };
        let mut emitter = Emitter::new(self.codec.decoder(), mode, stop);
        if let Some(set) = tools {
            emitter = emitter.with_calls(Calls::new(set, format!("call_{seq}_")));
        }
        let active = Active {
            conn: job.conn,
            id: job.id,
            key: job.key,
            chat: matches!(mode, Mode::Chat { .. }),
            prompt_tokens: prompt.len() as u32,
            cached_tokens,
            cache_tier: None,
            max_tokens: params.max_tokens,
            emitter,
            tokens: Vec::new(),
            logprobs: params.logprobs.map(|_| Vec::new()),
            logprobs_sent: 0,
            t_start,
            t_first: None,
            t_last: t_start,
            decode_tokens: 0,
            decode_steps: 0,
        };
        self.active.insert(seq, active);
    }

    fn run_bench(&mut self, conn: ConnId, id: &Id, key: &str, b: &BenchRequest) {
        match self.engine.bench(b) {
            Ok(report) => self
                .send(conn, &BenchEvent { id: Cow::Borrowed(id), bench: Cow::Borrowed(&report) }),
            Err(e) => self.send_engine_error(conn, id, &e),
        }
        self.release(conn, key);
    }

    fn step_active(&mut self) {
        let mut outs = core::mem::take(&mut self.step_buf);
        outs.clear();
        self.engine.step(&mut outs);
        let now = self.clock.now_ns();
        for out in outs.drain(..) {
            match out.result {
                Ok(tokens) => {
                    self.take_logprobs(out.seq);
                    if let Some((finish, deltas)) = self.absorb(out.seq, &tokens, now) {
                        self.end_active(out.seq, finish, deltas);
                    }
                }
                Err(e) => {
                    if let Some(a) = self.active.remove(&out.seq) {
                        self.engine.finish(out.seq);
                        self.send_engine_error(a.conn, &a.id, &e);
                        self.release(a.conn, &a.key);
                    }
                }
            }
        }
        self.step_buf = outs;
    }

    /// Keeps the log-probabilities of `seq`'s new tokens, if it asked.
    fn take_logprobs(&mut self, seq: SeqId) {
        let wants = self.active.get(&seq).is_some_and(|a| a.logprobs.is_some());
        if !wants {
            return;
        }
        let taken = self.engine.take_logprobs(seq);
        let codec = &self.codec;
        let entry = |id: u32, logprob: f32| {
            let bytes = codec.token_bytes(id);
            let token = String::from_utf8_lossy(&bytes).into_owned();
            (token, bytes, id, logprob)
        };
        let Some(list) = self.active.get_mut(&seq).and_then(|a| a.logprobs.as_mut()) else {
            return;
        };
        for t in taken {
            let (token, bytes, id, logprob) = entry(t.token, t.logprob);
            let top = t
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let (token, bytes, id, logprob) = entry(id, logprob);
                    TopLogprob { id, token, bytes, logprob }
                })
                .collect();
            list.push(TokenLogprob { id, token, bytes, logprob, top });
        }
    }

    /// Takes one step's tokens into request `seq`, streams the text, and
    /// returns the finish reason (with unsent deltas) if the request ended.
    fn absorb(&mut self, seq: SeqId, tokens: &[u32], now: u64) -> Option<(Finish, Deltas)> {
        let stop_ids = self.codec.stop_ids();
        let a = self.active.get_mut(&seq)?;
        if tokens.is_empty() {
            return None;
        }
        let first = a.t_first.is_none();
        if first {
            a.t_first = Some(now);
        }
        a.t_last = now;
        let mut deltas = Deltas::new();
        let mut finish = None;
        let mut kept = 0u32;
        for &t in tokens {
            a.tokens.push(t);
            kept += 1;
            if stop_ids.contains(&t) || a.emitter.push(t, &mut deltas) {
                finish = Some(Finish::Stop);
            } else if a.tokens.len() as u32 >= a.max_tokens {
                finish = Some(Finish::Length);
            }
            if finish.is_some() {
                break;
            }
        }
        if !first {
            a.decode_tokens += kept;
            a.decode_steps += 1;
        }
        if let Some(f) = finish {
            return Some((f, deltas));
        }
        let (conn, id) = (a.conn, a.id.clone());
        let calls = a.emitter.take_calls();
        let logprobs = a.logprobs_to_send(deltas.len() + calls.len());
        self.send_deltas(conn, &id, &deltas, calls, logprobs);
        None
    }

    /// Ends request `seq` with `finish`, sending `deltas`, the rest of the
    /// text and the `done` event.
    fn end_active(&mut self, seq: SeqId, finish: Finish, mut deltas: Deltas) {
        let Some(mut a) = self.active.remove(&seq) else {
            return;
        };
        if let Some(n) = self.engine.cached_tokens(seq) {
            a.cached_tokens = n;
        }
        a.cache_tier = self.engine.cache_tier(seq);
        self.engine.finish(seq);
        if finish != Finish::Cancelled {
            a.emitter.finish(&mut deltas);
        }
        if let Some(l) = a.logprobs.as_mut() {
            l.truncate(a.tokens.len());
        }
        let calls = a.emitter.take_calls();
        let logprobs = a.logprobs_to_send(deltas.len() + calls.len());
        self.send_deltas(a.conn, &a.id, &deltas, calls, logprobs);
        let stats = a.stats(self.info.context_limit);
        let done = DoneEvent {
            id: Cow::Borrowed(&a.id),
            done: true,
            finish,
            token_ids: Cow::Borrowed(&a.tokens),
            text: Cow::Borrowed(a.emitter.text()),
            thinking: a.chat.then(|| Cow::Borrowed(a.emitter.thinking())),
            stats: Cow::Borrowed(&stats),
            tool_calls: Cow::Borrowed(a.emitter.calls()),
            logprobs: a.logprobs.as_deref().map(Cow::Borrowed),
            stop_sequence: a.emitter.stop_match().map(Cow::Borrowed),
        };
        self.send(a.conn, &done);
        self.release(a.conn, &a.key);
    }

    /// Sends one step's text `deltas`, then its tool-call pieces `calls`;
    /// the last of these events carries `logprobs`.
    fn send_deltas(
        &mut self,
        conn: ConnId,
        id: &Id,
        deltas: &Deltas,
        calls: Vec<kore_protocol::CallDelta<'static>>,
        mut logprobs: Option<Vec<TokenLogprob>>,
    ) {
        let total = deltas.len() + calls.len();
        let texts = deltas.iter().map(|(phase, text)| (*phase, Cow::Borrowed(text.as_str()), None));
        let pieces =
            calls.into_iter().map(|c| (kore_protocol::Phase::Answer, Cow::Borrowed(""), Some(c)));
        for (i, (phase, delta, tool_call)) in texts.chain(pieces).enumerate() {
            let last = i + 1 == total;
            let ev = DeltaEvent {
                id: Cow::Borrowed(id),
                delta,
                phase,
                tool_call,
                logprobs: if last { logprobs.take().map(Cow::Owned) } else { None },
            };
            self.send(conn, &ev);
        }
    }

    fn send_engine_error(&mut self, conn: ConnId, id: &Id, e: &EngineError) {
        let (code, message) = match e {
            EngineError::BadParams(m) => (ErrorCode::BadRequest, m),
            EngineError::PromptTooLong(m) => (ErrorCode::PromptTooLong, m),
            EngineError::Unsupported(m) => (ErrorCode::Unsupported, m),
            EngineError::Internal(m) => (ErrorCode::Internal, m),
        };
        self.send_error(conn, id, code, message);
    }

    fn send_error(&mut self, conn: ConnId, id: &Id, code: ErrorCode, message: &str) {
        let ev = ErrorEvent {
            id: Cow::Borrowed(id),
            error: ErrorBody { code, message: message.into() },
        };
        self.send(conn, &ev);
    }

    fn send<T: serde::Serialize>(&mut self, conn: ConnId, event: &T) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.send(event) {
                self.reap_killed(conn);
            }
        }
    }

    /// Forgets a finished request id on its connection.
    fn release(&mut self, conn: ConnId, key: &str) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.remove_in_flight(key);
        }
    }

    /// A connection whose output overflowed loses its requests.
    fn reap_killed(&mut self, conn: ConnId) {
        let killed = self.conns.get(&conn).is_some_and(|c| c.state() == ConnState::Killed);
        if killed {
            self.drop_requests_of(conn);
        }
    }
}
