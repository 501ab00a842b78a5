//! The byte-level machine: a thread is a stack of small frames (a JSON
//! object being written, a string, a literal, free text, a tool call...);
//! [`step`] advances it by one byte or one special token. `anyOf` forks a
//! thread, so a matcher keeps a set of them.
//!
//! Frames set their own "after" state before pushing a child, so that a
//! finished child only reports an outcome (which key, which tool) to its
//! parent. A frame that cannot take a symbol but may end (a number, a literal
//! with a longer alternative, free text) ends and passes the symbol on.

use alloc::vec::Vec;

use crate::grammar::END_PARAMS;
use crate::grammar::{lit, Body, Grammar, Node, ParamValue, ANY_ARRAY, ANY_OBJECT};
use crate::tools::ToolChoice;
use crate::trie::NO_END;

/// A special token the grammar gives meaning to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// `<tool_call>`.
    ToolOpen = 0,
    /// `</tool_call>`.
    ToolClose = 1,
    /// `</think>`.
    ThinkEnd = 2,
}

/// What a thread reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sym {
    Byte(u8),
    Special(Special),
}

pub(crate) mod tag {
    pub const VALUE: u8 = 1;
    pub const OBJ: u8 = 2;
    pub const KEY: u8 = 3;
    pub const ARR: u8 = 4;
    pub const STR: u8 = 5;
    pub const NUM: u8 = 6;
    pub const LIT: u8 = 7;
    pub const TEXT: u8 = 8;
    pub const ROOT: u8 = 9;
    pub const CALL: u8 = 10;
}

/// String states: 1..=8 are the UTF-8 states of content (1: between
/// characters), then the escape states.
pub(crate) mod s {
    pub const OPEN: u8 = 0;
    pub const C: u8 = 1;
    pub const N1: u8 = 2;
    pub const N2: u8 = 3;
    pub const N3: u8 = 4;
    pub const E0: u8 = 5;
    pub const ED: u8 = 6;
    pub const F0: u8 = 7;
    pub const F4: u8 = 8;
    pub const ESC: u8 = 9;
    pub const U1: u8 = 10;
    pub const UD: u8 = 11;
    pub const U2: u8 = 12;
    pub const U3: u8 = 13;
    pub const U4: u8 = 14;
    pub const H3: u8 = 15;
    pub const H4: u8 = 16;
    pub const LB: u8 = 17;
    pub const LU: u8 = 18;
    pub const LD: u8 = 19;
    pub const LC: u8 = 20;
    pub const L3: u8 = 21;
    pub const L4: u8 = 22;
}

/// Text kinds.
pub(crate) mod text {
    /// Free text before tool calls: never spells `<tool_call>` out.
    pub const FREE: u8 = 0;
    /// Reasoning, up to the `</think>` token.
    pub const THINK: u8 = 1;
    /// A raw parameter value: UTF-8, ends at `\n</parameter>`.
    pub const RAW: u8 = 2;
}

const FREE_PATTERN: &[u8] = b"<tool_call>";
const RAW_PATTERN: &[u8] = b"</parameter>";

/// One frame; the fields' meaning depends on `tag` (see the step functions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Frame {
    pub tag: u8,
    pub st: u8,
    pub ws: u8,
    pub x: u8,
    pub a: u32,
    pub b: u32,
}

/// Most frames in one thread.
pub(crate) const MAX_FRAMES: usize = 20;

/// A stack of frames, the bottom one a root frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thread {
    len: u8,
    f: [Frame; MAX_FRAMES],
}

impl PartialEq for Thread {
    /// Equal stacks (frames above the top are leftovers and do not count).
    fn eq(&self, other: &Thread) -> bool {
        self.f[..self.len as usize] == other.f[..other.len as usize]
    }
}

/// Root states.
mod root {
    pub const LEAD: u8 = 0;
    pub const DONE: u8 = 1;
    pub const AUTO: u8 = 2;
    pub const AFTER_CALL: u8 = 3;
    pub const NEXT: u8 = 4;
}

