//! `kore-launch chat`: interactive streaming chat, or one answer with `-p`.
//!
//! Interactive: the conversation is kept and sent whole with each message,
//! in one appliance session per conversation (`/reset` starts a new one), so
//! the appliance prefills only each turn's new tokens; a system prompt
//! (`--system`, config key `system_prompt`) is prefilled into the session
//! before the first message and the banner says how long that took;
//! thinking streams dimmed and folds to `Thought for N s` when the answer
//! starts; a status line follows every answer; Ctrl-C cancels the answer in
//! progress (not the session); `/quit` or Ctrl-D ends the session and shuts
//! the appliance down if this command booted it.

use std::io::{self, Write};
use std::time::Duration;

use kore_protocol::{Event, Finish, GenerateRequest, Id, Message, Phase, Request, Role, Stats};

use super::session::{self, Backend, Placement};
use crate::cli::{ChatArgs, OnOff};
use crate::client::{ClientError, Done, EventChannel, Requests};
use crate::error::{LaunchError, Result};
use crate::term::input::{read_message, Input};
use crate::term::render::Renderer;
use crate::term::{self, sigint};

/// How often the answer loop looks at the Ctrl-C flag.
const POLL: Duration = Duration::from_millis(30);

const HELP: &str = "\
Type a message and press Enter. End a line with \\ to continue it, or put the message
between two lines of \"\"\" to write several lines.
  /reset          forget the conversation
  /think on|off   thinking before answering (no argument: toggle)
  /stats          statistics of the last answer and of the session
  /quit           leave (also /exit or Ctrl-D)
  /help           this text
Ctrl-C cancels the answer being written.";

/// Runs `chat` (and `kore-launch` with no arguments, `args` all default).
pub fn run(args: ChatArgs) -> Result<()> {
    sigint::install()
        .map_err(|source| LaunchError::Start { what: "the Ctrl-C handler", source })?;
    let backend = session::open(&Placement { native: args.native, model: args.model.clone() })?;
    let result = match args.prompt.clone() {
        Some(prompt) => one_shot(backend.as_ref(), &args, &prompt),
        None => Chat::new(backend.as_ref(), &args).and_then(|mut c| c.run()),
    };
    let stopped = backend.shutdown();
    result.and(stopped)
}

/// The chat request for `messages` (in appliance session `session`, if any).
fn request(
    id: u64,
    messages: &[Message],
    thinking: bool,
    args: &ChatArgs,
    session: Option<&str>,
) -> Request {
    let mut req = GenerateRequest::chat(messages.to_vec());
    req.id = Id::from(id);
    req.thinking = Some(thinking);
    req.session = session.map(str::to_owned);
    session::add_sampling(&mut req, &args.sampling);
    Request::Generate(req)
}

/// A connection of `backend` split for polling: requests out, events from a
/// reader thread.
fn open_conn(backend: &dyn Backend) -> Result<(Requests, EventChannel)> {
    let (events, requests) = backend.connect()?.into_split();
    let events =
        events.spawn_reader().map_err(|source| LaunchError::Start { what: "a reader", source })?;
    Ok((requests, events))
}

/// The system prompt: `--system`, else the config key `system_prompt`.
fn system_prompt(args: &ChatArgs) -> Result<Option<String>> {
    if let Some(s) = &args.system {
        return Ok(Some(s.clone()));
    }
    let loaded = crate::config::init(None, None, None)?;
    Ok(loaded.file.system_prompt.clone())
}

/// The conversation's opening messages.
fn opening(system: Option<&str>) -> Vec<Message> {
    system.map(|s| Message::new(Role::System, s)).into_iter().collect()
}

/// Streams the events of request `id` into `on_delta` until its `done`
/// event, which is returned. Ctrl-C sends a cancel once; the request then
/// ends with `finish: "cancelled"`.
fn stream(
    (requests, events): &mut (Requests, EventChannel),
    id: u64,
    on_delta: &mut dyn FnMut(&str, bool) -> io::Result<()>,
) -> Result<Done> {
    let id = Id::from(id);
    let mut cancel_sent = false;
    loop {
        if !cancel_sent && sigint::take() {
            requests.cancel(&id)?;
            cancel_sent = true;
        }
        let Some(ev) = events.next_timeout(POLL) else { continue };
        match ev? {
            Event::Delta(d) if *d.id == id => {
                on_delta(&d.delta, d.phase == Phase::Thinking).map_err(stdout_err)?
            }
            Event::Done(d) if *d.id == id => return Ok(d),
            Event::Error(e) if *e.id == id || e.id.is_null() => {
                let (code, message) = (e.error.code, e.error.message.into_owned());
                return Err(ClientError::Refused { id: e.id.into_owned(), code, message }.into());
            }
            _ => {}
        }
    }
}

