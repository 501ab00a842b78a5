//! `kore-launch batch IN.jsonl -o OUT.jsonl [--concurrency N]`: one request
//! per input line (`messages` for chat, or `prompt` / `prompt_ids` for a raw
//! completion, with the protocol's per-request parameters), one result row per
//! line in input order.
//!
//! - A row is `{"id", "text", "thinking"?, "token_ids", "finish", "stats"}`,
//!   or `{"id", "error": {"code", "message"}}`; `"line"` (1-based) replaces
//!   `"id"` when the line has no readable id (a string or a number).
//! - A bad line (not JSON, not an object, refused by the appliance) becomes an
//!   error row; the other lines still run. Blank lines are skipped.
//! - Resuming: the rows are written to `OUT.partial` as they complete (in
//!   input order) and renamed to OUT at the end. Rerunning with the same OUT
//!   reuses every answered row of OUT and of a leftover `OUT.partial`, and
//!   runs only the rest (error rows are retried).
//! - `-` reads stdin / writes stdout (no resume for stdout).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kore_protocol::{DoneEvent, ErrorCode, Event, GenerateRequest, Id, Request, Stats};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::session::{self, Placement};
use crate::cli::BatchArgs;
use crate::client::{ClientError, EventChannel, Requests};
use crate::error::{LaunchError, Result};

/// Requests the service queues at most (protocol: 64 waiting + 1 running).
const MAX_CONCURRENCY: usize = 64;

/// One input line, ready to run or already decided.
#[derive(Debug)]
struct Job {
    /// `{"id": ...}` or `{"line": n}`: how the row names its line.
    name: (String, Value),
    /// Resume key: the name plus its occurrence number.
    key: String,
    /// The request to send (its `id` replaced at send time), or the row.
    work: Work,
}

#[derive(Debug)]
enum Work {
    Request(Box<GenerateRequest>),
    Row(Value),
}

/// The part of an output row that names its line and says whether it failed.
#[derive(Debug, Deserialize)]
struct RowKey {
    id: Option<Value>,
    line: Option<Value>,
    error: Option<serde::de::IgnoredAny>,
}

/// A row's answer: the `done` event's fields a row keeps.
#[derive(Debug, Serialize)]
struct Answer<'a> {
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    token_ids: &'a [u32],
    finish: kore_protocol::Finish,
    stats: &'a Stats,
}

/// Runs `batch`.
pub fn run(args: BatchArgs) -> Result<()> {
    let started = Instant::now();
    let lines = read_input(&args.input)?;
    let mut jobs = parse_jobs(&lines, &args);
    let to_stdout = args.output.as_os_str() == "-";
    let reused = if to_stdout { 0 } else { reuse_previous(&args.output, &mut jobs)? };
    let pending = jobs.iter().filter(|j| matches!(j.work, Work::Request(_))).count();
    let mut out = Output::create(&args.output)?;
    let bar = progress_bar(jobs.len() as u64);
    let bad = jobs.iter().filter(|j| matches!(&j.work, Work::Row(r) if is_error_row(r))).count();
    let mut summary = Summary { reused, errors: bad, ..Summary::default() };
    if pending == 0 {
        write_rows(&jobs, &mut 0, &mut out, &bar)?;
    } else {
        let backend = session::open(&Placement { native: args.native, model: args.model.clone() })?;
        let res = backend.connect().and_then(|client| {
            let (events, requests) = client.into_split();
            let events = events
                .spawn_reader()
                .map_err(|source| LaunchError::Start { what: "a reader", source })?;
            let mut runner = Runner {
                conn: (requests, events),
                jobs: &mut jobs,
                out: &mut out,
                bar: &bar,
                summary: &mut summary,
            };
            runner.run(args.concurrency.clamp(1, MAX_CONCURRENCY))
        });
        let stopped = backend.shutdown();
        res.and(stopped)?;
    }
    out.finish()?;
    bar.finish_and_clear();
    eprintln!(
        "batch: {} lines: {} answered, {} errors, {} reused from an earlier run; {:.1} s, {} tokens generated",
        jobs.len(),
        summary.answered,
        summary.errors,
        summary.reused,
        started.elapsed().as_secs_f64(),
        summary.tokens
    );
    if args.fail_on_error && summary.errors > 0 {
        return Err(LaunchError::BatchFailed { failed: summary.errors, total: jobs.len() });
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Summary {
    answered: usize,
    errors: usize,
    reused: usize,
    tokens: u64,
}

fn read_input(path: &Path) -> Result<Vec<String>> {
    let io_err = |source| LaunchError::Io { path: path.display().to_string(), source };
    let reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path).map_err(io_err)?)
    };
    let mut lines = Vec::new();
    for line in BufReader::new(reader).split(b'\n') {
        let mut bytes = line.map_err(io_err)?;
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        // Not UTF-8 becomes an error row later (through the replacement character check).
        lines.push(String::from_utf8(bytes).unwrap_or_else(|_| String::from("\u{0}not utf-8")));
    }
    Ok(lines)
}

