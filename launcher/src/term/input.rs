//! Reading what the person types: one message per Enter, or several lines
//! when a line ends with `\` or inside a `"""` block. Ctrl-C at the prompt
//! abandons the message being typed (the session goes on); Ctrl-D ends it.

use std::io::{BufRead, ErrorKind, Write};

use super::sigint;

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A message (lines joined with `\n`, without the continuation marks).
    Text(String),
    /// Ctrl-C while typing.
    Interrupted,
    /// End of input (Ctrl-D on an empty line, or a closed pipe).
    Eof,
}

/// Prompts with `prompt` (and `cont` for continuation lines) and reads one message.
pub fn read_message(input: &mut impl BufRead, prompt: &str, cont: &str) -> std::io::Result<Input> {
    let mut out = std::io::stdout();
    write!(out, "{prompt}")?;
    out.flush()?;
    let mut lines: Vec<String> = Vec::new();
    let mut in_block = false;
    loop {
        let line = match read_line(input)? {
            Line::Text(l) => l,
            Line::Interrupted => return Ok(Input::Interrupted),
            Line::Eof if lines.is_empty() => return Ok(Input::Eof),
            Line::Eof => return Ok(Input::Text(lines.join("\n"))),
        };
        if in_block {
            if line.trim_end() == "\"\"\"" {
                return Ok(Input::Text(lines.join("\n")));
            }
            lines.push(line);
        } else if lines.is_empty() && line.trim() == "\"\"\"" {
            in_block = true;
        } else if let Some(head) = line.strip_suffix('\\') {
            lines.push(head.to_owned());
        } else {
            lines.push(line);
            return Ok(Input::Text(lines.join("\n")));
        }
        write!(out, "{cont}")?;
        out.flush()?;
    }
}

enum Line {
    Text(String),
    Interrupted,
    Eof,
}

/// One line without its newline; EINTR with a pending Ctrl-C is `Interrupted`.
fn read_line(input: &mut impl BufRead) -> std::io::Result<Line> {
    let mut bytes = Vec::new();
    loop {
        let buf = match input.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                if sigint::take() {
                    return Ok(Line::Interrupted);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if bytes.is_empty() { Line::Eof } else { Line::Text(finish(bytes)) });
        }
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            bytes.extend_from_slice(&buf[..i]);
            input.consume(i + 1);
            return Ok(Line::Text(finish(bytes)));
        }
        let n = buf.len();
        bytes.extend_from_slice(buf);
        input.consume(n);
    }
}

fn finish(mut bytes: Vec<u8>) -> String {
    if bytes.last() == Some(&b'\r') {
        bytes.pop();
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &str) -> Vec<Input> {
        let mut r = std::io::Cursor::new(text.as_bytes().to_vec());
        let mut out = Vec::new();
        loop {
            let m = read_message(&mut r, "", "").unwrap();
            let end = m == Input::Eof;
            out.push(m);
            if end {
                return out;
            }
        }
    }

    #[test]
    fn joins_continued_lines_and_blocks() {
        let got = read_all("one\ntwo \\\nthree\n\"\"\"\na\n\nb\n\"\"\"\nlast");
        assert_eq!(
            got,
            vec![
                Input::Text("one".into()),
                Input::Text("two \nthree".into()),
                Input::Text("a\n\nb".into()),
                Input::Text("last".into()),
                Input::Eof
            ]
        );
    }
}
