//! Tests: the socket layer alone, then the whole driver against a fake device in plain memory.
extern crate std;

use alloc::rc::Rc;
use alloc::vec::Vec;
use core::cell::RefCell;
use std::vec;

use kore_virtq::device::DeviceQueue;
use kore_virtq::QueueAddrs;

use crate::mmio::{reg, status, Mmio, VsockDevice, MAGIC_VALUE, RX_BUF_LEN, VSOCK_DEVICE_ID};
use crate::proto::{op, Header, HDR_LEN, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use crate::socket::{Error, Packet, Vsock, MAX_PKT_PAYLOAD};

const GUEST: u64 = 3;
const PORT: u32 = 1025;
const HOST_PORT: u32 = 1 << 30;

fn from_host(op: u16, len: u32, buf_alloc: u32, fwd_cnt: u32) -> Header {
    Header {
        src_cid: HOST_CID,
        dst_cid: GUEST,
        src_port: HOST_PORT,
        dst_port: PORT,
        len,
        type_: TYPE_STREAM,
        op,
        flags: 0,
        buf_alloc,
        fwd_cnt,
    }
}

fn drain(v: &mut Vsock) -> Vec<Packet> {
    core::iter::from_fn(|| v.poll_transmit()).collect()
}

fn connected(buf_alloc: u32) -> (Vsock, crate::ConnId) {
    let mut v = Vsock::with_buf_alloc(GUEST, buf_alloc);
    v.listen(PORT).unwrap();
    v.on_packet(&from_host(op::REQUEST, 0, 1000, 0), &[]);
    let out = drain(&mut v);
    assert_eq!(out.len(), 1);
    let h = out[0].hdr;
    assert_eq!(
        (h.op, h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (op::RESPONSE, GUEST, HOST_CID, PORT, HOST_PORT)
    );
    assert_eq!(h.buf_alloc, buf_alloc);
    let id = v.accept().unwrap();
    (v, id)
}

#[test]
fn header_round_trips_and_rejects_short_input() {
    let h = Header {
        src_cid: 1,
        dst_cid: 2,
        src_port: 3,
        dst_port: 4,
        len: 5,
        type_: 1,
        op: 6,
        flags: 7,
        buf_alloc: 8,
        fwd_cnt: 9,
    };
    let b = h.encode();
    assert_eq!(b.len(), HDR_LEN);
    assert_eq!(&b[24..28], &5u32.to_le_bytes());
    assert_eq!(Header::decode(&b), Some(h));
    assert_eq!(Header::decode(&b[..43]), None);
}

#[test]
fn requests_to_closed_ports_and_other_types_are_reset() {
    let mut v = Vsock::new(GUEST);
    v.on_packet(&from_host(op::REQUEST, 0, 1000, 0), &[]);
    let out = drain(&mut v);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].hdr.op, out[0].hdr.dst_port, out[0].hdr.src_port),
        (op::RST, HOST_PORT, PORT)
    );
    // A packet for another CID is ignored entirely.
    v.on_packet(&Header { dst_cid: 99, ..from_host(op::REQUEST, 0, 0, 0) }, &[]);
    // A RST for an unknown connection gets no answer (no RST ping-pong).
    v.on_packet(&from_host(op::RST, 0, 0, 0), &[]);
    assert!(drain(&mut v).is_empty());
    assert_eq!(v.accept(), None);
    assert_eq!(v.listen(7), Ok(()));
    assert_eq!(v.listen(7), Err(Error::PortInUse));
}

#[test]
fn data_flows_and_credit_updates_follow_consumption() {
    let (mut v, id) = connected(1000);
    assert_eq!(v.read(id, &mut [0; 8]), Err(Error::WouldBlock));
    v.on_packet(&from_host(op::RW, 800, 1000, 0), &[7u8; 800]);
    assert_eq!(v.readable(id), 800);
    let mut buf = [0u8; 100];
    assert_eq!(v.read(id, &mut buf), Ok(100));
    assert!(buf.iter().all(|&b| b == 7));
    // The peer thinks 200 bytes are free (< a quarter of 1000): a credit update goes out.
    let out = drain(&mut v);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].hdr.op, out[0].hdr.fwd_cnt), (op::CREDIT_UPDATE, 100));
    assert_eq!(v.read(id, &mut [0; 1000]), Ok(700));
    // The peer still sees 300 bytes free: no update needed yet.
    assert!(drain(&mut v).is_empty());
    v.on_packet(&from_host(op::RW, 300, 1000, 0), &[8u8; 300]);
    assert_eq!(v.read(id, &mut [0; 1000]), Ok(300));
    assert_eq!(drain(&mut v)[0].hdr.fwd_cnt, 1100);
    // A peer that sends beyond the advertised buffer is reset.
    v.on_packet(&from_host(op::RW, 1001, 1000, 0), &[0u8; 1001]);
    assert_eq!(drain(&mut v)[0].hdr.op, op::RST);
    assert_eq!(v.read(id, &mut buf), Ok(0), "reset reads as end of stream");
    assert_eq!(v.write(id, b"x"), Err(Error::Closed));
}