impl Thread {
    /// The start of `g`'s output.
    pub(crate) fn initial(g: &Grammar) -> Thread {
        let mut t = Thread { len: 0, f: [Frame::default(); MAX_FRAMES] };
        t.push(Frame { tag: tag::ROOT, st: root::LEAD, ..Frame::default() });
        if g.options.think {
            t.push(Frame { tag: tag::TEXT, x: text::THINK, st: s::C, ..Frame::default() });
        }
        t
    }

    #[inline]
    pub(crate) fn top(&self) -> &Frame {
        &self.f[self.len as usize - 1]
    }

    #[inline]
    pub(crate) fn top_mut(&mut self) -> &mut Frame {
        &mut self.f[self.len as usize - 1]
    }

    #[inline]
    fn push(&mut self, fr: Frame) -> bool {
        if self.len as usize == MAX_FRAMES {
            return false;
        }
        self.f[self.len as usize] = fr;
        self.len += 1;
        true
    }

    fn parent(&self) -> &Frame {
        &self.f[self.len as usize - 2]
    }

    /// Pops the finished top frame and tells its parent `outcome`.
    fn pop_done(&mut self, g: &Grammar, outcome: u32) {
        self.len -= 1;
        let p = self.top_mut();
        match p.tag {
            tag::OBJ if p.st == obj::COLON => {
                let next = if outcome == ADDITIONAL {
                    match &g.nodes[p.a as usize] {
                        Node::Object(o) => o.props.len() as u32,
                        _ => 0,
                    }
                } else {
                    outcome + 1
                };
                p.b = (outcome << 16) | next;
            }
            tag::CALL if p.st == call::NAMED => {
                p.a = outcome;
                p.b = 0;
                p.st = call::PARAMS;
            }
            tag::CALL if p.st == call::HEADER => {
                if outcome == END_PARAMS {
                    p.st = call::CLOSE;
                } else {
                    p.b = outcome + 1;
                    p.x = outcome as u8;
                    p.st = call::VALUE;
                }
            }
            _ => {}
        }
    }

    /// Returns the thread with its top frame's lexical state reset (between
    /// characters, no pattern in progress): the state at a bulk lexer's exit.
    pub(crate) fn normalized(&self) -> Thread {
        let mut t = *self;
        let f = t.top_mut();
        f.st = s::C;
        if f.tag == tag::TEXT {
            f.ws = 0;
            f.b = 0;
        }
        t
    }
}

/// Outcome of a key that is not declared.
const ADDITIONAL: u32 = 0xFFFF;

/// A key frame off the declared-key trie.
const FREE: u32 = u32::MAX;

mod obj {
    pub const OPEN: u8 = 0;
    pub const FIRST: u8 = 1;
    pub const KEY: u8 = 2;
    pub const COLON: u8 = 3;
    pub const VAL: u8 = 4;
    pub const AFTER: u8 = 5;
}

mod arr {
    pub const OPEN: u8 = 0;
    pub const FIRST: u8 = 1;
    pub const AFTER: u8 = 2;
    pub const NEXT: u8 = 3;
}

mod num {
    pub const START: u8 = 0;
    pub const NEG: u8 = 1;
    pub const ZERO: u8 = 2;
    pub const INT: u8 = 3;
    pub const DOT: u8 = 4;
    pub const FRAC: u8 = 5;
    pub const EXP: u8 = 6;
    pub const EXPS: u8 = 7;
    pub const EXPD: u8 = 8;
    /// Most digits in the integer or fraction part (f64 keeps them exact).
    pub const MAX_DIGITS: u8 = 15;
    /// Most exponent digits: with at most 15 digits before the point, two
    /// keep every number within f64's finite range (a third let `-27e308`
    /// through, which JSON parsers refuse as out of range).
    pub const MAX_EXP_DIGITS: u8 = 2;
}

mod call {
    pub const HEAD: u8 = 0;
    pub const NAME: u8 = 1;
    pub const NAMED: u8 = 2;
    pub const PARAMS: u8 = 3;
    pub const HEADER: u8 = 4;
    pub const VALUE: u8 = 5;
    pub const JSON_END: u8 = 6;
    pub const NL: u8 = 7;
    pub const CLOSE: u8 = 8;
}

