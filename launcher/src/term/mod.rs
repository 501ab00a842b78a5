//! Terminal helpers for the interactive commands, on plain std I/O and libc:
//! Ctrl-C as a flag ([`sigint`]), reading multi-line input ([`input`]), and
//! rendering a streamed answer with folded thinking ([`render`]), progress
//! bars for long work ([`progress`]).

pub mod input;
pub mod progress;
pub mod render;
pub mod sigint;

/// True when stdout is a terminal.
pub fn stdout_is_tty() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal()
}

/// Columns and rows of the terminal on stdout (80x24 when unknown).
pub fn size() -> (usize, usize) {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we pass, which lives
    // for the whole call.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 && ws.ws_row > 0 {
        (usize::from(ws.ws_col), usize::from(ws.ws_row))
    } else {
        (80, 24)
    }
}