#[test]
fn writes_respect_peer_credit_and_request_more() {
    let (mut v, id) = connected(4096);
    // The host advertised 1000 bytes of buffer.
    assert_eq!(v.write(id, &[1u8; 600]), Ok(600));
    assert_eq!(v.write(id, &[2u8; 600]), Ok(400));
    assert_eq!(v.send_credit(id), 0);
    assert_eq!(v.write(id, &[3u8; 10]), Err(Error::WouldBlock));
    assert_eq!(v.write(id, &[3u8; 10]), Err(Error::WouldBlock));
    let out = drain(&mut v);
    let ops: Vec<u16> = out.iter().map(|p| p.hdr.op).collect();
    assert_eq!(ops, [op::RW, op::RW, op::CREDIT_REQUEST], "one credit request only");
    assert_eq!(out[0].payload.len() + out[1].payload.len(), 1000);
    assert_eq!(out[1].hdr.len, 400);
    // The host consumed 700 bytes.
    v.on_packet(&from_host(op::CREDIT_UPDATE, 0, 1000, 700), &[]);
    assert_eq!(v.send_credit(id), 700);
    // Big writes are split into packets of at most MAX_PKT_PAYLOAD.
    v.on_packet(&from_host(op::CREDIT_UPDATE, 0, 1 << 20, 1000), &[]);
    assert_eq!(v.write(id, &vec![9u8; 200_000]), Ok(200_000));
    let sizes: Vec<usize> = drain(&mut v).iter().map(|p| p.payload.len()).collect();
    assert_eq!(
        sizes,
        [MAX_PKT_PAYLOAD, MAX_PKT_PAYLOAD, MAX_PKT_PAYLOAD, 200_000 - 3 * MAX_PKT_PAYLOAD]
    );
    // A credit request from the host is answered.
    v.on_packet(&from_host(op::CREDIT_REQUEST, 0, 1 << 20, 0), &[]);
    assert_eq!(drain(&mut v)[0].hdr.op, op::CREDIT_UPDATE);
}

#[test]
fn shutdown_and_close_sequences() {
    // Host shuts down sending: data already received is still readable, then EOF.
    let (mut v, id) = connected(4096);
    v.on_packet(&from_host(op::RW, 3, 1000, 0), b"abc");
    v.on_packet(&Header { flags: SHUTDOWN_SEND, ..from_host(op::SHUTDOWN, 0, 1000, 0) }, &[]);
    let mut buf = [0u8; 8];
    assert_eq!(v.read(id, &mut buf), Ok(3));
    assert_eq!(v.read(id, &mut buf), Ok(0));
    assert!(v.at_eof(id));
    assert_eq!(v.write(id, b"ok"), Ok(2), "half-closed: we may still send");
    drain(&mut v);
    // We close: SHUTDOWN both ways, then the host's RST forgets the connection.
    v.close(id);
    let out = drain(&mut v);
    assert_eq!((out[0].hdr.op, out[0].hdr.flags), (op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND));
    assert_eq!(v.conn_count(), 1);
    v.on_packet(&from_host(op::RST, 0, 0, 0), &[]);
    assert_eq!(v.conn_count(), 0);
    assert_eq!(v.read(id, &mut buf), Err(Error::NotConnected));

    // Host closes fully while nothing is buffered: we answer RST and report EOF.
    let (mut v, id) = connected(4096);
    v.on_packet(
        &Header { flags: SHUTDOWN_RCV | SHUTDOWN_SEND, ..from_host(op::SHUTDOWN, 0, 1000, 0) },
        &[],
    );
    assert_eq!(drain(&mut v)[0].hdr.op, op::RST);
    assert_eq!(v.read(id, &mut buf), Ok(0));
    v.close(id);
    assert!(drain(&mut v).is_empty());
    assert_eq!(v.conn_count(), 0);
}

// ---- The driver against a fake virtio-mmio device ----