/// What a frame did with a symbol.
enum R {
    /// Consumed.
    Done,
    /// The thread changed without consuming; run the symbol again.
    Retry,
    /// Not this frame's: end it (if it can) and pass the symbol on.
    NotMine,
    /// Dead.
    Reject,
}

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

#[inline]
fn is_hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

/// The UTF-8 part of string states: from `st` (1..=8) by `c`; ASCII only from 1.
#[inline]
pub(crate) fn utf8(st: u8, c: u8) -> Option<u8> {
    let cont = (0x80..=0xBF).contains(&c);
    match st {
        s::C => match c {
            0..=0x7F => Some(s::C),
            0xC2..=0xDF => Some(s::N1),
            0xE0 => Some(s::E0),
            0xE1..=0xEC | 0xEE..=0xEF => Some(s::N2),
            0xED => Some(s::ED),
            0xF0 => Some(s::F0),
            0xF1..=0xF3 => Some(s::N3),
            0xF4 => Some(s::F4),
            _ => None,
        },
        s::N1 if cont => Some(s::C),
        s::N2 if cont => Some(s::N1),
        s::N3 if cont => Some(s::N2),
        s::E0 if (0xA0..=0xBF).contains(&c) => Some(s::N1),
        s::ED if (0x80..=0x9F).contains(&c) => Some(s::N1),
        s::F0 if (0x90..=0xBF).contains(&c) => Some(s::N2),
        s::F4 if (0x80..=0x8F).contains(&c) => Some(s::N2),
        _ => None,
    }
}

/// JSON string content and escapes (not the quotes): the next state.
#[inline]
pub(crate) fn str_byte(st: u8, c: u8) -> Option<u8> {
    match st {
        s::C if c == b'\\' => Some(s::ESC),
        s::C if c < 0x20 || c == b'"' => None,
        s::C..=s::F4 => utf8(st, c),
        s::ESC => match c {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(s::C),
            b'u' => Some(s::U1),
            _ => None,
        },
        s::U1 if c == b'd' || c == b'D' => Some(s::UD),
        s::U1 if is_hex(c) => Some(s::U2),
        s::UD => match c {
            b'0'..=b'7' => Some(s::U3),
            b'8' | b'9' | b'a' | b'b' | b'A' | b'B' => Some(s::H3),
            _ => None,
        },
        s::U2 if is_hex(c) => Some(s::U3),
        s::U3 if is_hex(c) => Some(s::U4),
        s::U4 if is_hex(c) => Some(s::C),
        s::H3 if is_hex(c) => Some(s::H4),
        s::H4 if is_hex(c) => Some(s::LB),
        s::LB if c == b'\\' => Some(s::LU),
        s::LU if c == b'u' => Some(s::LD),
        s::LD if c == b'd' || c == b'D' => Some(s::LC),
        s::LC if matches!(c, b'c'..=b'f' | b'C'..=b'F') => Some(s::L3),
        s::L3 if is_hex(c) => Some(s::L4),
        s::L4 if is_hex(c) => Some(s::C),
        _ => None,
    }
}

/// Advances `t` by `sym`, pushing the surviving threads into `out`.
pub(crate) fn step(g: &Grammar, t: &Thread, sym: Sym, out: &mut Vec<Thread>) {
    let mut t = *t;
    run(g, &mut t, sym, out);
}