fn thinking_default(args: &ChatArgs) -> bool {
    args.thinking.is_none_or(|t| t == OnOff::On)
}

/// `chat -p PROMPT`: one answer; `--json` prints `{"text","thinking","stats"}`.
fn one_shot(backend: &dyn Backend, args: &ChatArgs, prompt: &str) -> Result<()> {
    let mut conn = open_conn(backend)?;
    let mut messages = opening(system_prompt(args)?.as_deref());
    messages.push(Message::new(Role::User, prompt));
    conn.0.send(&request(1, &messages, thinking_default(args), args, None))?;
    let tty = term::stdout_is_tty() && !args.json.json;
    let body = if args.json.json {
        stream(&mut conn, 1, &mut |_, _| Ok(()))?
    } else if tty {
        let mut r = Renderer::new(io::stdout(), true, term::size());
        let body =
            stream(&mut conn, 1, &mut |t, think| if think { r.thinking(t) } else { r.answer(t) })?;
        r.note(&session::status_line(&body.stats)).map_err(stdout_err)?;
        body
    } else {
        let mut out = io::stdout();
        let body = stream(&mut conn, 1, &mut |t, think| {
            if !think {
                out.write_all(t.as_bytes())?;
                out.flush()?;
            }
            Ok(())
        })?;
        writeln!(out).map_err(stdout_err)?;
        eprintln!("{}", session::status_line(&body.stats));
        body
    };
    if body.finish == Finish::Cancelled {
        return Err(LaunchError::Cancelled("the answer"));
    }
    if args.json.json {
        let obj =
            serde_json::json!({"text": body.text, "thinking": body.thinking, "stats": body.stats});
        println!("{obj}");
    }
    Ok(())
}

fn stdout_err(e: io::Error) -> LaunchError {
    LaunchError::Io { path: "stdout".into(), source: e }
}

/// An interactive session.
struct Chat<'a> {
    conn: (Requests, EventChannel),
    args: &'a ChatArgs,
    history: Vec<Message>,
    system: Option<String>,
    session: String,
    conversations: u64,
    thinking: bool,
    next_id: u64,
    last_stats: Option<Stats>,
    answers: u64,
    generated: u64,
}

impl<'a> Chat<'a> {
    fn new(backend: &dyn Backend, args: &'a ChatArgs) -> Result<Self> {
        let info = backend.connect()?.info()?;
        let conn = open_conn(backend)?;
        let thinking = thinking_default(args);
        println!(
            "Kore chat · {} · context {} tokens · thinking {} · /help for commands, /quit to leave",
            info.model,
            info.context_limit,
            on_off(thinking)
        );
        let system = system_prompt(args)?;
        let mut chat = Self {
            conn,
            args,
            history: opening(system.as_deref()),
            system,
            session: String::new(),
            conversations: 0,
            thinking,
            next_id: 1,
            last_stats: None,
            answers: 0,
            generated: 0,
        };
        chat.new_conversation()?;
        Ok(chat)
    }

    /// Starts a conversation in a new appliance session; with a system
    /// prompt, prefills it there first (a raw prompt of its rendered turn,
    /// one token generated) and says when it is ready.
    fn new_conversation(&mut self) -> Result<()> {
        self.conversations += 1;
        self.session = format!("chat-{}-{}", std::process::id(), self.conversations);
        self.history = opening(self.system.as_deref());
        let Some(system) = self.system.clone() else { return Ok(()) };
        let id = self.next_id;
        self.next_id += 1;
        let prompt = format!("<|im_start|>system\n{system}<|im_end|>\n");
        let mut req = GenerateRequest::completion(prompt);
        req.id = Id::from(id);
        req.max_tokens = Some(1);
        req.session = Some(self.session.clone());
        self.conn.0.send(&Request::Generate(req))?;
        let body = stream(&mut self.conn, id, &mut |_, _| Ok(()))?;
        println!("({})", system_banner(&body.stats));
        Ok(())
    }