/// The fake device's registers and rings, shared between the driver (through `FakeMmio`)
/// and the test (playing the host).
#[derive(Default)]
struct Fake {
    status: u32,
    dev_sel: u32,
    drv_sel: u32,
    drv_features: [u32; 2],
    queue_sel: u32,
    queues: [QueueCfg; 3],
    notifies: Vec<u32>,
    int_status: u32,
}

#[derive(Default, Clone, Copy)]
struct QueueCfg {
    num: u32,
    ready: u32,
    desc: u64,
    avail: u64,
    used: u64,
}

#[derive(Clone, Default)]
struct FakeMmio(Rc<RefCell<Fake>>);

fn set_lo(v: &mut u64, x: u32) {
    *v = (*v & !0xffff_ffff) | x as u64;
}
fn set_hi(v: &mut u64, x: u32) {
    *v = (*v & 0xffff_ffff) | (x as u64) << 32;
}

impl Mmio for FakeMmio {
    fn read32(&self, off: u64) -> u32 {
        let f = self.0.borrow();
        match off {
            reg::MAGIC => MAGIC_VALUE,
            reg::VERSION => 2,
            reg::DEVICE_ID => VSOCK_DEVICE_ID,
            reg::DEVICE_FEATURES => [0, 1][f.dev_sel as usize & 1], // VERSION_1 only
            reg::QUEUE_NUM_MAX => 64,
            reg::STATUS => f.status,
            reg::INTERRUPT_STATUS => f.int_status,
            reg::CONFIG => GUEST as u32,
            o if o == reg::CONFIG + 4 => 0,
            _ => 0,
        }
    }
    fn write32(&self, off: u64, v: u32) {
        let mut f = self.0.borrow_mut();
        let q = f.queue_sel as usize % 3;
        match off {
            reg::STATUS => f.status = v,
            reg::DEVICE_FEATURES_SEL => f.dev_sel = v,
            reg::DRIVER_FEATURES_SEL => f.drv_sel = v,
            reg::DRIVER_FEATURES => {
                let s = f.drv_sel as usize & 1;
                f.drv_features[s] = v
            }
            reg::QUEUE_SEL => f.queue_sel = v,
            reg::QUEUE_NUM => f.queues[q].num = v,
            reg::QUEUE_READY => f.queues[q].ready = v,
            reg::QUEUE_DESC_LOW => set_lo(&mut f.queues[q].desc, v),
            reg::QUEUE_DESC_HIGH => set_hi(&mut f.queues[q].desc, v),
            reg::QUEUE_DRIVER_LOW => set_lo(&mut f.queues[q].avail, v),
            reg::QUEUE_DRIVER_HIGH => set_hi(&mut f.queues[q].avail, v),
            reg::QUEUE_DEVICE_LOW => set_lo(&mut f.queues[q].used, v),
            reg::QUEUE_DEVICE_HIGH => set_hi(&mut f.queues[q].used, v),
            reg::QUEUE_NOTIFY => f.notifies.push(v),
            reg::INTERRUPT_ACK => f.int_status &= !v,
            _ => {}
        }
    }
}

/// The host end: the device side of the three queues.
struct Host {
    mmio: FakeMmio,
    rx: DeviceQueue,
    tx: DeviceQueue,
}

impl Host {
    fn attach(mmio: &FakeMmio) -> Self {
        let f = mmio.0.borrow();
        let view = |i: usize| {
            let c = f.queues[i];
            assert_eq!(c.ready, 1);
            assert_eq!(
                QueueAddrs::contiguous(c.desc, c.num as u16).used,
                c.used,
                "driver uses the contiguous layout"
            );
            // SAFETY: the driver configured these rings and keeps them alive while the test runs.
            unsafe {
                DeviceQueue::new(
                    QueueAddrs { desc: c.desc, avail: c.avail, used: c.used },
                    c.num as u16,
                )
            }
        };
        let (rx, tx) = (view(0), view(1));
        drop(f);
        Self { mmio: mmio.clone(), rx, tx }
    }

    /// Delivers one packet into the next receive buffer.
    fn send(&mut self, h: Header, payload: &[u8]) {
        let (head, chain) = self.rx.pop_avail().expect("driver posted rx buffers");
        assert_eq!(chain.len(), 1);
        assert_eq!(chain[0].len as usize, RX_BUF_LEN);
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(payload);
        DeviceQueue::write_mem(chain[0].addr, &bytes);
        self.rx.push_used(head, bytes.len() as u32);
        self.mmio.0.borrow_mut().int_status |= 1;
    }