fn run(g: &Grammar, t: &mut Thread, sym: Sym, out: &mut Vec<Thread>) {
    loop {
        let top = *t.top();
        if top.tag == tag::VALUE {
            if let Node::AnyOf(alts) = &g.nodes[top.a as usize] {
                for &alt in alts {
                    let mut u = *t;
                    u.top_mut().a = alt;
                    run(g, &mut u, sym, out);
                }
                return;
            }
        }
        let r = match top.tag {
            tag::VALUE => value(g, t, sym),
            tag::OBJ => object(g, t, sym),
            tag::KEY => key(g, t, sym),
            tag::ARR => array(g, t, sym),
            tag::STR => string(g, t, sym),
            tag::NUM => number(t, sym),
            tag::LIT => literal(g, t, sym),
            tag::TEXT => free_text(g, t, sym),
            tag::CALL => tool_call(g, t, sym),
            _ => root_frame(g, t, sym),
        };
        match r {
            R::Done => return out.push(*t),
            R::Retry => continue,
            R::Reject => return,
            R::NotMine => match finish_outcome(g, t.top()) {
                Some(o) if t.len > 1 => t.pop_done(g, o),
                _ => return,
            },
        }
    }
}

/// The outcome of ending the frame now, if it may end.
fn finish_outcome(g: &Grammar, f: &Frame) -> Option<u32> {
    match f.tag {
        tag::NUM => matches!(f.st, num::ZERO | num::INT | num::FRAC | num::EXPD).then_some(0),
        tag::LIT => {
            let end = g.tries[f.a as usize].nodes[f.b as usize].end;
            (end != NO_END).then_some(end)
        }
        tag::TEXT => (f.x == text::FREE).then_some(0),
        _ => None,
    }
}

/// Whether the output may end here.
pub(crate) fn accepting(g: &Grammar, t: &Thread) -> bool {
    let mut t = *t;
    while t.len > 1 {
        match finish_outcome(g, t.top()) {
            Some(o) => t.pop_done(g, o),
            None => return false,
        }
    }
    let r = t.top();
    match &g.body {
        Body::Json(_) => r.st == root::DONE,
        Body::Tools(tg) => match r.st {
            root::AUTO | root::AFTER_CALL => true,
            root::LEAD => tg.choice == ToolChoice::Auto,
            _ => false,
        },
    }
}

fn push_or_reject(t: &mut Thread, f: Frame) -> R {
    if t.push(f) {
        R::Retry
    } else {
        R::Reject
    }
}

fn value_frame(node: u32) -> Frame {
    Frame { tag: tag::VALUE, a: node, ..Frame::default() }
}

fn lit_frame(trie: u32) -> Frame {
    Frame { tag: tag::LIT, a: trie, ..Frame::default() }
}

fn value(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::Reject };
    let node = t.top().a;
    let f = t.top_mut();
    *f = match &g.nodes[node as usize] {
        Node::Any => match c {
            b'{' => Frame { tag: tag::OBJ, a: ANY_OBJECT, ..Frame::default() },
            b'[' => Frame { tag: tag::ARR, a: ANY_ARRAY, ..Frame::default() },
            b'"' => Frame { tag: tag::STR, ..Frame::default() },
            b'-' | b'0'..=b'9' => Frame { tag: tag::NUM, ..Frame::default() },
            b't' => lit_frame(lit::TRUE),
            b'f' => lit_frame(lit::FALSE),
            b'n' => lit_frame(lit::NULL),
            _ => return R::Reject,
        },
        Node::Object(_) => Frame { tag: tag::OBJ, a: node, ..Frame::default() },
        Node::Array { .. } => Frame { tag: tag::ARR, a: node, ..Frame::default() },
        Node::String => Frame { tag: tag::STR, ..Frame::default() },
        Node::Number { integer } => Frame { tag: tag::NUM, x: *integer as u8, ..Frame::default() },
        Node::Literals(trie) => lit_frame(*trie),
        Node::AnyOf(_) => return R::Reject,
    };
    R::Retry
}

/// Counts whitespace byte `c` of a gap between JSON tokens: at most
/// `max_ws` bytes, of which one line feed (indentation after one line
/// break, as llama.cpp's JSON grammar allows); false past that, so a model
/// cannot spend its answer on blank lines. The frame's `ws` keeps the count
/// and, in its top bit, whether the gap had its line feed.
fn gap(g: &Grammar, f: &mut Frame, c: u8) -> bool {
    const LINE: u8 = 0x80;
    if c == b'\n' {
        if f.ws & LINE != 0 {
            return false;
        }
        f.ws |= LINE;
    }
    let n = (f.ws & !LINE) + 1;
    f.ws = (f.ws & LINE) | n;
    n <= g.options.max_ws.min(!LINE)
}

