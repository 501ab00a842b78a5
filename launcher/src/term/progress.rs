//! Progress bars on stderr ([`Bar`], indicatif), for the long work of
//! reading, checking and writing packs.

use std::cell::RefCell;

use indicatif::{ProgressBar, ProgressStyle};
use kore_pack::Progress;

/// indicatif progress bars on stderr (hidden when stderr is not a terminal).
#[derive(Default)]
pub struct Bar(RefCell<Option<ProgressBar>>);

impl Progress for Bar {
    fn start(&self, label: &str, total: u64) {
        let bar = ProgressBar::new(total);
        let style = ProgressStyle::with_template(
            "{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(label.to_string());
        *self.0.borrow_mut() = Some(bar);
    }

    fn inc(&self, n: u64) {
        if let Some(b) = self.0.borrow().as_ref() {
            b.inc(n);
        }
    }

    fn finish(&self) {
        if let Some(b) = self.0.borrow_mut().take() {
            b.finish_and_clear();
        }
    }
}