    /// Packets the driver transmitted since the last call.
    fn take_sent(&mut self) -> Vec<(Header, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((head, chain)) = self.tx.pop_avail() {
            assert_eq!(chain[0].len as usize, HDR_LEN);
            assert!(chain.iter().all(|d| d.flags & kore_virtq::VIRTQ_DESC_F_WRITE == 0));
            let h = Header::decode(&DeviceQueue::read_mem(chain[0].addr, HDR_LEN)).unwrap();
            let payload: Vec<u8> = chain[1..]
                .iter()
                .flat_map(|d| DeviceQueue::read_mem(d.addr, d.len as usize))
                .collect();
            assert_eq!(payload.len(), h.len as usize);
            self.tx.push_used(head, 0);
            out.push((h, payload));
        }
        out
    }
}

fn pump(dev: &mut VsockDevice<FakeMmio>) {
    while dev.poll().unwrap() {}
}

#[test]
fn driver_initialises_the_device_per_spec() {
    let mmio = FakeMmio::default();
    let dev = VsockDevice::new(mmio.clone()).unwrap();
    let f = mmio.0.borrow();
    assert_eq!(
        f.status,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK
    );
    assert_eq!(f.drv_features, [0, 1], "exactly VIRTIO_F_VERSION_1");
    assert!(f.queues.iter().all(|q| q.ready == 1 && q.num == 64));
    assert_eq!(dev.sockets.cid(), GUEST);
    assert!(f.notifies.contains(&0), "rx buffers announced");
}

#[test]
fn driver_echoes_a_connection_end_to_end() {
    let mmio = FakeMmio::default();
    let mut dev = VsockDevice::new(mmio.clone()).unwrap();
    let mut host = Host::attach(&mmio);
    dev.sockets.listen(PORT).unwrap();

    host.send(from_host(op::REQUEST, 0, 1 << 16, 0), &[]);
    assert_eq!(dev.ack_interrupt(), 1);
    pump(&mut dev);
    let sent = host.take_sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.op, op::RESPONSE);
    let id = dev.sockets.accept().unwrap();

    // 300 packets: more than the ring size, so buffers must be recycled.
    let mut echoed = Vec::new();
    let mut expected = Vec::new();
    for k in 0..300u32 {
        let msg: Vec<u8> = (0..(k % 50 + 1)).map(|i| (i + k) as u8).collect();
        expected.extend_from_slice(&msg);
        host.send(from_host(op::RW, msg.len() as u32, 1 << 16, echoed.len() as u32), &msg);
        pump(&mut dev);
        let mut buf = [0u8; 128];
        while let Ok(n) = dev.sockets.read(id, &mut buf) {
            if n == 0 {
                break;
            }
            assert_eq!(dev.sockets.write(id, &buf[..n]), Ok(n));
        }
        pump(&mut dev);
        for (h, p) in host.take_sent() {
            if h.op == op::RW {
                echoed.extend_from_slice(&p);
            }
        }
    }
    assert_eq!(echoed, expected);

    host.send(
        Header { flags: SHUTDOWN_RCV | SHUTDOWN_SEND, ..from_host(op::SHUTDOWN, 0, 1 << 16, 0) },
        &[],
    );
    pump(&mut dev);
    assert_eq!(dev.sockets.read(id, &mut [0; 4]), Ok(0));
    let ops: Vec<u16> = host.take_sent().iter().map(|(h, _)| h.op).collect();
    assert_eq!(ops, [op::RST]);
    dev.sockets.close(id);
    assert_eq!(dev.sockets.conn_count(), 0);
}

#[test]
fn driver_rejects_wrong_devices() {
    struct Bad(u32, u32);
    impl Mmio for Bad {
        fn read32(&self, off: u64) -> u32 {
            match off {
                reg::MAGIC => MAGIC_VALUE,
                reg::VERSION => self.0,
                reg::DEVICE_ID => self.1,
                _ => 0,
            }
        }
        fn write32(&self, _: u64, _: u32) {}
    }
    use crate::mmio::DriverError;
    assert_eq!(VsockDevice::new(Bad(1, 19)).err(), Some(DriverError::BadVersion(1)));
    assert_eq!(VsockDevice::new(Bad(2, 1)).err(), Some(DriverError::NotVsock(1)));
    assert_eq!(VsockDevice::new(Bad(2, 19)).err(), Some(DriverError::NoVersion1));
}
