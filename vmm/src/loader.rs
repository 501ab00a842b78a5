//! A careful static ELF64 loader: every header field is checked against the
//! file size and the allowed guest-physical window before anything is copied.

use std::path::{Path, PathBuf};

use kore_boot_abi::ImageInfo;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Errors loading an ELF.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The file could not be read.
    #[error("cannot read ELF {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not an image we can boot.
    #[error("{path} is not a bootable image: {reason}")]
    BadElf {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A segment lies outside its allowed window.
    #[error(
        "{path}: segment at {start:#x}..{end:#x} is outside the allowed window {lo:#x}..{hi:#x}: \
         link the image at physical addresses inside it (see kore_boot_abi::layout)"
    )]
    OutOfWindow {
        /// The file.
        path: PathBuf,
        /// Segment start.
        start: u64,
        /// Segment end.
        end: u64,
        /// Window start.
        lo: u64,
        /// Window end.
        hi: u64,
    },
}

fn rd<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    b.get(off..off.checked_add(N)?)?.try_into().ok()
}
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    rd::<2>(b, off).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    rd::<4>(b, off).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    rd::<8>(b, off).map(u64::from_le_bytes)
}

/// One loadable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Offset in the file.
    pub offset: u64,
    /// Guest-physical address.
    pub paddr: u64,
    /// Bytes taken from the file.
    pub filesz: u64,
    /// Bytes in memory (rest zeroed).
    pub memsz: u64,
}

/// A parsed ELF: entry point and loadable segments.
#[derive(Clone, Debug)]
pub struct Elf {
    /// Entry point.
    pub entry: u64,
    /// `PT_LOAD` segments.
    pub segments: Vec<Segment>,
}

/// Parses and checks an ELF64 x86-64 executable held in `b`.
pub fn parse(b: &[u8]) -> Result<Elf, String> {
    if b.get(0..4) != Some(b"\x7fELF") {
        return Err("no ELF magic".into());
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF".into());
    }
    let e_type = u16_at(b, 16).ok_or("truncated header")?;
    if e_type != 2 {
        return Err(format!("ELF type {e_type}, need ET_EXEC (a static, non-PIE executable)"));
    }
    if u16_at(b, 18) != Some(62) {
        return Err("not an x86-64 ELF".into());
    }
    let entry = u64_at(b, 24).ok_or("truncated header")?;
    let phoff = u64_at(b, 32).ok_or("truncated header")?;
    let phentsize = u16_at(b, 54).ok_or("truncated header")? as u64;
    let phnum = u16_at(b, 56).ok_or("truncated header")? as u64;
    if phentsize < 56 {
        return Err("program header entries too small".into());
    }
    let mut segments = Vec::new();
    for i in 0..phnum {
        let off =
            phoff.checked_add(i * phentsize).ok_or("program header offset overflows")? as usize;
        let p_type = u32_at(b, off).ok_or("program header table past end of file")?;
        if p_type != 1 {
            continue;
        }
        let seg = Segment {
            offset: u64_at(b, off + 8).ok_or("truncated program header")?,
            paddr: u64_at(b, off + 24).ok_or("truncated program header")?,
            filesz: u64_at(b, off + 32).ok_or("truncated program header")?,
            memsz: u64_at(b, off + 40).ok_or("truncated program header")?,
        };
        if seg.filesz > seg.memsz {
            return Err(format!("segment {i}: file size exceeds memory size"));
        }
        if seg.offset.checked_add(seg.filesz).is_none_or(|e| e > b.len() as u64) {
            return Err(format!("segment {i}: file range past end of file"));
        }
        if seg.paddr.checked_add(seg.memsz).is_none() {
            return Err(format!("segment {i}: address range overflows"));
        }
        if seg.memsz > 0 {
            segments.push(seg);
        }
    }
    if segments.is_empty() {
        return Err("no loadable segments".into());
    }
    Ok(Elf { entry, segments })
}

/// Loads the ELF at `path` into `mem`; every segment must lie in `[lo, hi)`
/// and the entry point inside a segment.
pub fn load<M: GuestMemory>(
    mem: &M,
    path: &Path,
    lo: u64,
    hi: u64,
) -> Result<ImageInfo, LoaderError> {
    let bytes =
        std::fs::read(path).map_err(|e| LoaderError::Io { path: path.into(), source: e })?;
    let bad = |reason: String| LoaderError::BadElf { path: path.into(), reason };
    let elf = parse(&bytes).map_err(bad)?;
    let mut info = ImageInfo { start: u64::MAX, end: 0, entry: elf.entry };
    for s in &elf.segments {
        let end = s.paddr + s.memsz;
        if s.paddr < lo || end > hi {
            return Err(LoaderError::OutOfWindow {
                path: path.into(),
                start: s.paddr,
                end,
                lo,
                hi,
            });
        }
        let data = &bytes[s.offset as usize..(s.offset + s.filesz) as usize];
        mem.write_slice(data, GuestAddress(s.paddr)).map_err(|_| {
            bad(format!("segment at {:#x} is outside guest RAM: give the VM more memory", s.paddr))
        })?;
        let zeros = vec![0u8; (s.memsz - s.filesz) as usize];
        mem.write_slice(&zeros, GuestAddress(s.paddr + s.filesz)).map_err(|_| {
            bad(format!("segment at {:#x} is outside guest RAM: give the VM more memory", s.paddr))
        })?;
        info.start = info.start.min(s.paddr);
        info.end = info.end.max(end);
    }
    if !elf.segments.iter().any(|s| elf.entry >= s.paddr && elf.entry < s.paddr + s.memsz) {
        return Err(bad(format!("entry point {:#x} is outside every loaded segment", elf.entry)));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(entry: u64, paddr: u64, filesz: u64, memsz: u64) -> Vec<u8> {
        let mut b = vec![0u8; 0x100];
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[16..18].copy_from_slice(&2u16.to_le_bytes());
        b[18..20].copy_from_slice(&62u16.to_le_bytes());
        b[24..32].copy_from_slice(&entry.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&1u16.to_le_bytes());
        let p = 64;
        b[p..p + 4].copy_from_slice(&1u32.to_le_bytes());
        b[p + 8..p + 16].copy_from_slice(&0xc0u64.to_le_bytes());
        b[p + 24..p + 32].copy_from_slice(&paddr.to_le_bytes());
        b[p + 32..p + 40].copy_from_slice(&filesz.to_le_bytes());
        b[p + 40..p + 48].copy_from_slice(&memsz.to_le_bytes());
        b
    }

    #[test]
    fn parses_good_and_rejects_bad() {
        let e = parse(&elf(0x80_0000, 0x80_0000, 0x40, 0x1000)).unwrap();
        assert_eq!(e.segments.len(), 1);
        assert!(parse(&elf(0, 0, 0x41, 0x1000)).unwrap_err().contains("past end"));
        assert!(parse(&elf(0, 0, 0x80, 0x40)).unwrap_err().contains("exceeds"));
        assert!(parse(&elf(0, u64::MAX - 4, 0, 0x40)).unwrap_err().contains("overflows"));
        let mut b = elf(0, 0, 0, 1);
        b[16] = 3;
        assert!(parse(&b).unwrap_err().contains("ET_EXEC"));
        assert!(parse(&b[..10]).is_err());
        let mut b = elf(0, 0, 0, 1);
        b[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&b).is_err());
    }
}
