//! The state directory of `espgw run` and `espgw pcap`: the sequence
//! ledger of SAs with static keys on disk (`ike_stub::ledger` decides what
//! goes in it and when), and the refusal to run AEAD proposals with static
//! keys without one.
//!
//! Every ceiling is made durable before any SA may use a number up to it:
//! the new ledger goes to `ledger.tmp` (0600), is synced, renamed over
//! `ledger`, and the directory is synced; only then are the SAs' ceilings
//! raised. A second process on the same directory is refused (`flock` on
//! `lock`), and so is a directory or ledger that another user could write.
//! `espgw run` writes from a thread of its own, never from the packet path;
//! `espgw pcap` writes in line, between frames.
//!
//! Owns the directory's files; must not touch packets or hold SA state
//! (it reaches SAs through weak references to their shared part).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dataplane::command::SaSetup;
use dataplane::Gateway;
use ike_stub::ledger::{needs_entry, Ledger, Progress, Reservations, Salt};
use ike_stub::{Config, KeySource, SaConfig};
use spd_sad::{SaDirection, SaShared};

/// The ledger's file in the directory.
const LEDGER: &str = "ledger";
const LEDGER_TMP: &str = "ledger.tmp";
const LOCK: &str = "lock";

/// How often `espgw run`'s writer looks at the SAs: a reservation is due
/// when half of one is left, which at any rate is far more than this.
pub const WRITER_PERIOD: Duration = Duration::from_millis(10);

/// Where the state directory is: `--state-dir`, else the file's
/// `[gateway] state_dir`, else systemd's `$STATE_DIRECTORY` (its first
/// entry), else none.
pub fn resolve(flag: Option<&Path>, config: &Config) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| config.state_dir.clone())
        .or_else(|| {
            std::env::var_os("STATE_DIRECTORY")
                .and_then(|v| v.to_str().and_then(|s| s.split(':').next()).map(PathBuf::from))
                .filter(|p| !p.as_os_str().is_empty())
        })
}

/// Without a state directory: refuses AEAD proposals with static keys
/// (their counter is their nonce, and it would start again at 1), and
/// returns a warning for other static-key SAs, whose counters and windows
/// do not survive a restart either.
pub fn without_state_dir(config: &Config, command: &str) -> Result<Option<String>> {
    let file = config.path.display();
    let statics: Vec<&SaConfig> = config.sas.iter().filter(|s| s.keys == KeySource::File).collect();
    if let Some(sa) = statics.iter().find(|s| s.algorithm.is_aead()) {
        bail!(
            "{file}: SA `{name}` has a static key ({alg}) and `espgw {command}` has no state directory to keep \
             its sequence numbers in. {alg}'s nonce is the sequence number, which would start again at 1 at \
             every start: packets 1, 2, 3, ... of two runs would be encrypted under the same (key, nonce), which \
             gives their plaintext and the authentication key away (RFC 4106, RFC 7634, RFC 8221: \
             counter modes must not be used with manual keys unless the counter is never reset). Set \
             `state_dir = \"/var/lib/espgw/{gateway}\"` under [gateway], or pass --state-dir DIR (systemd: \
             StateDirectory=, read from $STATE_DIRECTORY), or give the tunnel a `secret` so that its keys are \
             exchanged",
            name = sa.params.name,
            alg = sa.algorithm,
            gateway = config.name,
        );
    }
    Ok((!statics.is_empty()).then(|| {
        let names: Vec<String> = statics.iter().map(|s| format!("`{}`", s.params.name)).collect();
        format!(
            "{file}: SAs {} have static keys and there is no state directory: their sequence numbers and \
             replay windows start again at every start, so packets captured before a restart are accepted \
             after it; set `state_dir` under [gateway] or pass --state-dir DIR",
            names.join(", ")
        )
    }))
}

/// An SA of the ledger, as the driver reaches it.
#[derive(Clone)]
struct Handle {
    shared: Weak<SaShared>,
    direction: SaDirection,
    /// The SA's name in the gateways, for [`StateDir::forget`].
    name: String,
}

impl Handle {
    fn progress(&self) -> Option<Progress> {
        let shared = self.shared.upgrade()?;
        Some(Progress {
            used: match self.direction {
                SaDirection::Outbound => shared.reserved(),
                SaDirection::Inbound => shared.inbound_seen(),
            },
            ceiling: shared.ceiling(),
        })
    }
}