    fn run(&mut self) -> Result<()> {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        loop {
            let msg = read_message(&mut input, "> ", ". ")
                .map_err(|source| LaunchError::Io { path: "stdin".into(), source })?;
            let text = match msg {
                Input::Eof => {
                    println!();
                    return Ok(());
                }
                Input::Interrupted => {
                    println!("\n(Ctrl-C cancels an answer; /quit or Ctrl-D leaves)");
                    continue;
                }
                Input::Text(t) => t,
            };
            if text.trim().is_empty() {
                continue;
            }
            if text.starts_with('/') {
                if self.command(text.trim())? {
                    return Ok(());
                }
                continue;
            }
            self.ask(text)?;
        }
    }

    /// Runs a slash command; true means quit.
    fn command(&mut self, line: &str) -> Result<bool> {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        let arg = words.next();
        match (name, arg) {
            ("/quit" | "/exit" | "/q", _) => return Ok(true),
            ("/help" | "/?", _) => println!("{HELP}"),
            ("/reset" | "/clear", _) => {
                println!("(conversation cleared)");
                self.new_conversation()?;
            }
            ("/think", None) => self.set_thinking(!self.thinking),
            ("/think", Some("on")) => self.set_thinking(true),
            ("/think", Some("off")) => self.set_thinking(false),
            ("/think", Some(other)) => println!("/think takes on or off, not {other:?}"),
            ("/stats", _) => self.print_stats(),
            _ => println!("unknown command {name}; /help lists them"),
        }
        Ok(false)
    }

    fn set_thinking(&mut self, on: bool) {
        self.thinking = on;
        println!("(thinking {})", on_off(on));
    }

    fn print_stats(&self) {
        match &self.last_stats {
            None => println!("(no answer yet)"),
            Some(s) => {
                println!("last answer: {}", session::status_line(s));
                println!(
                    "  prompt {} tokens, prefill {:.1} ms ({:.1} tok/s)",
                    s.prompt_tokens, s.prefill_ms, s.prefill_tok_per_s
                );
            }
        }
        println!(
            "session: {} answers, {} tokens generated, {} messages in the conversation",
            self.answers,
            self.generated,
            self.history.len()
        );
    }

    /// Sends `text` with the conversation and streams the answer.
    fn ask(&mut self, text: String) -> Result<()> {
        self.history.push(Message::new(Role::User, text));
        let id = self.next_id;
        self.next_id += 1;
        let _ = sigint::take(); // a Ctrl-C from before this answer does not count
        let session = Some(self.session.as_str());
        self.conn.0.send(&request(id, &self.history, self.thinking, self.args, session))?;
        let tty = term::stdout_is_tty();
        let mut r = Renderer::new(io::stdout(), tty, term::size());
        let res = stream(&mut self.conn, id, &mut |t, think| {
            if think {
                r.thinking(t)
            } else {
                r.answer(t)
            }
        });
        let body = match res {
            Ok(body) => body,
            Err(e) => {
                self.history.pop();
                r.end().map_err(stdout_err)?;
                if matches!(&e, LaunchError::Client(ClientError::Refused { .. })) {
                    println!("error: {e}");
                    return Ok(());
                }
                return Err(e);
            }
        };
        if body.finish == Finish::Cancelled {
            self.history.pop();
            r.note("(cancelled; this exchange is not kept in the conversation)")
                .map_err(stdout_err)?;
            return Ok(());
        }
        self.history.push(Message::new(Role::Assistant, body.text.as_ref()));
        self.answers += 1;
        self.generated += u64::from(body.stats.generated_tokens);
        r.note(&session::status_line(&body.stats)).map_err(stdout_err)?;
        self.last_stats = Some(body.stats.into_owned());
        Ok(())
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Where the system prompt came from: "system prompt ready: N tokens from
/// cache (disk, M reused) in X ms", or "... N tokens prefilled in X ms".
fn system_banner(s: &kore_protocol::Stats) -> String {
    let (n, ms) = (s.prompt_tokens, s.prefill_ms);
    match (s.cached_tokens, s.cache_tier.as_deref()) {
        (0, _) => format!("system prompt ready: {n} tokens prefilled in {ms:.0} ms"),
        (c, tier) => format!(
            "system prompt ready: {n} tokens from cache ({}, {c} reused) in {ms:.0} ms",
            tier.unwrap_or("memory")
        ),
    }
}