fn object(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::Reject };
    let f = *t.top();
    let Node::Object(o) = &g.nodes[f.a as usize] else { return R::Reject };
    let next = (f.b & 0xFFFF) as usize;
    let len = o.props.len();
    let no_required_left = o.first_required[next.min(len)] as usize == len;
    let key_possible = next < len || (o.additional.is_some() && no_required_left);
    let fm = t.top_mut();
    match f.st {
        obj::OPEN if c == b'{' => fm.st = obj::FIRST,
        obj::FIRST | obj::KEY | obj::COLON | obj::VAL | obj::AFTER if is_ws(c) => {
            return if gap(g, fm, c) { R::Done } else { R::Reject }
        }
        obj::FIRST | obj::KEY if c == b'"' && key_possible => {
            fm.st = obj::COLON;
            fm.ws = 0;
            let free = if len == 0 { FREE } else { 0 };
            let k = Frame { tag: tag::KEY, st: s::C, ws: 0, x: (len == 0) as u8, a: f.a, b: free };
            return if t.push(k) { R::Done } else { R::Reject };
        }
        obj::FIRST | obj::AFTER if c == b'}' && no_required_left => {
            t.pop_done(g, 0);
            return R::Done;
        }
        obj::COLON if c == b':' => {
            fm.st = obj::VAL;
            fm.ws = 0;
        }
        obj::VAL => {
            let cur = f.b >> 16;
            let node =
                if cur == ADDITIONAL { o.additional.unwrap_or(0) } else { o.props[cur as usize].1 };
            fm.st = obj::AFTER;
            fm.ws = 0;
            return push_or_reject(t, value_frame(node));
        }
        obj::AFTER if c == b',' && key_possible => {
            fm.st = obj::KEY;
            fm.ws = 0;
        }
        _ => return R::Reject,
    }
    fm.ws = 0;
    R::Done
}

fn key(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::Reject };
    let f = *t.top();
    let Node::Object(o) = &g.nodes[f.a as usize] else { return R::Reject };
    let next = (t.parent().b & 0xFFFF) as usize;
    let len = o.props.len();
    let first_req = o.first_required[next.min(len)] as usize;
    let additional_ok = o.additional.is_some() && first_req == len;
    if f.st == s::C && c == b'"' {
        let trie = &g.tries[o.keys as usize];
        let end = if f.b == FREE { NO_END } else { trie.nodes[f.b as usize].end };
        if end != NO_END && (next..=first_req).contains(&(end as usize)) {
            t.pop_done(g, end);
            return R::Done;
        }
        if end == NO_END && additional_ok {
            t.pop_done(g, ADDITIONAL);
            return R::Done;
        }
        return R::Reject;
    }
    let Some(st) = str_byte(f.st, c) else { return R::Reject };
    let fm = t.top_mut();
    fm.st = st;
    if f.b == FREE {
        // Off the declared keys: escapes only where no key is declared.
        return if c == b'\\' && f.st == s::C && f.x == 0 { R::Reject } else { R::Done };
    }
    let trie = &g.tries[o.keys as usize];
    match trie.child(f.b, c) {
        Some(ch) => {
            let hi = first_req.min(len.saturating_sub(1));
            let allowed: u64 =
                if next > hi { 0 } else { (u64::MAX >> (63 - hi)) & (u64::MAX << next) };
            if !additional_ok && trie.nodes[ch as usize].below & allowed == 0 {
                return R::Reject;
            }
            fm.b = ch;
            R::Done
        }
        None if additional_ok && f.st == s::C && c != b'\\' => {
            fm.b = FREE;
            R::Done
        }
        None => R::Reject,
    }
}

