//! The two guest ELFs the appliance VM boots: the ring-0 Kore kernel and the
//! ring-3 appliance image.
//!
//! Found, in order: `KORE_GUEST_KERNEL` / `KORE_GUEST_IMAGE` (each a file
//! path), then `guest/x86_64-unknown-none/release/kore-kernel` and
//! `guest/x86_64-unknown-linux-gnu/release/kore-appliance` under any ancestor
//! directory of the running executable (the `target/guest` directory that
//! `guest-kernel/build.sh` fills; building kore-launch runs it, from
//! launcher/build.rs, so a fresh clone needs no extra step and a guest rebuilt
//! by hand is used at once), then the copies kore-launch carries
//! ([`crate::bundle`]: an installed kore-launch, anywhere).

use std::path::{Path, PathBuf};

use crate::error::{LaunchError, Result};

const KERNEL_REL: &str = "guest/x86_64-unknown-none/release/kore-kernel";
const IMAGE_REL: &str = "guest/x86_64-unknown-linux-gnu/release/kore-appliance";
const BUILD_HINT: &str =
    "build them with `cd guest-kernel && CARGO_TARGET_DIR=$PWD/../target/guest ./build.sh`, \
     or set KORE_GUEST_KERNEL and KORE_GUEST_IMAGE";

/// The two guest ELFs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImages {
    /// Ring-0 Kore kernel.
    pub kernel: PathBuf,
    /// Ring-3 appliance image.
    pub image: PathBuf,
}

impl GuestImages {
    /// Finds the images (see the module docs), building them from the
    /// source checkout when that is where kore-launch was built.
    pub fn locate() -> Result<GuestImages> {
        let env = crate::env::path;
        match (env("KORE_GUEST_KERNEL"), env("KORE_GUEST_IMAGE")) {
            (None, None) => {}
            (kernel, image) => {
                return Ok(GuestImages {
                    kernel: from_env("KORE_GUEST_KERNEL", kernel, KERNEL_REL)?,
                    image: from_env("KORE_GUEST_IMAGE", image, IMAGE_REL)?,
                })
            }
        }
        let exe = std::env::current_exe()
            .map_err(|e| LaunchError::Host(format!("cannot find kore-launch's own path: {e}")))?;
        if let Some(found) = search(&exe) {
            return Ok(found);
        }
        let bundled = |rel| crate::bundle::file(rel).map_err(|e| LaunchError::Host(e.to_string()));
        Ok(GuestImages {
            kernel: bundled("guest/kore-kernel")?,
            image: bundled("guest/kore-appliance")?,
        })
    }
}

/// One image named by its environment variable; the other defaults to its
/// usual place next to the first one's `guest/` directory.
fn from_env(var: &str, given: Option<PathBuf>, rel: &str) -> Result<PathBuf> {
    let Some(p) = given else {
        return Err(LaunchError::Host(format!(
            "set both KORE_GUEST_KERNEL and KORE_GUEST_IMAGE ({var} is missing; it is usually \
             target/{rel})"
        )));
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(LaunchError::Host(format!("{var}={}: no such file; {BUILD_HINT}", p.display())))
    }
}

/// Both images under one ancestor of `exe`.
fn search(exe: &Path) -> Option<GuestImages> {
    exe.ancestors().skip(1).find_map(|dir| {
        let (kernel, image) = (dir.join(KERNEL_REL), dir.join(IMAGE_REL));
        (kernel.is_file() && image.is_file()).then_some(GuestImages { kernel, image })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_found_under_an_ancestor_of_the_executable() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("target/release/kore-launch");
        assert_eq!(search(&exe), None);
        for rel in [KERNEL_REL, IMAGE_REL] {
            let p = dir.path().join("target").join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"elf").unwrap();
        }
        let found = search(&exe).expect("found");
        assert_eq!(found.kernel, dir.path().join("target").join(KERNEL_REL));
        assert_eq!(found.image, dir.path().join("target").join(IMAGE_REL));
    }
}
