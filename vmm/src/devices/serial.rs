//! The 16550 serial console (vm-superio) and its host sink: each complete
//! line goes to `tracing` (target `kore_guest`) and to a ring buffer of the
//! last lines, used in error reports.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// The last console lines, shared between the device and the VM handle.
#[derive(Default)]
pub struct ConsoleLog {
    lines: VecDeque<String>,
    cap: usize,
    partial: Vec<u8>,
}

impl ConsoleLog {
    /// A log keeping the last `cap` lines.
    pub fn new(cap: usize) -> Self {
        Self { lines: VecDeque::new(), cap: cap.max(1), partial: Vec::new() }
    }

    fn push_bytes(&mut self, buf: &[u8]) {
        for &b in buf {
            if b == b'\n' {
                let line =
                    String::from_utf8_lossy(&self.partial).trim_end_matches('\r').to_string();
                self.partial.clear();
                tracing::info!(target: "kore_guest", "{line}");
                if self.lines.len() == self.cap {
                    self.lines.pop_front();
                }
                self.lines.push_back(line);
            } else if self.partial.len() < 4096 {
                self.partial.push(b);
            }
        }
    }

    /// The kept lines, oldest first, plus an unterminated last line if any.
    pub fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lines.iter().cloned().collect();
        if !self.partial.is_empty() {
            v.push(String::from_utf8_lossy(&self.partial).into_owned());
        }
        v
    }
}

/// The serial output sink.
pub struct Sink(pub Arc<Mutex<ConsoleLog>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut log) = self.0.lock() {
            log.push_bytes(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Interrupt trigger: an eventfd registered as the COM1 irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The console device.
pub type SerialDevice = Serial<IrqTrigger, NoEvents, Sink>;

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let (Some(b), Ok(reg)) = (data.first_mut(), u8::try_from(offset)) {
            *b = Serial::read(self, reg);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (Some(&b), Ok(reg)) = (data.first(), u8::try_from(offset)) else { return };
        if let Err(e) = Serial::write(self, reg, b) {
            tracing::warn!("serial write failed: {e:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_capped() {
        let mut log = ConsoleLog::new(2);
        log.push_bytes(b"a\r\nb\nc\nd");
        assert_eq!(log.lines(), vec!["b", "c", "d"]);
    }
}