fn array(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::Reject };
    let f = *t.top();
    let Node::Array { items, min, max } = g.nodes[f.a as usize] else { return R::Reject };
    let fm = t.top_mut();
    match f.st {
        arr::OPEN if c == b'[' => fm.st = arr::FIRST,
        arr::FIRST | arr::AFTER | arr::NEXT if is_ws(c) => {
            return if gap(g, fm, c) { R::Done } else { R::Reject }
        }
        arr::FIRST if c == b']' && min == 0 => {
            t.pop_done(g, 0);
            return R::Done;
        }
        arr::FIRST | arr::NEXT if f.st == arr::NEXT || max > 0 => {
            fm.st = arr::AFTER;
            fm.b += 1;
            fm.ws = 0;
            return push_or_reject(t, value_frame(items));
        }
        arr::AFTER if c == b',' && f.b < max => fm.st = arr::NEXT,
        arr::AFTER if c == b']' && f.b >= min => {
            t.pop_done(g, 0);
            return R::Done;
        }
        _ => return R::Reject,
    }
    fm.ws = 0;
    R::Done
}

fn string(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::Reject };
    let st = t.top().st;
    if st == s::OPEN {
        if c != b'"' {
            return R::Reject;
        }
        t.top_mut().st = s::C;
        return R::Done;
    }
    if st == s::C && c == b'"' {
        t.pop_done(g, 0);
        return R::Done;
    }
    match str_byte(st, c) {
        Some(n) => {
            t.top_mut().st = n;
            R::Done
        }
        None => R::Reject,
    }
}

fn number(t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::NotMine };
    let f = t.top_mut();
    let integer = f.x == 1;
    let digit = c.is_ascii_digit();
    let (st, count) = match (f.st, c) {
        (num::START, b'-') => (num::NEG, 0),
        (num::START | num::NEG, b'0') => (num::ZERO, 1),
        (num::START | num::NEG, b'1'..=b'9') => (num::INT, 1),
        (num::INT, _) if digit && f.ws < num::MAX_DIGITS => (num::INT, f.ws + 1),
        (num::ZERO | num::INT, b'.') if !integer => (num::DOT, 0),
        (num::ZERO | num::INT | num::FRAC, b'e' | b'E') if !integer => (num::EXP, 0),
        (num::DOT, _) if digit => (num::FRAC, 1),
        (num::FRAC, _) if digit && f.ws < num::MAX_DIGITS => (num::FRAC, f.ws + 1),
        (num::EXP, b'+' | b'-') => (num::EXPS, 0),
        (num::EXP | num::EXPS, _) if digit => (num::EXPD, 1),
        (num::EXPD, _) if digit && f.ws < num::MAX_EXP_DIGITS => (num::EXPD, f.ws + 1),
        _ => return R::NotMine,
    };
    f.st = st;
    f.ws = count;
    R::Done
}

fn literal(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Sym::Byte(c) = sym else { return R::NotMine };
    let f = *t.top();
    let trie = &g.tries[f.a as usize];
    let Some(ch) = trie.child(f.b, c) else { return R::NotMine };
    let node = &trie.nodes[ch as usize];
    if node.children.is_empty() {
        t.pop_done(g, node.end);
    } else {
        t.top_mut().b = ch;
    }
    R::Done
}

/// Pattern progress: `k` bytes of `p` matched, then `c` (`p` starts with
/// its only `<`).
#[inline]
fn kmp(p: &[u8], k: u8, c: u8) -> u8 {
    if p[k as usize] == c {
        k + 1
    } else {
        (c == p[0]) as u8
    }
}

