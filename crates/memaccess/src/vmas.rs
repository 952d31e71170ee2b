//! The mappings of this process over a range, as `/proc/self/maps` lines: from one
//! `ioctl(PROCMAP_QUERY)` per mapping on `/proc/self/maps` (Linux 6.11, `linux/fs.h`), which
//! costs the same whatever the number of mappings, or else from reading the whole file (tens
//! of microseconds in a small process, more in one with many libraries and mappings: it was a
//! quarter of a registration's time, docs/design/registered-memory.md, "Sharing by default").

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{open, Mode, OFlags};
use rustix::ioctl::{ioctl, opcode, Updater};

/// `struct procmap_query` of `linux/fs.h` (104 bytes: the ioctl number encodes the size).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const PROCMAP_QUERY: rustix::ioctl::Opcode = opcode::read_write::<ProcmapQuery>(b'f', 17);
const VMA_READABLE: u64 = 0x01;
const VMA_WRITABLE: u64 = 0x02;
const VMA_EXECUTABLE: u64 = 0x04;
const VMA_SHARED: u64 = 0x08;

/// The kernel answered `ENOTTY`/`EINVAL` once (before 6.11): read the file from then on.
static NO_QUERY: AtomicBool = AtomicBool::new(false);

/// The `/proc/self/maps` lines of the mappings that hold bytes of `[lo, hi)`, in address
/// order, stopping at the first hole (the caller sees it as a gap between two lines, or as
/// a first line that starts after `lo`).
pub(crate) fn lines_covering(lo: usize, hi: usize) -> io::Result<Vec<String>> {
    if !NO_QUERY.load(Ordering::Relaxed) {
        match query(lo, hi) {
            Ok(lines) => return Ok(lines),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL)) => {
                NO_QUERY.store(true, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    from_file(lo, hi)
}

/// [`lines_covering`] by reading the whole of `/proc/self/maps`.
fn from_file(lo: usize, hi: usize) -> io::Result<Vec<String>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps
        .lines()
        .filter(|l| {
            let Some((range, _)) = l.split_once(' ') else {
                return false;
            };
            let Some((s, e)) = range.split_once('-') else {
                return false;
            };
            let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16))
            else {
                return false;
            };
            s < hi && e > lo
        })
        .map(str::to_owned)
        .collect())
}

/// The `VmFlags` (proc(5), `/proc/pid/smaps`) that registration must not lose by moving
/// a shared mapping over the pages (docs/design/registered-memory.md, "What registration must not
/// change"): `lo` (`mlock`, `VM_LOCKED`), `dc` (`MADV_DONTFORK`, `VM_DONTCOPY`) and `wf`
/// (`MADV_WIPEONFORK`, `VM_WIPEONFORK`). A new `MAP_SHARED` mapping has none of them, and
/// `MADV_WIPEONFORK` cannot even be applied to one (`EINVAL`, madvise(2)).
pub(crate) const KEPT_FLAGS: [&str; 3] = ["lo", "dc", "wf"];

/// The first mapping over `[lo, hi)` whose `VmFlags` hold one of [`KEPT_FLAGS`]: its start
/// and that flag. `PROCMAP_QUERY` does not report these flags; `/proc/self/smaps` is the one
/// interface that does (it also sums each mapping's pages, which makes it the slower read:
/// docs/design/registered-memory.md gives the cost).
pub(crate) fn kept_flag_in(lo: usize, hi: usize) -> io::Result<Option<(usize, &'static str)>> {
    use std::io::BufRead;
    let smaps = std::io::BufReader::new(std::fs::File::open("/proc/self/smaps")?);
    // The mapping the lines being read belong to, if it overlaps the range.
    let mut current: Option<usize> = None;
    for line in smaps.lines() {
        let line = line?;
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(start) = current {
                let found = flags
                    .split_ascii_whitespace()
                    .find_map(|f| KEPT_FLAGS.iter().find(|&&k| k == f));
                if let Some(&flag) = found {
                    return Ok(Some((start, flag)));
                }
            }
            continue;
        }
        // A mapping's first line is `start-end perms ...`; the others are `Key: value`.
        let first = line.split_ascii_whitespace().next().unwrap_or("");
        if let Some((s, e)) = first.split_once('-') {
            if let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) {
                if s >= hi {
                    break; // In address order: nothing further overlaps.
                }
                current = (e > lo).then_some(s);
            }
        }
    }
    Ok(None)
}

fn query(lo: usize, hi: usize) -> io::Result<Vec<String>> {
    // Opened per call: a descriptor kept across fork() would describe the parent.
    let maps = open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut lines = Vec::new();
    let mut at = lo;
    while at < hi {
        let mut name = [0u8; 256];
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: at as u64,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY takes a `struct procmap_query`, which `ProcmapQuery` lays out
        // (its size is checked by the kernel against `size` and the ioctl number); the
        // kernel writes at most `vma_name_size` bytes to `vma_name_addr`, our `name` buffer,
        // which outlives the call.
        match unsafe { ioctl(&maps, Updater::<PROCMAP_QUERY, ProcmapQuery>::new(&mut q)) } {
            Ok(()) => {}
            // No mapping holds `at`: a hole.
            Err(rustix::io::Errno::NOENT) => break,
            Err(e) => return Err(e.into()),
        }
        let f = q.vma_flags;
        let perms = [
            if f & VMA_READABLE != 0 { 'r' } else { '-' },
            if f & VMA_WRITABLE != 0 { 'w' } else { '-' },
            if f & VMA_EXECUTABLE != 0 { 'x' } else { '-' },
            if f & VMA_SHARED != 0 { 's' } else { 'p' },
        ];
        // `vma_name_size` includes the terminating NUL when there is a name.
        let n = (q.vma_name_size as usize).min(name.len());
        let path = std::str::from_utf8(&name[..n])
            .unwrap_or("?")
            .trim_end_matches('\0');
        lines.push(format!(
            "{:x}-{:x} {} {:08x} {:02x}:{:02x} {} {}",
            q.vma_start,
            q.vma_end,
            perms.iter().collect::<String>(),
            q.vma_offset,
            q.dev_major,
            q.dev_minor,
            q.inode,
            path
        ));
        if q.vma_end as usize <= at {
            break; // Not moving on: never loop.
        }
        at = q.vma_end as usize;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_and_the_file_agree() {
        // Three mappings in a row: anonymous read-write, read-only, anonymous read-write.
        let p = crate::page_size();
        // SAFETY: a fresh anonymous mapping (no hint), split by mprotect below; only this
        // test uses it and it is unmapped at the end.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                3 * p,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .unwrap() as usize;
        // SAFETY: the middle page of our own mapping.
        unsafe {
            rustix::mm::mprotect(
                (base + p) as *mut std::ffi::c_void,
                p,
                rustix::mm::MprotectFlags::READ,
            )
        }
        .unwrap();
        let from_file: Vec<String> = from_file(base, base + 3 * p)
            .unwrap()
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(from_file.len(), 3, "{from_file:?}");
        match query(base, base + 3 * p) {
            Ok(lines) => {
                let lines: Vec<String> = lines
                    .iter()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect();
                assert_eq!(lines, from_file);
                assert_eq!(lines.len(), 3, "{lines:?}");
            }
            Err(e) => eprintln!("SKIP: no PROCMAP_QUERY here ({e})"),
        }
        // SAFETY: our own mapping, no longer used.
        unsafe { rustix::mm::munmap(base as *mut std::ffi::c_void, 3 * p) }.unwrap();
    }
}