/// Parses every non-blank line into a job.
fn parse_jobs(lines: &[String], args: &BatchArgs) -> Vec<Job> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut jobs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: std::result::Result<Value, String> = if line.starts_with('\u{0}') {
            Err("the line is not UTF-8".into())
        } else {
            serde_json::from_str(line).map_err(|e| format!("the line is not JSON: {e}"))
        };
        let readable_id = parsed
            .as_ref()
            .ok()
            .and_then(|v| v.get("id"))
            .filter(|id| id.is_string() || id.is_number());
        let name = match readable_id {
            Some(id) => ("id".to_owned(), id.clone()),
            None => ("line".to_owned(), Value::from(i + 1)),
        };
        let base = format!("{}={}", name.0, name.1);
        let n = seen.entry(base.clone()).or_insert(0);
        *n += 1;
        let key = format!("{base}#{n}");
        let work = match parsed {
            Ok(Value::Object(obj)) => {
                // Read from the line's text: `tools` and `response_format`
                // keep their key order. A bad `id` is the row's name only.
                let read = match obj.get("id") {
                    Some(id) if !(id.is_string() || id.is_number() || id.is_null()) => {
                        let mut obj = obj;
                        obj.remove("id");
                        kore_protocol::request::generate_from_str(&Value::Object(obj).to_string())
                    }
                    _ => kore_protocol::request::generate_from_str(line),
                };
                match read {
                    Ok(mut req) => {
                        req.id = kore_protocol::Id::NULL;
                        add_defaults(&mut req, args);
                        Work::Request(Box::new(req))
                    }
                    Err(msg) => Work::Row(error_row(&name, ErrorCode::BadRequest, &msg)),
                }
            }
            Ok(_) => {
                Work::Row(error_row(&name, ErrorCode::BadJson, "the line is not a JSON object"))
            }
            Err(msg) => Work::Row(error_row(&name, ErrorCode::BadJson, &msg)),
        };
        jobs.push(Job { name, key, work });
    }
    jobs
}

/// Command-line sampling flags apply to lines that do not set them.
fn add_defaults(req: &mut GenerateRequest, args: &BatchArgs) {
    session::add_sampling(req, &args.sampling);
    if req.messages.is_some() && req.thinking.is_none() {
        req.thinking = args.thinking.map(|t| t == crate::cli::OnOff::On);
    }
}

/// A row naming its line and holding `fields`.
fn row(name: &(String, Value), fields: Value) -> Value {
    let mut row = Map::new();
    row.insert(name.0.clone(), name.1.clone());
    if let Value::Object(fields) = fields {
        row.extend(fields);
    }
    Value::Object(row)
}

fn error_row(name: &(String, Value), code: ErrorCode, message: &str) -> Value {
    let body = kore_protocol::ErrorBody { code, message: message.into() };
    row(name, serde_json::json!({ "error": body }))
}

fn is_error_row(row: &Value) -> bool {
    RowKey::deserialize(row).is_ok_and(|k| k.error.is_some())
}

