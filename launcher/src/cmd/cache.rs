//! `kore-launch cache [--json]` lists the prefix cache's checkpoint files
//! under `$XDG_CACHE_HOME/kore` per pack (identity, files, bytes, age);
//! `kore-launch cache clear [--pack P]` deletes them (all, or one pack's: a
//! pack directory or the identity the listing shows).

use std::path::Path;
use std::time::SystemTime;

use kore_appliance::disk::{self, PackUsage};
use serde_json::json;

use crate::cli::{CacheAction, CacheArgs};
use crate::error::{LaunchError, Result};

/// Runs `cache`.
pub fn run(args: &CacheArgs) -> Result<()> {
    let root = disk::default_root().ok_or_else(|| {
        LaunchError::Host(
            "no cache directory: set XDG_CACHE_HOME or HOME to an absolute path".into(),
        )
    })?;
    let io = |source: std::io::Error| LaunchError::Io { path: root.display().to_string(), source };
    match &args.action {
        Some(CacheAction::Clear { pack }) => {
            let id = pack.as_deref().map(pack_id).transpose()?;
            let freed = disk::clear(&root, id.as_deref()).map_err(io)?;
            println!("cleared {} ({freed} bytes) from {}", size(freed), root.display());
            if args.json {
                println!("{}", json!({"dir": root, "freed_bytes": freed}));
            }
        }
        None => {
            let packs = disk::usage(&root).map_err(io)?;
            print_usage(&root, &packs);
            if args.json {
                let list: Vec<_> = packs.iter().map(|u| {
                    json!({"pack": u.pack, "files": u.files, "bytes": u.bytes, "age_s": age_s(u)})
                }).collect();
                println!("{}", json!({"dir": root, "packs": list}));
            }
        }
    }
    Ok(())
}

/// A pack directory's identity in hex, or the text itself when it already
/// is one (64 hex digits).
fn pack_id(p: &str) -> Result<String> {
    let dir = Path::new(p);
    if dir.is_dir() {
        let digest = crate::appliance::native::pack_digest(dir).ok_or_else(|| {
            LaunchError::Usage(format!("{p} has no pack.toml: name a pack or an identity"))
        })?;
        return Ok(digest.iter().map(|b| format!("{b:02x}")).collect());
    }
    if p.len() == 64 && p.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(p.to_ascii_lowercase());
    }
    Err(LaunchError::Usage(format!(
        "--pack {p}: not a pack directory nor a pack identity (64 hex digits, see `kore-launch cache`)"
    )))
}

fn age_s(u: &PackUsage) -> Option<u64> {
    let t = u.newest?;
    Some(SystemTime::now().duration_since(t).map_or(0, |d| d.as_secs()))
}

fn print_usage(root: &Path, packs: &[PackUsage]) {
    if packs.is_empty() {
        println!("no checkpoint files in {}", root.display());
        return;
    }
    println!("{}", root.display());
    println!("{:<64}  {:>6}  {:>10}  last used", "pack", "files", "size");
    for u in packs {
        let age = age_s(u).map_or_else(|| "-".into(), |s| format!("{} ago", duration(s)));
        println!("{:<64}  {:>6}  {:>10}  {age}", u.pack, u.files, size(u.bytes));
    }
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b => format!("{b} B"),
    }
}

fn duration(s: u64) -> String {
    match s {
        s if s >= 86_400 => format!("{}d", s / 86_400),
        s if s >= 3_600 => format!("{}h", s / 3_600),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
