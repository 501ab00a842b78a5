//! The interactive chat in a real terminal (tmux), on the launcher's fake
//! engine (`KORE_LAUNCH_FAKE=echo`: kore-service's protocol code with an
//! engine that thinks `Thinking about: <msg>` and answers `<msg>`): type,
//! read the screen, see thinking folded and the status line, Ctrl-C in the
//! middle of an answer keeps the session, /quit exits 0.

mod tmux_support;

use tmux_support::{sh_quote, Tmux};

fn chat_command(extra_env: &str) -> String {
    format!(
        "env -u KORE_CONFIG XDG_CONFIG_HOME=/nonexistent KORE_LAUNCH_FAKE=echo {extra_env} {} chat",
        sh_quote(kore_e2e::kore_launch().to_str().unwrap())
    )
}

/// A status line: `N tokens at X tok/s · context U of L · T tokens a step`.
fn status_lines(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .filter(|l| {
            l.contains(" tokens at ")
                && l.contains(" tok/s · context ")
                && l.ends_with(" tokens a step")
        })
        .collect()
}

#[test]
fn chat_streams_folds_thinking_cancels_and_quits() {
    let t = Tmux::start("chat", &chat_command("KORE_LAUNCH_FAKE_DELAY_MS=3"));
    t.wait_for("the banner", |s| s.contains("/help for commands"));

    // A first answer: thinking folded, the answer, the status line.
    t.type_line("Hello Kore");
    let s = t.wait_for("the first status line", |s| status_lines(s).len() == 1);
    let after = &s[s.find("> Hello Kore").expect("the typed message")..];
    let lines: Vec<&str> = after.lines().collect();
    assert!(lines[1].starts_with("Thought for ") && lines[1].ends_with(" s"), "{after}");
    assert_eq!(lines[2], "Hello Kore", "{after}");
    assert!(!s.contains("Thinking about"), "thinking was not folded:\n{s}");
    // Byte tokens: "Thinking about: " (16) + message (10) + "</think>" + "\n\n" +
    // message (10) + "<|im_end|>" = 40.
    let status = status_lines(&s)[0];
    assert!(status.starts_with("40 tokens at "), "{status}");
    assert!(status.contains(" of 65536 · 1.00 tokens a step"), "{status}");

    // Multi-line input with thinking off: the answer echoes both lines.
    t.type_line("/think off");
    t.wait_for("thinking off", |s| s.contains("(thinking off)"));
    t.type_line("first line \\");
    t.type_line("second line");
    let s = t.wait_for("the second status line", |s| status_lines(s).len() == 2);
    assert!(
        s.contains("first line \nsecond line\n") || s.contains("first line\nsecond line\n"),
        "{s}"
    );

    // Ctrl-C in the middle of a long answer cancels it, not the session.
    t.type_line("forever and ever");
    t.wait_count("forever and ever forever and ever", 2);
    t.key("C-c");
    t.wait_for("the cancel note", |s| s.contains("(cancelled; this exchange is not kept"));
    t.type_line("/stats");
    let s = t.wait_for("the stats", |s| s.contains("session: 2 answers"));
    assert!(s.contains("4 messages in the conversation"), "{s}");
    assert_eq!(status_lines(&s).len(), 2, "a cancelled answer has no status line:\n{s}");

    // The session still answers, then /quit ends it with exit code 0.
    t.type_line("still here?");
    t.wait_for("the third status line", |s| status_lines(s).len() == 3);
    t.type_line("/quit");
    t.wait_for("the exit", |s| s.contains("EXITED:0"));
}

#[test]
fn ctrl_c_at_the_prompt_and_ctrl_d() {
    let t = Tmux::start("prompt", &chat_command(""));
    t.wait_for("the banner", |s| s.contains("/help for commands"));
    t.key("C-c");
    t.wait_for("the hint", |s| s.contains("(Ctrl-C cancels an answer; /quit or Ctrl-D leaves)"));
    t.type_line("/help");
    t.wait_for("the help", |s| s.contains("/think on|off"));
    t.type_line("/bogus");
    t.wait_for("the unknown-command note", |s| s.contains("unknown command /bogus"));
    t.key("C-d");
    t.wait_for("the exit", |s| s.contains("EXITED:0"));
}
