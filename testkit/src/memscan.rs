//! A test's look at its own process memory: every readable private mapping
//! of /proc/self/maps (heap, anonymous mappings, thread stacks), read
//! through /proc/self/mem, searched for byte strings such as keys.
//!
//! A [`Needle`] is kept XORed with a mask and compared byte by byte, so
//! that the search itself holds no copy of what it looks for; the pages it
//! reads into are a mapping of their own, left out of the search and wiped
//! afterwards. Pages never touched (absent from /proc/self/pagemap) are
//! skipped: they read as zeros.

use std::io::BufRead;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MASK: u8 = 0xa5;
const PAGE: usize = 4096;

/// Bytes to search for, known only masked.
pub struct Needle(Vec<u8>);

impl Needle {
    /// `len` random bytes from the kernel.
    pub fn random(len: usize) -> Needle {
        let mut masked = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            // SAFETY: getrandom writes at most `len - filled` bytes there.
            let n = unsafe { libc::getrandom(masked[filled..].as_mut_ptr().cast(), len - filled, 0) };
            assert!(n > 0, "getrandom: {}", std::io::Error::last_os_error());
            filled += n as usize;
        }
        Needle(masked)
    }

    /// The needle of `bytes` (which stay the caller's).
    pub fn of(bytes: &[u8]) -> Needle {
        Needle(bytes.iter().map(|b| b ^ MASK).collect())
    }

    /// The first `len` bytes.
    pub fn prefix(&self, len: usize) -> Needle {
        Needle(self.0[..len].to_vec())
    }

    /// In lower-case hex, as a configuration file writes a key.
    pub fn hex(&self) -> String {
        self.0.iter().map(|m| format!("{:02x}", m ^ MASK)).collect()
    }

    /// The bytes unmasked, into `out` (for code under test that takes a
    /// slice; the caller wipes `out`).
    pub fn unmask_into(&self, out: &mut [u8]) {
        for (o, m) in out.iter_mut().zip(&self.0) {
            *o = m ^ MASK;
        }
    }

    /// Bytes of the secret.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret has no bytes (a scan for it finds nothing).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn first(&self) -> u8 {
        self.0[0] ^ MASK
    }

    fn matches(&self, window: &[u8]) -> bool {
        window.iter().zip(&self.0).all(|(b, m)| b ^ MASK == *m)
    }
}

/// One copy found.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Where the copy starts in this process's memory.
    pub address: usize,
    /// The mapping's address range and name (or what it is: a marked
    /// thread stack, an anonymous mapping).
    pub mapping: String,
    /// The mapping's `VmFlags` from /proc/self/smaps (`lo`: locked, `dd`:
    /// left out of core dumps).
    pub flags: String,
}

impl std::fmt::Display for Hit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x} in {} [{}]", self.address, self.mapping, self.flags)
    }
}

/// What a scan found, and what it read.
#[derive(Debug, Default)]
pub struct Scan {
    /// Every copy found.
    pub hits: Vec<Hit>,
    /// Bytes of memory read.
    pub bytes: usize,
    /// How long the scan took.
    pub time: Duration,
}

static STACKS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Marks the calling thread's stack, so that hits there are reported as a
/// thread stack.
pub fn mark_stack() {
    let here = 0u8;
    let mut stacks = STACKS.lock().unwrap_or_else(|p| p.into_inner());
    stacks.push(std::ptr::addr_of!(here) as usize);
}

