//! Bounded line framing: splits a byte stream into lines of at most a
//! configured length, resynchronising at the next newline after an over-long
//! line so that one bad line never poisons the rest of the connection.

use alloc::vec::Vec;

/// One item produced by the framer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its `\n` (and without a trailing `\r`).
    Line(Vec<u8>),
    /// A line longer than the limit was seen; its bytes were discarded up to
    /// and including its newline. `seen` counts the bytes received for it
    /// before the framer gave up (at least `limit + 1`).
    TooLong {
        /// Bytes of the over-long line seen when it was rejected.
        seen: usize,
    },
}

/// Splits incoming bytes into [`Frame`]s, holding at most `limit` bytes of a
/// partial line at any time.
#[derive(Debug)]
pub struct LineFramer {
    limit: usize,
    buf: Vec<u8>,
    /// True while skipping the rest of an over-long line.
    discarding: bool,
}

impl LineFramer {
    /// A framer accepting lines of at most `limit` bytes (newline excluded).
    pub fn new(limit: usize) -> Self {
        Self { limit, buf: Vec::new(), discarding: false }
    }

    /// Bytes of a partial line currently buffered.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Feeds `bytes`, appending every completed frame to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (chunk, rest, complete) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &bytes[bytes.len()..], false),
            };
            bytes = rest;
            if self.discarding {
                if complete {
                    self.discarding = false;
                }
                continue;
            }
            if self.buf.len() + chunk.len() > self.limit {
                out.push(Frame::TooLong { seen: self.buf.len() + chunk.len() });
                self.buf.clear();
                self.discarding = !complete;
                continue;
            }
            self.buf.extend_from_slice(chunk);
            if complete {
                let mut line = core::mem::take(&mut self.buf);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                out.push(Frame::Line(line));
            }
        }
    }

    /// The stream ended: a final unterminated line (if any, and not being
    /// discarded) is returned as a frame.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        if !self.discarding && !self.buf.is_empty() {
            let mut line = core::mem::take(&mut self.buf);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            out.push(Frame::Line(line));
        }
        self.buf.clear();
        self.discarding = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn frames(limit: usize, parts: &[&[u8]]) -> Vec<Frame> {
        let mut f = LineFramer::new(limit);
        let mut out = Vec::new();
        for p in parts {
            f.push(p, &mut out);
        }
        out
    }

    #[test]
    fn splits_lines_across_chunks() {
        let out = frames(100, &[b"ab", b"c\nde\r\n", b"f"]);
        assert_eq!(out, vec![Frame::Line(b"abc".to_vec()), Frame::Line(b"de".to_vec())]);
    }

    #[test]
    fn over_long_line_resyncs_at_newline() {
        let out = frames(4, &[b"12345", b"678\nok\n"]);
        assert_eq!(out, vec![Frame::TooLong { seen: 5 }, Frame::Line(b"ok".to_vec())]);
        // Exactly at the limit is accepted.
        let out = frames(4, &[b"1234\n12345\nx\n"]);
        assert_eq!(
            out,
            vec![
                Frame::Line(b"1234".to_vec()),
                Frame::TooLong { seen: 5 },
                Frame::Line(b"x".to_vec())
            ]
        );
    }

    #[test]
    fn finish_flushes_unterminated_line() {
        let mut f = LineFramer::new(10);
        let mut out = Vec::new();
        f.push(b"abc", &mut out);
        assert!(out.is_empty());
        f.finish(&mut out);
        assert_eq!(out, vec![Frame::Line(b"abc".to_vec())]);
    }
}