/// The key of an output row (its name plus occurrence), as for jobs, and
/// whether it is an error row.
fn row_base(key: &RowKey) -> Option<String> {
    let (k, v) = match (&key.id, &key.line) {
        (Some(id), _) => ("id", id),
        (None, Some(line)) => ("line", line),
        _ => return None,
    };
    Some(format!("{k}={v}"))
}

/// Marks jobs answered by rows of OUT or OUT.partial as done; returns how many.
fn reuse_previous(out: &Path, jobs: &mut [Job]) -> Result<usize> {
    let mut answered: HashMap<String, Value> = HashMap::new();
    for path in [out.to_path_buf(), partial_path(out)] {
        let Ok(file) = File::open(&path) else { continue };
        let mut seen: HashMap<String, usize> = HashMap::new();
        for line in BufReader::new(file).lines() {
            let line = line
                .map_err(|source| LaunchError::Io { path: path.display().to_string(), source })?;
            // A torn last line (interrupted write) is simply not reused.
            let Ok(row) = serde_json::from_str::<Value>(&line) else { continue };
            let Ok(key) = RowKey::deserialize(&row) else { continue };
            let Some(base) = row_base(&key) else { continue };
            let n = seen.entry(base.clone()).or_insert(0);
            *n += 1;
            if key.error.is_none() {
                answered.entry(format!("{base}#{n}")).or_insert(row);
            }
        }
    }
    let mut reused = 0;
    for job in jobs.iter_mut() {
        if matches!(job.work, Work::Request(_)) {
            if let Some(row) = answered.remove(&job.key) {
                job.work = Work::Row(row);
                reused += 1;
            }
        }
    }
    Ok(reused)
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

/// Where rows go: stdout, or `OUT.partial` renamed to OUT at the end.
enum Output {
    Stdout(io::Stdout),
    File { file: io::BufWriter<File>, partial: PathBuf, out: PathBuf },
}

impl Output {
    fn create(path: &Path) -> Result<Self> {
        if path.as_os_str() == "-" {
            return Ok(Output::Stdout(io::stdout()));
        }
        let partial = partial_path(path);
        let file = File::create(&partial)
            .map_err(|source| LaunchError::Io { path: partial.display().to_string(), source })?;
        Ok(Output::File { file: io::BufWriter::new(file), partial, out: path.to_path_buf() })
    }

    fn write_row(&mut self, row: &Value) -> Result<()> {
        let line = format!("{row}\n");
        let (res, name) = match self {
            Output::Stdout(s) => {
                (s.write_all(line.as_bytes()).and_then(|()| s.flush()), "stdout".into())
            }
            Output::File { file, partial, .. } => (
                file.write_all(line.as_bytes()).and_then(|()| file.flush()),
                partial.display().to_string(),
            ),
        };
        res.map_err(|source| LaunchError::Io { path: name, source })
    }

    fn finish(self) -> Result<()> {
        match self {
            Output::Stdout(_) => Ok(()),
            Output::File { file, partial, out } => {
                let io_err = |source| LaunchError::Io { path: out.display().to_string(), source };
                let file = file.into_inner().map_err(|e| io_err(e.into_error()))?;
                file.sync_all().map_err(io_err)?;
                std::fs::rename(&partial, &out).map_err(io_err)
            }
        }
    }
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(
        "{bar:40} {pos}/{len} lines {msg} [{elapsed_precise}, eta {eta}]",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// Writes every finished row from `*next` on, in input order.
fn write_rows(jobs: &[Job], next: &mut usize, out: &mut Output, bar: &ProgressBar) -> Result<()> {
    while let Some(job) = jobs.get(*next) {
        let Work::Row(row) = &job.work else { break };
        out.write_row(row)?;
        bar.inc(1);
        *next += 1;
    }
    Ok(())
}

/// Keeps up to `concurrency` requests in flight on one connection.
struct Runner<'a> {
    conn: (Requests, EventChannel),
    jobs: &'a mut Vec<Job>,
    out: &'a mut Output,
    bar: &'a ProgressBar,
    summary: &'a mut Summary,
}

/// How long the runner waits for another answer after one it got (and, ten
/// times that, at most takes answers) before it refills the free slots: the
/// service ends a step's requests together.
const SETTLE: Duration = Duration::from_millis(2);

/// What the runner tracks between events.
struct Flight {
    waiting: VecDeque<usize>,
    in_flight: usize,
    retry_at: Option<Instant>,
    started: Instant,
}

impl Runner<'_> {
    /// Keeps up to `concurrency` requests in flight. Slots freed by answers
    /// that arrive together are refilled together, in one write, so the new
    /// requests' prefills share a step (one pass over the weights) instead of
    /// the first starting alone and holding up the rest.
    fn run(&mut self, concurrency: usize) -> Result<()> {
        let waiting = (0..self.jobs.len())
            .filter(|&i| matches!(self.jobs[i].work, Work::Request(_)))
            .collect();
        let mut f = Flight { waiting, in_flight: 0, retry_at: None, started: Instant::now() };
        let mut next_row = 0usize;
        loop {
            let mut requests = Vec::new();
            while f.in_flight < concurrency && f.retry_at.is_none_or(|t| Instant::now() >= t) {
                let Some(i) = f.waiting.pop_front() else { break };
                let Work::Request(req) = &self.jobs[i].work else { continue };
                let mut req = GenerateRequest::clone(req);
                req.id = Id::from(i as u64);
                requests.push(Request::Generate(req));
                f.in_flight += 1;
                f.retry_at = None;
            }
            if !requests.is_empty() {
                self.conn.0.send_all(&requests)?;
            }
            write_rows(self.jobs, &mut next_row, self.out, self.bar)?;
            if f.in_flight == 0 && f.waiting.is_empty() {
                return Ok(());
            }
            let Some(mut ev) = self.conn.1.next_timeout(Duration::from_millis(200)) else {
                continue;
            };
            let until = Instant::now() + 10 * SETTLE;
            loop {
                self.absorb(ev?, &mut f)?;
                let more =
                    if Instant::now() < until { self.conn.1.next_timeout(SETTLE) } else { None };
                let Some(more) = more else { break };
                ev = more;
            }
        }
    }

    /// Takes one event: an answer becomes its row, an `overloaded` refusal
    /// goes back to the queue.
    fn absorb(&mut self, ev: kore_protocol::Event<'static>, f: &mut Flight) -> Result<()> {
        let (i, row) = match ev {
            Event::Delta(_) | Event::Info(_) | Event::Bench(_) => return Ok(()),
            Event::Done(done) => {
                let Some(i) = self.index(&done.id) else { return Ok(()) };
                self.summary.answered += 1;
                self.summary.tokens += u64::from(done.stats.generated_tokens);
                (i, self.result_row(i, &done))
            }
            Event::Error(e) => {
                let (code, message) = (e.error.code, e.error.message.into_owned());
                let Some(i) = self.index(&e.id) else {
                    let id = e.id.into_owned();
                    return Err(ClientError::Refused { id, code, message }.into());
                };
                if code == ErrorCode::Overloaded {
                    // Another client filled the queue: send it again shortly.
                    f.waiting.push_front(i);
                    f.in_flight -= 1;
                    f.retry_at = Some(Instant::now() + Duration::from_millis(250));
                    return Ok(());
                }
                self.summary.errors += 1;
                (i, error_row(&self.jobs[i].name, code, &message))
            }
        };
        self.jobs[i].work = Work::Row(row);
        f.in_flight -= 1;
        let rate = self.summary.tokens as f64 / f.started.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!("{rate:.1} tok/s"));
        Ok(())
    }

    fn index(&self, id: &Id) -> Option<usize> {
        id.0.as_u64().map(|i| i as usize).filter(|&i| i < self.jobs.len())
    }

    fn result_row(&self, i: usize, done: &DoneEvent<'_>) -> Value {
        let answer = Answer {
            text: &done.text,
            thinking: done.thinking.as_deref(),
            token_ids: &done.token_ids,
            finish: done.finish,
            stats: &done.stats,
        };
        row(&self.jobs[i].name, serde_json::to_value(answer).unwrap_or_default())
    }
}