/// Every copy of any of `needles` in this process's readable private
/// mappings.
pub fn scan(needles: &[&Needle]) -> Scan {
    const CHUNK: usize = 1 << 20;
    let longest = needles.iter().map(|n| n.len()).max().unwrap_or(1).max(1);
    assert!(needles.iter().all(|n| !n.is_empty()), "an empty needle");
    let len = CHUNK + longest;
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(buf, libc::MAP_FAILED, "mmap");
    let own = buf as usize..buf as usize + len;
    // SAFETY: the mapping is `len` bytes, ours alone until munmap.
    let window = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let mut starts = [false; 256];
    for needle in needles {
        starts[usize::from(needle.first())] = true;
    }
    let flags = vm_flags();
    let stacks = STACKS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
    let pagemap = std::fs::File::open("/proc/self/pagemap").expect("/proc/self/pagemap");
    let started = Instant::now();
    let mut scan = Scan::default();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms)) = (fields.first(), fields.get(1)) else {
            continue;
        };
        let name = fields.get(5).copied().unwrap_or("");
        if !perms.starts_with('r') || !perms.ends_with('p') || name == "[vvar]" || name == "[vsyscall]" {
            continue;
        }
        let Some((start, end)) = range.split_once('-').and_then(|(s, e)| {
            Some((
                usize::from_str_radix(s, 16).ok()?,
                usize::from_str_radix(e, 16).ok()?,
            ))
        }) else {
            continue;
        };
        if own.contains(&start) {
            continue;
        }
        let what = if stacks.iter().any(|a| (start..end).contains(a)) {
            "a thread stack"
        } else if name.is_empty() {
            "anonymous"
        } else {
            name
        };
        for (start, end) in present_runs(&pagemap, start, end) {
            scan.bytes += end - start;
            // Chunks overlap by `longest - 1` bytes; a match counts in the
            // chunk where it starts.
            let mut at = start;
            while at < end {
                let want = (end - at).min(CHUNK) + longest - 1;
                let Ok(n) = mem.read_at(&mut window[..want], at as u64) else {
                    at += CHUNK;
                    continue;
                };
                for i in 0..n.min(CHUNK).min(end - at) {
                    if !starts[usize::from(window[i])] {
                        continue;
                    }
                    for needle in needles {
                        if i + needle.len() <= n && needle.matches(&window[i..i + needle.len()]) {
                            scan.hits.push(Hit {
                                address: at + i,
                                mapping: format!("{what} ({range})"),
                                flags: flags
                                    .iter()
                                    .find(|(s, e, _)| (*s..*e).contains(&(at + i)))
                                    .map_or_else(String::new, |(_, _, f)| f.clone()),
                            });
                        }
                    }
                }
                at += CHUNK;
            }
        }
    }
    scan.time = started.elapsed();
    for b in window.iter_mut() {
        // SAFETY: a valid byte of our mapping; volatile so the wipe stays.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    // SAFETY: the mapping made above, no longer borrowed.
    unsafe { libc::munmap(buf, len) };
    scan
}

/// Each mapping's range and `VmFlags`.
fn vm_flags() -> Vec<(usize, usize, String)> {
    let Ok(file) = std::fs::File::open("/proc/self/smaps") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut range = None;
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((s, e)) = range.take() {
                out.push((s, e, flags.trim().to_owned()));
            }
        } else if let Some((s, e)) = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .and_then(|(s, e)| {
                Some((
                    usize::from_str_radix(s, 16).ok()?,
                    usize::from_str_radix(e, 16).ok()?,
                ))
            })
        {
            range = Some((s, e));
        }
    }
    out
}

/// The runs of pages in `start..end` that are in memory or swapped out:
/// the others were never written and read as zeros.
fn present_runs(pagemap: &std::fs::File, start: usize, end: usize) -> Vec<(usize, usize)> {
    const PRESENT_OR_SWAPPED: u64 = 3 << 62;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut entries = vec![0u8; 8 * 4096];
    let mut page = start / PAGE;
    while page < end / PAGE {
        let count = (end / PAGE - page).min(4096);
        let Ok(n) = pagemap.read_at(&mut entries[..count * 8], (page * 8) as u64) else {
            break;
        };
        if n == 0 {
            break;
        }
        for (i, entry) in entries[..n].chunks_exact(8).enumerate() {
            let entry = u64::from_ne_bytes([
                entry[0], entry[1], entry[2], entry[3], entry[4], entry[5], entry[6], entry[7],
            ]);
            if entry & PRESENT_OR_SWAPPED == 0 {
                continue;
            }
            let at = (page + i) * PAGE;
            match runs.last_mut() {
                Some((_, last_end)) if *last_end == at => *last_end = at + PAGE,
                _ => runs.push((at, at + PAGE)),
            }
        }
        page += n / 8;
    }
    runs
}
