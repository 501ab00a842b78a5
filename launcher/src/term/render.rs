//! Rendering one streamed answer: thinking text streams dimmed, and when the
//! answer starts it is erased and folded into one line `Thought for N s`;
//! the answer streams as plain text. Without a terminal no escapes are
//! written and the thinking text is not shown, only the fold line.

use std::io::{self, Write};
use std::time::Instant;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// State of one answer on the screen.
#[derive(Debug)]
pub struct Renderer<W: Write> {
    out: W,
    tty: bool,
    width: usize,
    height: usize,
    thinking_since: Option<Instant>,
    folded: bool,
    /// Rows the thinking text occupies below its first row, and the column after it.
    rows: usize,
    col: usize,
    /// Column after the last answer character (0 = at a line start).
    answer_col: usize,
}

impl<W: Write> Renderer<W> {
    /// A renderer writing to `out`; `tty` enables escapes, `size` is (columns, rows).
    pub fn new(out: W, tty: bool, size: (usize, usize)) -> Self {
        Self {
            out,
            tty,
            width: size.0.max(1),
            height: size.1.max(2),
            thinking_since: None,
            folded: false,
            rows: 0,
            col: 0,
            answer_col: 0,
        }
    }

    /// Streams thinking text.
    pub fn thinking(&mut self, text: &str) -> io::Result<()> {
        if self.folded {
            // Thinking after the answer started: shown like answer text.
            return self.answer(text);
        }
        if self.thinking_since.is_none() {
            self.thinking_since = Some(Instant::now());
            if self.tty {
                write!(self.out, "{DIM}")?;
            }
        }
        if self.tty {
            self.track(text);
            write!(self.out, "{text}")?;
            self.out.flush()?;
        }
        Ok(())
    }

    /// Streams answer text (folding the thinking first, once).
    pub fn answer(&mut self, text: &str) -> io::Result<()> {
        self.fold()?;
        write!(self.out, "{text}")?;
        self.out.flush()?;
        for c in text.chars() {
            self.answer_col = if c == '\n' { 0 } else { self.answer_col + 1 };
        }
        Ok(())
    }

    /// Ends the answer: folds any open thinking and ends the last line.
    pub fn end(&mut self) -> io::Result<()> {
        self.fold()?;
        if self.answer_col > 0 {
            writeln!(self.out)?;
            self.answer_col = 0;
        }
        self.out.flush()
    }

    /// Writes a dimmed line (status and notes), on a line of its own.
    pub fn note(&mut self, text: &str) -> io::Result<()> {
        self.end()?;
        if self.tty {
            writeln!(self.out, "{DIM}{text}{RESET}")?;
        } else {
            writeln!(self.out, "{text}")?;
        }
        self.out.flush()
    }

    fn fold(&mut self) -> io::Result<()> {
        if self.folded {
            return Ok(());
        }
        self.folded = true;
        let Some(since) = self.thinking_since else { return Ok(()) };
        let secs = since.elapsed().as_secs_f64();
        if self.tty {
            write!(self.out, "{RESET}\r")?;
            let up = self.rows.min(self.height - 1);
            if up > 0 {
                write!(self.out, "\x1b[{up}A")?;
            }
            writeln!(self.out, "\x1b[J{DIM}Thought for {}{RESET}", fmt_secs(secs))?;
        } else {
            writeln!(self.out, "Thought for {}", fmt_secs(secs))?;
        }
        self.out.flush()
    }

    /// Counts the rows `text` takes on a terminal `width` columns wide.
    fn track(&mut self, text: &str) {
        for c in text.chars() {
            if c == '\n' {
                self.rows += 1;
                self.col = 0;
            } else {
                if self.col == self.width {
                    self.rows += 1;
                    self.col = 0;
                }
                self.col += 1;
            }
        }
    }
}

/// `0.4 s`, `12 s`.
pub fn fmt_secs(secs: f64) -> String {
    if secs < 10.0 {
        format!("{secs:.1} s")
    } else {
        format!("{secs:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_wrapped_thinking_into_one_line() {
        let mut buf = Vec::new();
        let mut r = Renderer::new(&mut buf, true, (10, 24));
        r.thinking("abcdefghijKL\nmn").unwrap(); // 10 + 2 chars wrap, then a newline: 2 rows below
        r.answer("Hi").unwrap();
        r.thinking("late").unwrap();
        r.end().unwrap();
        let s = String::from_utf8(buf).unwrap();
        let fold = s.find("\x1b[2A\x1b[J").expect("cursor up over the 3 thinking rows, clear");
        assert!(s[fold..].contains("Thought for "), "{s:?}");
        assert!(s.ends_with("Hilate\n"), "{s:?}");
    }

    #[test]
    fn plain_output_hides_thinking() {
        let mut buf = Vec::new();
        let mut r = Renderer::new(&mut buf, false, (80, 24));
        r.thinking("secret").unwrap();
        r.answer("Hello").unwrap();
        r.end().unwrap();
        r.note("1 tokens").unwrap();
        let s = String::from_utf8(buf).unwrap();
        assert!(s.starts_with("Thought for "), "{s:?}");
        assert!(s.ends_with(" s\nHello\n1 tokens\n"), "{s:?}");
        assert!(!s.contains('\x1b') && !s.contains("secret"), "{s:?}");
    }
}
