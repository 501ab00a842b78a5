//! Shared by the host_* tests: fake sysfs/procfs trees in a temporary
//! directory, and a fake kernel that reacts to writes the way Linux does
//! (growing hugepage pools up to a limit, creating VFs, binding drivers)
//! while recording every write.

use crate::host::{HostError, Sys, SysRoot};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A fake root directory.
pub struct Tree {
    pub dir: tempfile::TempDir,
}

impl Tree {
    pub fn new() -> Tree {
        Tree { dir: tempfile::tempdir().expect("tempdir") }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn real(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    /// Writes a file (creating parents).
    pub fn file(&self, path: &str, contents: &str) -> &Tree {
        let real = self.real(path);
        fs::create_dir_all(real.parent().unwrap()).unwrap();
        fs::write(real, contents).unwrap();
        self
    }

    pub fn dir(&self, path: &str) -> &Tree {
        fs::create_dir_all(self.real(path)).unwrap();
        self
    }

    /// Creates a symlink at `path` pointing to the fake-root path `target`.
    pub fn link(&self, path: &str, target: &str) -> &Tree {
        let real = self.real(path);
        fs::create_dir_all(real.parent().unwrap()).unwrap();
        let _ = fs::remove_file(&real);
        symlink(self.real(target), real).unwrap();
        self
    }

    pub fn read(&self, path: &str) -> String {
        fs::read_to_string(self.real(path)).unwrap()
    }

    /// A hugepage pool of `kb` KiB pages.
    pub fn pool(&self, kb: u64, total: u64, free: u64, resv: u64) -> &Tree {
        let dir = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
        self.file(&format!("{dir}/nr_hugepages"), &format!("{total}\n"));
        self.file(&format!("{dir}/free_hugepages"), &format!("{free}\n"));
        self.file(&format!("{dir}/resv_hugepages"), &format!("{resv}\n"));
        self
    }

    /// A PCI driver directory with bind/unbind files.
    pub fn driver(&self, name: &str) -> &Tree {
        let dir = format!("/sys/bus/pci/drivers/{name}");
        self.file(&format!("{dir}/bind"), "");
        self.file(&format!("{dir}/unbind"), "");
        self
    }

    /// A PCI device, optionally bound to `driver`, with a class code.
    pub fn device(&self, addr: &str, driver: Option<&str>, class: &str) -> &Tree {
        let dir = format!("/sys/bus/pci/devices/{addr}");
        self.file(&format!("{dir}/class"), &format!("{class}\n"));
        self.file(&format!("{dir}/driver_override"), "(null)\n");
        if let Some(driver) = driver {
            self.driver(driver);
            self.link(&format!("{dir}/driver"), &format!("/sys/bus/pci/drivers/{driver}"));
        }
        self.file("/sys/bus/pci/drivers_probe", "");
        self
    }

    /// Puts `addrs` in IOMMU group `group`.
    pub fn group(&self, group: &str, addrs: &[&str]) -> &Tree {
        for addr in addrs {
            self.link(
                &format!("/sys/kernel/iommu_groups/{group}/devices/{addr}"),
                &format!("/sys/bus/pci/devices/{addr}"),
            );
            self.link(
                &format!("/sys/bus/pci/devices/{addr}/iommu_group"),
                &format!("/sys/kernel/iommu_groups/{group}"),
            );
        }
        self
    }

    /// An SR-IOV capable GPU PF bound to `driver`.
    pub fn sriov_pf(
        &self,
        addr: &str,
        driver: &str,
        total: u64,
        offset: u64,
        stride: u64,
    ) -> &Tree {
        self.device(addr, Some(driver), "0x030000");
        let dir = format!("/sys/bus/pci/devices/{addr}");
        self.file(&format!("{dir}/sriov_totalvfs"), &format!("{total}\n"));
        self.file(&format!("{dir}/sriov_numvfs"), "0\n");
        self.file(&format!("{dir}/sriov_offset"), &format!("{offset}\n"));
        self.file(&format!("{dir}/sriov_stride"), &format!("{stride}\n"));
        self.file(&format!("{dir}/sriov_drivers_autoprobe"), "1\n");
        self
    }
}

/// A fake kernel over a [`Tree`]: records writes and reacts to them.
pub struct FakeKernel<'t> {
    pub tree: &'t Tree,
    pub root: SysRoot,
    pub writes: RefCell<Vec<(String, String)>>,
    /// Most pages the kernel grants per pool directory (`None`: no limit).
    pub pool_limit: HashMap<String, u64>,
    /// VF addresses created by sriov_numvfs writes, per PF.
    pub vf_addrs: HashMap<String, Vec<String>>,
    /// IOMMU group given to each new VF.
    pub vf_group: HashMap<String, String>,
    /// When false, drivers_probe does not bind vfio-pci.
    pub vfio_binds: bool,
}

impl<'t> FakeKernel<'t> {
    pub fn new(tree: &'t Tree) -> FakeKernel<'t> {
        FakeKernel {
            tree,
            root: SysRoot::new(tree.root()),
            writes: RefCell::new(Vec::new()),
            pool_limit: HashMap::new(),
            vf_addrs: HashMap::new(),
            vf_group: HashMap::new(),
            vfio_binds: true,
        }
    }

    pub fn writes(&self) -> Vec<(String, String)> {
        self.writes.borrow().clone()
    }

    fn react(&self, path: &str, value: &str, before: Option<String>) {
        let tree = self.tree;
        if let Some(dir) = path.strip_suffix("/nr_hugepages") {
            let asked: u64 = value.parse().unwrap();
            let old: u64 = before.unwrap().trim().parse().unwrap();
            let granted = self.pool_limit.get(dir).map_or(asked, |&limit| asked.min(limit));
            let free: u64 = tree.read(&format!("{dir}/free_hugepages")).trim().parse().unwrap();
            let free = (free as i64 + granted as i64 - old as i64).max(0);
            tree.file(path, &format!("{granted}\n"));
            tree.file(&format!("{dir}/free_hugepages"), &format!("{free}\n"));
        } else if let Some(dev) = path.strip_suffix("/sriov_numvfs") {
            let pf = dev.rsplit('/').next().unwrap();
            let n: usize = value.parse().unwrap();
            let driver = fs::read_link(tree.real(&format!("{dev}/driver")))
                .ok()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned());
            for (i, vf) in self.vf_addrs.get(pf).into_iter().flatten().take(n).enumerate() {
                tree.device(vf, driver.as_deref(), "0x030000");
                tree.link(&format!("{dev}/virtfn{i}"), &format!("/sys/bus/pci/devices/{vf}"));
                if let Some(group) = self.vf_group.get(vf) {
                    tree.group(group, &[vf]);
                }
            }
            tree.file(path, &format!("{n}\n"));
        } else if let Some(drv) = path.strip_suffix("/unbind") {
            let _ = drv;
            let _ = fs::remove_file(tree.real(&format!("/sys/bus/pci/devices/{value}/driver")));
        } else if path == "/sys/bus/pci/drivers_probe" {
            let dev = format!("/sys/bus/pci/devices/{value}");
            let over = tree.read(&format!("{dev}/driver_override"));
            if over.trim() == "vfio-pci" && self.vfio_binds {
                tree.link(&format!("{dev}/driver"), "/sys/bus/pci/drivers/vfio-pci");
            }
        } else {
            tree.file(path, &format!("{value}\n"));
        }
    }
}

impl Sys for FakeKernel<'_> {
    fn locate(&self, path: &str) -> PathBuf {
        self.root.locate(path)
    }
    fn read(&self, path: &str) -> Result<String, HostError> {
        self.root.read(path)
    }
    fn write(&self, path: &str, value: &str) -> Result<(), HostError> {
        let before = fs::read_to_string(self.tree.real(path)).ok();
        // The real write first (it fails like sysfs when the file is missing).
        self.root.write(path, value)?;
        self.writes.borrow_mut().push((path.to_string(), value.to_string()));
        self.react(path, value, before);
        Ok(())
    }
    fn list(&self, path: &str) -> Vec<String> {
        self.root.list(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.root.exists(path)
    }
    fn link_name(&self, path: &str) -> Option<String> {
        self.root.link_name(path)
    }
}

/// Owned (path, value) pairs for comparing with [`FakeKernel::writes`].
pub fn w(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(p, v)| (p.to_string(), v.to_string())).collect()
}
