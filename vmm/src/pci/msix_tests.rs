//! Tests of MSI-X table handling, masking and the PBA.

use std::sync::{Arc, Mutex};

use super::*;

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Ev {
    Route(u16, Option<MsiMessage>),
    Fire(u16),
    Mask(u16, bool),
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Ev>>>);

impl MsiSink for Recorder {
    fn route(&mut self, vector: u16, msg: Option<MsiMessage>) {
        self.0.lock().unwrap().push(Ev::Route(vector, msg));
    }
    fn fire(&mut self, vector: u16) {
        self.0.lock().unwrap().push(Ev::Fire(vector));
    }
    fn mask(&mut self, vector: u16, masked: bool) {
        self.0.lock().unwrap().push(Ev::Mask(vector, masked));
    }
}

impl Recorder {
    /// Routes and fires seen since the last call (mask events dropped).
    fn take(&self) -> Vec<Ev> {
        let all = std::mem::take(&mut *self.0.lock().unwrap());
        all.into_iter().filter(|e| !matches!(e, Ev::Mask(..))).collect()
    }
    fn masks(&self) -> Vec<Ev> {
        let all = std::mem::take(&mut *self.0.lock().unwrap());
        all.into_iter().filter(|e| matches!(e, Ev::Mask(..))).collect()
    }
}

fn setup(n: u16) -> (Msix, Recorder) {
    let r = Recorder::default();
    (Msix::new(n, Box::new(r.clone())), r)
}

fn program(m: &mut Msix, v: u16, addr: u32, data: u32, masked: bool) {
    let base = u64::from(v) * ENTRY_SIZE;
    m.table_write(base, &u64::from(addr).to_le_bytes());
    m.table_write(base + 8, &(u64::from(masked) << 32 | u64::from(data)).to_le_bytes());
}

const APIC0: u32 = 0xfee0_0000;

#[test]
fn capability_bytes() {
    let (m, _) = setup(3);
    let (body, w) = m.capability((2, 0), (2, 0x800));
    assert_eq!(body[0], CAP_ID);
    assert_eq!(u16::from_le_bytes([body[2], body[3]]), 2, "table size - 1");
    assert_eq!(u32::from_le_bytes(body[4..8].try_into().unwrap()), 2);
    assert_eq!(u32::from_le_bytes(body[8..12].try_into().unwrap()), 0x802);
    assert_eq!(w[3], 0xc0, "only Enable and Function Mask are writable");
    assert_eq!(w.iter().filter(|b| **b != 0).count(), 1);
}

#[test]
fn entries_start_masked_and_read_back() {
    let (mut m, _) = setup(2);
    let mut d = [0u8; 4];
    m.table_read(12, &mut d);
    assert_eq!(u32::from_le_bytes(d), 1, "masked after reset");
    program(&mut m, 1, APIC0 | 0x1000, 0x41, false);
    let mut q = [0u8; 8];
    m.table_read(16, &mut q);
    assert_eq!(u64::from_le_bytes(q), u64::from(APIC0 | 0x1000));
    m.table_read(24, &mut q);
    assert_eq!(u64::from_le_bytes(q), 0x41);
    // Reserved vector-control bits are not stored.
    m.table_write(28, &0xffff_fffeu32.to_le_bytes());
    m.table_read(28, &mut d);
    assert_eq!(u32::from_le_bytes(d), 0);
}

#[test]
fn disabled_msix_sends_nothing() {
    let (mut m, r) = setup(1);
    program(&mut m, 0, APIC0, 0x40, false);
    m.trigger(0);
    assert!(r.take().is_empty());
    assert!(!m.pending(0));
}

#[test]
fn enable_routes_and_fires() {
    let (mut m, r) = setup(1);
    program(&mut m, 0, APIC0, 0x40, false);
    m.set_control(CTL_ENABLE);
    m.trigger(0);
    let msg = MsiMessage { addr: u64::from(APIC0), data: 0x40 };
    assert_eq!(r.take(), vec![Ev::Route(0, Some(msg)), Ev::Fire(0)]);
    // Reprogramming while enabled reroutes.
    program(&mut m, 0, APIC0 | 0x1000, 0x41, false);
    let msg = MsiMessage { addr: u64::from(APIC0 | 0x1000), data: 0x41 };
    assert_eq!(r.take().last(), Some(&Ev::Route(0, Some(msg))), "the last route is the new one");
}

#[test]
fn entry_mask_sets_pba_and_unmask_fires_once() {
    let (mut m, r) = setup(2);
    program(&mut m, 1, APIC0, 0x40, true);
    m.set_control(CTL_ENABLE);
    r.take();
    m.trigger(1);
    m.trigger(1);
    assert!(m.pending(1) && !m.pending(0));
    let mut d = [0u8; 8];
    m.pba_read(0, &mut d);
    assert_eq!(u64::from_le_bytes(d), 0b10);
    assert!(r.take().is_empty());
    m.table_write(16 + 12, &0u32.to_le_bytes());
    assert_eq!(r.take(), vec![Ev::Fire(1)], "pending vector fires on unmask, once");
    assert!(!m.pending(1));
}

#[test]
fn function_mask_holds_every_vector() {
    let (mut m, r) = setup(2);
    program(&mut m, 0, APIC0, 0x40, false);
    program(&mut m, 1, APIC0, 0x41, false);
    m.set_control(CTL_ENABLE | CTL_FUNCTION_MASK);
    r.take();
    m.trigger(0);
    m.trigger(1);
    assert!(r.take().is_empty());
    assert!(m.pending(0) && m.pending(1));
    m.set_control(CTL_ENABLE);
    assert_eq!(r.take(), vec![Ev::Fire(0), Ev::Fire(1)]);
}

#[test]
fn garbage_table_is_never_routed_or_fired() {
    let (mut m, r) = setup(1);
    m.set_control(CTL_ENABLE);
    r.take();
    for addr in [0u32, 0xdead_beef, 0xfed0_0000, 0xffff_ffff] {
        program(&mut m, 0, addr, 0xffff_ffff, false);
        m.trigger(0);
    }
    m.table_write(4, &1u32.to_le_bytes()); // upper address non-zero
    m.trigger(0);
    let fires = r.take().into_iter().filter(|e| matches!(e, Ev::Fire(_))).count();
    assert_eq!(fires, 0);
    // Odd sizes, misalignment and out-of-table offsets are ignored.
    m.table_write(1, &[1, 2, 3, 4]);
    m.table_write(0, &[1, 2]);
    m.table_write(16, &[0; 8]);
    m.table_write(u64::MAX - 7, &[0; 8]);
    let mut d = [9u8; 4];
    m.table_read(2, &mut d);
    assert_eq!(d, [0; 4]);
    m.pba_read(8, &mut d);
    assert_eq!(d, [0; 4]);
    m.trigger(7); // no such vector
}

#[test]
fn mask_changes_reach_the_sink() {
    let (mut m, r) = setup(2);
    program(&mut m, 0, APIC0, 0x40, false);
    assert_eq!(r.masks(), vec![Ev::Mask(0, false)], "entry 0 unmasked");
    m.set_control(CTL_ENABLE | CTL_FUNCTION_MASK);
    assert_eq!(r.masks(), vec![Ev::Mask(0, true)], "vector 1 was masked already");
    m.table_write(16 + 12, &0u32.to_le_bytes());
    assert!(r.masks().is_empty(), "function mask still holds vector 1");
    m.set_control(CTL_ENABLE);
    assert_eq!(r.masks(), vec![Ev::Mask(0, false), Ev::Mask(1, false)]);
}
