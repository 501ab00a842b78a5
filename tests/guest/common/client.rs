//! A protocol client over the VMM's hybrid vsock and a booted appliance (service mode, tiny
//! pack preloaded) for the boot tests.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use kore_e2e::boot::{appliance_images, config};
use kore_vmm::{RunningVm, Vm};
use serde_json::Value;

use super::{pack_files, tiny_pack};

/// The service's vsock port.
pub const PORT: u32 = 1025;

pub struct Client {
    pub w: UnixStream,
    pub r: BufReader<UnixStream>,
}

impl Client {
    /// Connects to the guest's port, retrying while the service is not listening yet.
    pub fn connect(uds: &Path, deadline: Instant) -> Client {
        loop {
            assert!(Instant::now() < deadline, "the appliance never accepted on port {PORT}");
            if let Ok(mut s) = UnixStream::connect(uds) {
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                if s.write_all(format!("CONNECT {PORT}\n").as_bytes()).is_ok() {
                    let mut r = BufReader::new(s.try_clone().unwrap());
                    let mut line = String::new();
                    if r.read_line(&mut line).is_ok() && line.starts_with("OK ") {
                        return Client { w: s, r };
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }

    pub fn event(&mut self) -> Value {
        let mut line = String::new();
        let n = self.r.read_line(&mut line).unwrap();
        assert!(n > 0, "the service closed the connection");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad event {line:?}: {e}"))
    }

    /// Events of request `id` up to its terminal event; returns (deltas joined, terminal).
    pub fn until_done(&mut self, id: &Value) -> (String, Value) {
        let mut text = String::new();
        loop {
            let ev = self.event();
            assert_eq!(&ev["id"], id, "unexpected event {ev}");
            if let Some(d) = ev["delta"].as_str() {
                text.push_str(d);
            } else {
                return (text, ev);
            }
        }
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub struct Appliance {
    pub vm: Option<RunningVm>,
    pub dir: std::path::PathBuf,
    pub uds: std::path::PathBuf,
}

impl Appliance {
    /// Boots with `vcpus`; `name` keeps the socket directory of concurrently running tests apart.
    pub fn boot(name: &str, vcpus: u32) -> Appliance {
        Self::boot_pack(name, vcpus, tiny_pack())
    }

    /// Boots with the pack in `pack_dir`.
    pub fn boot_pack(name: &str, vcpus: u32, pack_dir: &Path) -> Appliance {
        let img = appliance_images().unwrap();
        let dir =
            std::env::temp_dir().join(format!("kore-appliance-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uds = dir.join("vsock.sock");
        let mut cfg = config(&img, vcpus, "").vsock_uds(&uds);
        for f in pack_files(pack_dir) {
            cfg = cfg.preload(f);
        }
        let vm = Vm::start(cfg, &mut |_| {}).unwrap();
        Appliance { vm: Some(vm), dir, uds }
    }

    pub fn console(&self) -> String {
        self.vm.as_ref().unwrap().console_lines().join("\n")
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("appliance console:\n{}", self.console());
        }
        if let Some(vm) = self.vm.take() {
            vm.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