fn free_text(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let f = *t.top();
    let c = match sym {
        Sym::Special(Special::ThinkEnd) if f.x == text::THINK => {
            t.pop_done(g, 0);
            return R::Done;
        }
        Sym::Special(_) => return R::NotMine,
        Sym::Byte(c) => c,
    };
    let fm = t.top_mut();
    match f.x {
        text::THINK => R::Done,
        text::FREE => {
            fm.ws = kmp(FREE_PATTERN, f.ws, c);
            if fm.ws as usize == FREE_PATTERN.len() {
                R::Reject
            } else {
                R::Done
            }
        }
        _ => {
            let Some(st) = utf8(f.st, c) else { return R::Reject };
            fm.st = st;
            let k = if st == s::C && c < 0x80 { kmp(RAW_PATTERN, f.ws, c) } else { 0 };
            // b: bit 0 = the last byte was '\n'; bit 1 = the match began after one.
            let began_after_nl = if k == 1 { f.b & 1 } else { (f.b >> 1) & 1 };
            fm.ws = k;
            fm.b = (c == b'\n') as u32 | began_after_nl << 1;
            if k as usize == RAW_PATTERN.len() {
                if began_after_nl == 1 {
                    t.pop_done(g, 0);
                    return R::Done;
                }
                return R::Reject;
            }
            R::Done
        }
    }
}

/// The tool-call frame (`a`: tool, `b`: next parameter, `x`: current one).
fn tool_call(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let Body::Tools(tg) = &g.body else { return R::Reject };
    let f = *t.top();
    let fm = t.top_mut();
    let child = match f.st {
        call::HEAD => {
            fm.st = call::NAME;
            lit_frame(lit::FUNCTION)
        }
        call::NAME => {
            fm.st = call::NAMED;
            lit_frame(tg.names)
        }
        call::PARAMS => {
            fm.st = call::HEADER;
            lit_frame(tg.headers[f.a as usize][f.b as usize])
        }
        call::VALUE => match tg.values[f.a as usize][f.x as usize] {
            ParamValue::Raw => {
                fm.st = call::NL;
                // The tag's newline counts as the byte before the value.
                Frame { tag: tag::TEXT, x: text::RAW, st: s::C, b: 1, ..Frame::default() }
            }
            ParamValue::RawEnum(trie) => {
                fm.st = call::PARAMS;
                lit_frame(trie)
            }
            ParamValue::Json(node) => {
                fm.st = call::JSON_END;
                value_frame(node)
            }
        },
        call::JSON_END => {
            fm.st = call::PARAMS;
            lit_frame(lit::PARAM_END)
        }
        call::NL => {
            fm.st = call::PARAMS;
            lit_frame(lit::NEWLINE)
        }
        call::CLOSE if sym == Sym::Special(Special::ToolClose) => {
            t.pop_done(g, 0);
            return R::Done;
        }
        _ => return R::Reject,
    };
    push_or_reject(t, child)
}

fn root_frame(g: &Grammar, t: &mut Thread, sym: Sym) -> R {
    let f = *t.top();
    let fm = t.top_mut();
    let open_call = |t: &mut Thread| {
        t.top_mut().st = root::AFTER_CALL;
        if t.push(Frame { tag: tag::CALL, st: call::HEAD, ..Frame::default() }) {
            R::Done
        } else {
            R::Reject
        }
    };
    match (&g.body, f.st, sym) {
        (_, root::LEAD, Sym::Byte(c))
            if is_ws(c) && !matches!(&g.body, Body::Tools(tg) if tg.choice == ToolChoice::Auto) =>
        {
            // Any whitespace up to the limit: after `</think>` a model writes a blank line.
            fm.ws += 1;
            if fm.ws <= g.options.max_ws.max(2) {
                R::Done
            } else {
                R::Reject
            }
        }
        (Body::Json(node), root::LEAD, Sym::Byte(_)) => {
            fm.st = root::DONE;
            push_or_reject(t, value_frame(*node))
        }
        (Body::Tools(tg), root::LEAD, _) if tg.choice == ToolChoice::Auto => {
            fm.st = root::AUTO;
            push_or_reject(t, Frame { tag: tag::TEXT, x: text::FREE, st: s::C, ..Frame::default() })
        }
        (Body::Tools(_), root::LEAD | root::AUTO | root::NEXT, Sym::Special(Special::ToolOpen)) => {
            open_call(t)
        }
        (Body::Tools(tg), root::AFTER_CALL, Sym::Byte(b'\n')) if tg.parallel => {
            fm.st = root::NEXT;
            R::Done
        }
        _ => R::Reject,
    }
}
