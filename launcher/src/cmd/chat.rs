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

use serde_json::{json, Map, Value};

use super::session::{self, Backend, Conn, Event, Placement};
use crate::cli::{ChatArgs, OnOff};
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
    sigint::install().map_err(|e| LaunchError::Other(format!("cannot handle Ctrl-C: {e}")))?;
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
    messages: &[Value],
    thinking: bool,
    args: &ChatArgs,
    session: Option<&str>,
) -> Value {
    let mut req = Map::new();
    req.insert("id".into(), id.into());
    req.insert("messages".into(), Value::Array(messages.to_vec()));
    req.insert("thinking".into(), thinking.into());
    if let Some(s) = session {
        req.insert("session".into(), s.into());
    }
    session::add_sampling(&mut req, &args.sampling);
    Value::Object(req)
}

/// The system prompt: `--system`, else the config key `system_prompt`.
fn system_prompt(args: &ChatArgs) -> Result<Option<String>> {
    if let Some(s) = &args.system {
        return Ok(Some(s.clone()));
    }
    let loaded =
        crate::config::init(None, None, None).map_err(|e| LaunchError::Other(e.to_string()))?;
    Ok(loaded.file.system_prompt.clone())
}

/// The conversation's opening messages.
fn opening(system: Option<&str>) -> Vec<Value> {
    system.map(|s| json!({"role": "system", "content": s})).into_iter().collect()
}

/// Streams the events of request `id` into `on_delta` until its `done`
/// event, which is returned. Ctrl-C sends a cancel once; the request then
/// ends with `finish: "cancelled"`.
fn stream(
    conn: &mut Conn,
    id: u64,
    on_delta: &mut dyn FnMut(&str, bool) -> io::Result<()>,
) -> Result<Value> {
    let id = Value::from(id);
    let mut cancel_sent = false;
    let out = |e: io::Error| LaunchError::Io { path: "stdout".into(), source: e };
    loop {
        if !cancel_sent && sigint::take() {
            conn.send(&json!({ "cancel": id }))?;
            cancel_sent = true;
        }
        let Some(ev) = conn.next_timeout(POLL) else { continue };
        match ev {
            Event::Delta { id: got, text, thinking } if got == id => {
                on_delta(&text, thinking).map_err(out)?
            }
            Event::Done { id: got, body } if got == id => return Ok(body),
            Event::Error { id: got, code, message } if got == id || got.is_null() => {
                return Err(LaunchError::Other(format!(
                    "the appliance refused ({code}): {message}"
                )))
            }
            Event::Closed(why) => return Err(LaunchError::Other(why)),
            _ => {}
        }
    }
}

fn thinking_default(args: &ChatArgs) -> bool {
    args.thinking.is_none_or(|t| t == OnOff::On)
}

/// `chat -p PROMPT`: one answer; `--json` prints `{"text","thinking","stats"}`.
fn one_shot(backend: &dyn Backend, args: &ChatArgs, prompt: &str) -> Result<()> {
    let mut conn = backend.connect()?;
    let mut messages = opening(system_prompt(args)?.as_deref());
    messages.push(json!({"role": "user", "content": prompt}));
    conn.send(&request(1, &messages, thinking_default(args), args, None))?;
    let tty = term::stdout_is_tty() && !args.json.json;
    let body = if args.json.json {
        stream(&mut conn, 1, &mut |_, _| Ok(()))?
    } else if tty {
        let mut r = Renderer::new(io::stdout(), true, term::size());
        let body =
            stream(&mut conn, 1, &mut |t, think| if think { r.thinking(t) } else { r.answer(t) })?;
        r.note(&session::status_line(&body["stats"])).map_err(stdout_err)?;
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
        eprintln!("{}", session::status_line(&body["stats"]));
        body
    };
    if body["finish"] == "cancelled" {
        return Err(LaunchError::Other("the answer was cancelled (Ctrl-C)".into()));
    }
    if args.json.json {
        let obj =
            json!({"text": body["text"], "thinking": body["thinking"], "stats": body["stats"]});
        println!("{obj}");
    }
    Ok(())
}

fn stdout_err(e: io::Error) -> LaunchError {
    LaunchError::Io { path: "stdout".into(), source: e }
}

/// An interactive session.
struct Chat<'a> {
    conn: Conn,
    args: &'a ChatArgs,
    history: Vec<Value>,
    system: Option<String>,
    session: String,
    conversations: u64,
    thinking: bool,
    next_id: u64,
    last_stats: Option<Value>,
    answers: u64,
    generated: u64,
}

impl<'a> Chat<'a> {
    fn new(backend: &dyn Backend, args: &'a ChatArgs) -> Result<Self> {
        let mut conn = backend.connect()?;
        let info = conn.info()?;
        let thinking = thinking_default(args);
        println!(
            "Kore chat · {} · context {} tokens · thinking {} · /help for commands, /quit to leave",
            info["model"].as_str().unwrap_or("?"),
            info["context_limit"],
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
        let req = json!({"id": id, "prompt": prompt, "max_tokens": 1, "session": self.session});
        self.conn.send(&req)?;
        let body = stream(&mut self.conn, id, &mut |_, _| Ok(()))?;
        println!(
            "(system prompt ready: {} tokens in {:.0} ms)",
            body["stats"]["prompt_tokens"],
            body["stats"]["prefill_ms"].as_f64().unwrap_or(0.0)
        );
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
                    s["prompt_tokens"],
                    s["prefill_ms"].as_f64().unwrap_or(0.0),
                    s["prefill_tok_per_s"].as_f64().unwrap_or(0.0)
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
        self.history.push(json!({"role": "user", "content": text}));
        let id = self.next_id;
        self.next_id += 1;
        let _ = sigint::take(); // a Ctrl-C from before this answer does not count
        let session = Some(self.session.as_str());
        self.conn.send(&request(id, &self.history, self.thinking, self.args, session))?;
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
                if matches!(&e, LaunchError::Other(m) if m.starts_with("the appliance refused")) {
                    println!("error: {e}");
                    return Ok(());
                }
                return Err(e);
            }
        };
        if body["finish"] == "cancelled" {
            self.history.pop();
            r.note("(cancelled; this exchange is not kept in the conversation)")
                .map_err(stdout_err)?;
            return Ok(());
        }
        let answer = body["text"].as_str().unwrap_or_default().to_owned();
        self.history.push(json!({"role": "assistant", "content": answer}));
        self.answers += 1;
        self.generated += body["stats"]["generated_tokens"].as_u64().unwrap_or(0);
        r.note(&session::status_line(&body["stats"])).map_err(stdout_err)?;
        self.last_stats = Some(body["stats"].clone());
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