struct Inner {
    ledger: Ledger,
    reservations: Reservations<Handle>,
    /// Entries were forgotten since the last write: the next round writes
    /// even if it raises nothing.
    forgotten: bool,
}

/// An open state directory, locked for this process.
pub struct StateDir {
    path: PathBuf,
    dir: File,
    /// Held (and flocked) for the process's life.
    _lock: File,
    inner: Mutex<Inner>,
    /// One write at a time (the writer thread, a reload, `pcap`).
    writing: Mutex<()>,
    started: Instant,
    /// `espgw run`'s writer, for [`Self::nudge`].
    writer: OnceLock<std::thread::Thread>,
    /// Whether the ledger read at the start had been settled by a clean
    /// stop (for the start's log line).
    settled_at_open: bool,
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Refuses a file or directory that another user could change.
fn check_owner_and_mode(
    path: &Path,
    meta: &std::fs::Metadata,
    loose: u32,
    fix: &str,
    user: Option<libc::uid_t>,
) -> Result<()> {
    if meta.uid() != euid() && meta.uid() != 0 && Some(meta.uid()) != user {
        bail!(
            "{} belongs to user {}, not to this one ({}) or root: another user could rewrite the sequence ledger; {fix}",
            path.display(),
            meta.uid(),
            euid()
        );
    }
    if meta.mode() & loose != 0 {
        bail!(
            "{} has mode {:o}, which lets other users change the sequence ledger; {fix}",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

impl StateDir {
    /// Opens (creating it 0700 if absent, its parent must exist) and locks
    /// the directory, and reads its ledger (a new one, with a new salt,
    /// written at once, if there is none). With `user` (uid and gid of
    /// `run --user`), the directory and its files are handed to that user,
    /// who writes the ledger once root's privileges are gone.
    pub fn open(path: &Path, user: Option<(libc::uid_t, libc::gid_t)>) -> Result<StateDir> {
        if !path.exists() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(path)
                .with_context(|| format!("creating the state directory {}", path.display()))?;
        }
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .with_context(|| format!("opening the state directory {}", path.display()))?;
        let meta = dir.metadata()?;
        let user_uid = user.map(|(uid, _)| uid);
        check_owner_and_mode(
            path,
            &meta,
            0o022,
            &format!("run `chmod 700 {}`", path.display()),
            user_uid,
        )?;
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path.join(LOCK))
            .with_context(|| format!("opening {}", path.join(LOCK).display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                bail!(
                    "another espgw holds the state directory {} (its `lock`): two processes must not share one \
                     sequence ledger; give each gateway its own directory",
                    path.display()
                );
            }
            return Err(e).with_context(|| format!("locking {}", path.join(LOCK).display()));
        }
        let file = path.join(LEDGER);
        let ledger = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&file)
        {
            Ok(mut f) => {
                let meta = f.metadata()?;
                if !meta.is_file() {
                    bail!("{} is not a regular file", file.display());
                }
                check_owner_and_mode(
                    &file,
                    &meta,
                    0o077,
                    &format!("run `chmod 600 {}`", file.display()),
                    user_uid,
                )?;
                let mut text = String::new();
                f.read_to_string(&mut text)
                    .map_err(anyhow::Error::from)
                    .and_then(|_| Ledger::decode(&text).map_err(anyhow::Error::from))
                    .with_context(|| {
                        format!(
                            "{}: refused, so that no sequence number is used twice; if it cannot be restored, \
                             give every SA with static keys new keys before moving it aside",
                            file.display()
                        )
                    })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ledger::new(Salt::random()),
            Err(e) => return Err(e).with_context(|| format!("opening {}", file.display())),
        };
        let fresh = ledger.is_empty();
        let settled_at_open = ledger.is_settled();
        let state = StateDir {
            path: path.to_path_buf(),
            dir,
            _lock: lock,
            inner: Mutex::new(Inner {
                ledger,
                reservations: Reservations::default(),
                forgotten: false,
            }),
            writing: Mutex::new(()),
            started: Instant::now(),
            writer: OnceLock::new(),
            settled_at_open,
        };
        if fresh {
            let text = state.lock().ledger.encode();
            state.write(&text)?;
        }
        if let Some((uid, gid)) = user {
            // By descriptor: a name could be swapped between check and use.
            let ledger = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path.join(LEDGER))
                .with_context(|| format!("opening {}", path.join(LEDGER).display()))?;
            for (file, name) in [
                (&state.dir, path.to_path_buf()),
                (&state._lock, path.join(LOCK)),
                (&ledger, path.join(LEDGER)),
            ] {
                // SAFETY: fchown on a descriptor we own.
                if unsafe { libc::fchown(file.as_raw_fd(), uid, gid) } != 0 {
                    return Err(std::io::Error::last_os_error())
                        .with_context(|| format!("handing {} to the user of --user", name.display()));
                }
            }
        }
        Ok(state)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding it leaves the data as it was
        // (every change is one assignment): keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `text` as the ledger: temporary file, fsync, rename, fsync of
    /// the directory.
    fn write(&self, text: &str) -> Result<()> {
        // Relative to the directory's descriptor, not its path: once `run
        // --user` has dropped root, the path's parents may not be
        // searchable by that user, and a parent renamed or replaced by a
        // symbolic link since the start must not redirect the ledger.
        let tmp = self.path.join(LEDGER_TMP);
        let dir_fd = self.dir.as_raw_fd();
        let name_tmp = c"ledger.tmp";
        let name_ledger = c"ledger";
        debug_assert!(
            name_tmp.to_bytes() == LEDGER_TMP.as_bytes() && name_ledger.to_bytes() == LEDGER.as_bytes()
        );
        // SAFETY: openat with a descriptor we own and a NUL-terminated name;
        // the returned descriptor is owned by the File made from it.
        let fd = unsafe {
            libc::openat(
                dir_fd,
                name_tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("writing {}", tmp.display()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let mut file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        // SAFETY: renameat within the directory we hold, NUL-terminated names.
        if unsafe { libc::renameat(dir_fd, name_tmp.as_ptr(), dir_fd, name_ledger.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("renaming {} over {LEDGER}", tmp.display()));
        }
        self.dir
            .sync_all()
            .with_context(|| format!("syncing the directory {}", self.path.display()))
    }

    /// Gives each SA of `sas` (the SAs commands install) that needs one
    /// its mark: the highest number its keys may have been used with. Installed so, it resumes above it
    /// with its ceiling there, until [`Self::round`] raises it. An SA with
    /// the same keys tracked before (the one a reload replaces, whose
    /// copies some workers may still hold) gets no reservation from now on,
    /// so that it stays at or below the mark.
    pub fn prepare<'a>(&self, sas: impl IntoIterator<Item = &'a mut SaSetup>) {
        let mut inner = self.lock();
        let Inner {
            ledger, reservations, ..
        } = &mut *inner;
        for sa in sas.into_iter().filter(|s| needs_entry(s)) {
            reservations.retire(ledger, sa);
            sa.ledger_mark = Some(ledger.ceiling(&ledger.fingerprint(sa)));
        }
    }

    /// Starts keeping the ceilings of the SAs of `sas` (prepared by
    /// [`Self::prepare`]) installed in `gateway`.
    pub fn attach<'a>(&self, gateway: &Gateway, sas: impl IntoIterator<Item = &'a SaSetup>) {
        let mut inner = self.lock();
        let Inner {
            ledger, reservations, ..
        } = &mut *inner;
        for sa in sas.into_iter().filter(|s| s.ledger_mark.is_some()) {
            let Some(installed) = gateway
                .sad()
                .find(&sa.params.name)
                .and_then(|id| gateway.sad().get(id))
            else {
                continue;
            };
            let handle = Handle {
                shared: Arc::downgrade(installed.shared()),
                direction: sa.params.direction,
                name: sa.params.name.clone(),
            };
            reservations.track(ledger, sa, handle);
        }
    }

    /// Time for the reservations' rates (`espgw run`'s clock).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Makes the ceilings due at `now` durable, then raises them; returns
    /// how many were raised. On an error nothing is raised (the SAs stop at
    /// their ceilings), and the next round tries again.
    pub fn round(&self, now: Duration) -> Result<usize> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (text, raises) = {
            let mut inner = self.lock();
            let Inner {
                ledger,
                reservations,
                forgotten,
            } = &mut *inner;
            let raises = reservations.plan(ledger, now, Handle::progress);
            if raises.is_empty() && !*forgotten {
                return Ok(0);
            }
            *forgotten = false;
            (ledger.encode(), raises)
        };
        self.write(&text)?;
        for (handle, ceiling) in &raises {
            if let Some(shared) = handle.shared.upgrade() {
                shared.raise_ceiling(*ceiling);
            }
        }
        Ok(raises.len())
    }

    /// On a clean stop: writes each SA's exact mark, so that the next start
    /// resumes where this one stopped rather than at the end of a
    /// reservation (a receiver restarted alone would refuse its peer's next
    /// packets up to there). Call only once every worker has stopped and
    /// flushed its SAs' usage ([`dataplane::Gateway::flush_sa_usage`]);
    /// returns how many SAs were settled. On an error the reserved
    /// ceilings stand, which is safe.
    pub fn settle(&self) -> Result<usize> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (text, settled) = {
            let mut inner = self.lock();
            let Inner {
                ledger, reservations, ..
            } = &mut *inner;
            let settled = reservations.settle(ledger, Handle::progress);
            (ledger.encode(), settled)
        };
        self.write(&text)?;
        Ok(settled)
    }

    /// Forgets the entries of the SAs named `names` (the mirror's SAs that
    /// a rekey replaced and the daemon deleted: their keys never come
    /// back), so that the ledger does not grow by every rekey. The file is
    /// written at the writer's next round. Returns how many were tracked.
    pub fn forget(&self, names: &[String]) -> usize {
        let mut inner = self.lock();
        let Inner {
            ledger,
            reservations,
            forgotten,
        } = &mut *inner;
        let n = reservations.forget(ledger, |h: &Handle| names.contains(&h.name));
        *forgotten |= n > 0;
        n
    }

    /// Whether the ledger was settled by a clean stop when it was read.
    pub fn was_settled(&self) -> bool {
        self.settled_at_open
    }

    /// Wakes the writer at once: a worker has packets waiting for a
    /// ceiling (or dropped for want of one), which cannot wait for its next
    /// round. Called by a worker's driver between batches, never per packet.
    pub fn nudge(&self) {
        if let Some(writer) = self.writer.get() {
            writer.unpark();
        }
    }

    /// `espgw run`'s writer: a round every [`WRITER_PERIOD`], or sooner
    /// when nudged, until `stop`. A failing write is logged when it starts
    /// failing and when it recovers, not every round.
    pub fn spawn_writer(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let state = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("espgw-ledger".into())
            .spawn(move || {
                let mut failing = false;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(WRITER_PERIOD);
                    match state.round(state.elapsed()) {
                        Ok(_) if failing => {
                            failing = false;
                            tracing::info!(dir = %state.path.display(), "the sequence ledger is written again");
                        }
                        Ok(_) => {}
                        Err(e) if !failing => {
                            failing = true;
                            tracing::error!(
                                "{e:#}: SAs with static keys stop at their durable ceilings (seq_not_reserved) until it can be written"
                            );
                        }
                        Err(_) => {}
                    }
                }
            })
            .expect("spawning the ledger writer");
        let _ = self.writer.set(handle.thread().clone());
        handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("espgw-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_new_directory_is_private_locked_and_holds_a_salted_ledger() {
        let dir = temp("new");
        let state = StateDir::open(&dir, None).unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let ledger = std::fs::metadata(dir.join(LEDGER)).unwrap();
        assert_eq!(ledger.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(dir.join(LEDGER)).unwrap();
        assert!(Ledger::decode(&text).is_ok(), "{text}");
        let second = StateDir::open(&dir, None)
            .err()
            .expect("a second process is refused");
        assert!(
            format!("{second:#}").contains("another espgw holds"),
            "{second:#}"
        );
        drop(state);
        // The salt stays: the ledger is read back, not made anew.
        let again = StateDir::open(&dir, None).unwrap();
        assert_eq!(again.lock().ledger.encode(), text);
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loose_permissions_and_damaged_ledgers_are_refused() {
        let dir = temp("loose");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = StateDir::open(&dir, None).err().unwrap();
        assert!(format!("{err:#}").contains("chmod 700"), "{err:#}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        drop(StateDir::open(&dir, None).unwrap());
        let file = dir.join(LEDGER);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = StateDir::open(&dir, None).err().unwrap();
        assert!(format!("{err:#}").contains("chmod 600"), "{err:#}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, &text[..text.len() - 10]).unwrap();
        let err = format!("{:#}", StateDir::open(&dir, None).err().unwrap());
        assert!(err.contains("cut short") && err.contains("new keys"), "{err}");
        std::fs::write(&file, "garbage\n").unwrap();
        let err = format!("{:#}", StateDir::open(&dir, None).err().unwrap());
        assert!(err.contains("not an espgw sequence ledger"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
