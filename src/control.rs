//! The control socket of a running gateway: a Unix stream socket, owner-only
//! from the moment it has its name, answering one request line per
//! connection with JSON. Requests ([`ike_stub::ControlRequest`]): `stats`,
//! `sa list`, `sa show NAME`, `reload`.
//!
//! The socket is bound inside a fresh 0700 directory, made owner-only
//! there and only then linked to its path, so no umask opens a window on
//! it; a file at the path is replaced only if it is a socket nobody
//! answers on (a gateway's leftover). Peers are admitted by their
//! credentials (`SO_PEERCRED`): root or the gateway's own user. Each
//! admitted client is served on a thread of its own, at most
//! [`MAX_CLIENTS`] at once, with a deadline to send its request and one to
//! take the answer, so a client that stalls holds up nobody else.
//!
//! A listener thread accepts; the dataplane answers requests between
//! batches through a bounded channel, so the packet path takes no lock and
//! never waits for a client. Must not touch the dataplane's state itself.
//!
//! Owns, too, the one place the documents of `crate::status` become JSON
//! and back ([`encode`], [`Answer`]): everything else builds and reads
//! them typed.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Clients served at once; more are told the gateway is busy.
pub const MAX_CLIENTS: usize = 8;
/// How long a client has to send its request line.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long a client has to take its answer.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(2);
/// How long the dataplane has to answer.
const ANSWER_DEADLINE: Duration = Duration::from_secs(2);

/// A request waiting for the dataplane, with where to send the answer.
pub struct Request {
    pub line: String,
    pub reply: Sender<String>,
}

/// Where a gateway's control socket lives by default. A `/` in the
/// gateway's name stays in the file name, never a directory.
pub fn default_path(name: &str) -> PathBuf {
    Path::new("/run/espgw").join(format!("{}.sock", name.replace('/', "_")))
}

/// A bound control socket, not yet served: `espgw run` binds it while it
/// may still create files where it likes, and serves it after dropping
/// privileges (a thread started before would keep them).
pub struct Listener {
    listener: UnixListener,
}

impl Listener {
    /// Creates the socket at `path`, owner-only (and owned by `owner`,
    /// uid and gid, if given).
    pub fn bind(path: &Path, owner: Option<(libc::uid_t, libc::gid_t)>) -> Result<Listener> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        remove_stale(path)?;
        // Bound in a directory only we can enter, made owner-only there,
        // then given its name: it is never reachable with the umask's mode.
        let private = PrivateDir::new(dir)?;
        let inner = private.path.join("sock");
        let listener = UnixListener::bind(&inner).with_context(|| format!("creating {}", inner.display()))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod {}", inner.display()))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&inner, Some(uid), Some(gid))
                .with_context(|| format!("chown {}", inner.display()))?;
        }
        // link(2) never replaces: a file that appeared at `path` since the
        // check above stays, and we stop.
        std::fs::hard_link(&inner, path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Listener { listener })
    }

    /// Starts the listener thread.
    pub fn serve(self) -> Result<Receiver<Request>> {
        let (tx, rx) = bounded::<Request>(16);
        let listener = self.listener;
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(&listener, &tx))
            .context("starting the control thread")?;
        Ok(rx)
    }
}

/// Removes the socket at its path when dropped (the gateway stops, or
/// fails to start after binding), if a socket is still what is there.
pub struct SocketFile(pub PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.0).is_ok_and(|m| m.file_type().is_socket()) {
            // Fails harmlessly once privileges are gone (a root-owned
            // directory); the next start replaces a stale socket.
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Binds and serves at once (for callers that drop no privileges;
/// tests/control_socket.rs, which compiles this file).
#[allow(dead_code)]
pub fn listen(path: &Path) -> Result<Receiver<Request>> {
    Listener::bind(path, None)?.serve()
}

/// Clears `path` for a new socket: nothing there, or a socket nobody
/// answers on (removed). Anything else is refused.
fn remove_stale(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    };
    if !meta.file_type().is_socket() {
        let what = if meta.file_type().is_symlink() {
            "a symbolic link"
        } else if meta.is_dir() {
            "a directory"
        } else {
            "a file that is not a socket"
        };
        bail!(
            "{} is {what}; espgw replaces only a socket a stopped gateway left there: move it away or give --control another path",
            path.display()
        );
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!("another gateway already answers on {}", path.display()),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display())),
        Err(e) => Err(e).with_context(|| format!("checking whether a gateway answers on {}", path.display())),
    }
}

/// A fresh 0700 directory beside the socket's path (mkdtemp), removed
/// with what is left in it when dropped.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn new(beside: &Path) -> Result<PrivateDir> {
        use std::os::unix::ffi::OsStringExt;
        let mut template = beside.join(".espgw-control-XXXXXX").into_os_string().into_vec();
        template.push(0);
        // SAFETY: mkdtemp rewrites the X's of the NUL-terminated template
        // in place and creates the directory with mode 0700.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("creating a private directory in {}", beside.display()));
        }
        template.pop();
        Ok(PrivateDir {
            path: PathBuf::from(std::ffi::OsString::from_vec(template)),
        })
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The uid of the peer of `stream`, from the kernel.
fn peer_uid(stream: &UnixStream) -> std::io::Result<libc::uid_t> {
    // SAFETY: ucred is plain data (three integers).
    let cred: libc::ucred = unsafe { accel::os::get_sockopt(stream, libc::SOL_SOCKET, libc::SO_PEERCRED) }?;
    Ok(cred.uid)
}

fn accept_loop(listener: &UnixListener, tx: &Sender<Request>) {
    let clients = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(_) => {
                // Out of descriptors, say: let clients finish first.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        // SAFETY: geteuid has no preconditions.
        let own = unsafe { libc::geteuid() };
        match peer_uid(&stream) {
            Ok(uid) if uid == 0 || uid == own => {}
            Ok(uid) => {
                let _ = stream.write_all(
                    format!(
                        "{{\"error\":\"refused: uid {uid} is neither root nor the gateway's user (uid {own})\"}}\n"
                    )
                    .as_bytes(),
                );
                continue;
            }
            Err(_) => continue,
        }
        if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.write_all(b"{\"error\":\"the gateway is busy with other clients; try again\"}\n");
            continue;
        }
        let (tx, count) = (tx.clone(), Arc::clone(&clients));
        let spawned = std::thread::Builder::new()
            .name("control-client".into())
            .spawn(move || {
                serve(stream, &tx);
                count.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            clients.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads one request line (at most `MAX_REQUEST` bytes) by `deadline`.
fn read_line(stream: &mut UnixStream, deadline: Instant) -> Option<String> {
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    while line.len() <= ike_stub::request::MAX_REQUEST {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())?;
        stream.set_read_timeout(Some(left)).ok()?;
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            break;
        }
    }
    line.truncate(ike_stub::request::MAX_REQUEST + 1);
    Some(String::from_utf8_lossy(&line).trim().to_owned())
}

/// Writes all of `bytes` by `deadline`, or gives up.
fn write_all(stream: &mut UnixStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return false;
        };
        if stream.set_write_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

fn serve(mut stream: UnixStream, tx: &Sender<Request>) {
    let Some(line) = read_line(&mut stream, Instant::now() + READ_DEADLINE) else {
        return;
    };
    let (reply_tx, reply_rx) = bounded(1);
    let answer = match tx.try_send(Request {
        line,
        reply: reply_tx,
    }) {
        Ok(()) => reply_rx
            .recv_timeout(ANSWER_DEADLINE)
            .unwrap_or_else(|_| r#"{"error":"the gateway did not answer in time"}"#.into()),
        Err(_) => r#"{"error":"the gateway is busy; try again"}"#.into(),
    };
    let deadline = Instant::now() + WRITE_DEADLINE;
    if write_all(&mut stream, answer.as_bytes(), deadline) {
        write_all(&mut stream, b"\n", deadline);
    }
}

/// What a failed connect to `path` means, by its errno.
fn connect_error(path: &Path, e: &std::io::Error) -> String {
    let path = path.display();
    match e.raw_os_error() {
        Some(libc::ENOENT) => {
            format!("no control socket at {path}: is `espgw run` running, with this --control path?")
        }
        Some(libc::ECONNREFUSED) => format!(
            "nothing answers on {path}: the socket of a gateway that stopped (`espgw run` replaces it when it starts)"
        ),
        Some(libc::EACCES | libc::EPERM) => format!(
            "permission denied on {path}: the control socket is its gateway's user's only; run this as root or as that user"
        ),
        Some(libc::ENOTDIR) | Some(libc::ENOTSOCK) => format!("{path} is not a control socket ({e})"),
        _ => format!("cannot connect to {path}: {e}"),
    }
}

/// A document as the JSON the control socket (and a `--stats` file)
/// carries, on one line or pretty. Through `serde_json::Value`, whose maps
/// keep their keys sorted: the order the documents have always had,
/// whatever order their types declare their fields in.
pub fn encode<T: Serialize>(doc: &T, pretty: bool) -> serde_json::Result<String> {
    let value = serde_json::to_value(doc)?;
    if pretty {
        serde_json::to_string_pretty(&value)
    } else {
        Ok(value.to_string())
    }
}

/// A document as the line the socket sends; one that cannot be written
/// as JSON becomes an error answer (a bug, but the client hears of it).
pub fn encode_line<T: Serialize>(doc: &T) -> String {
    encode(doc, false).unwrap_or_else(|e| {
        let error =
            serde_json::to_string(&format!("the answer could not be written: {e}")).unwrap_or_default();
        format!(r#"{{"error":{error}}}"#)
    })
}

/// A gateway's answer that is not an error, as it came: read it as the
/// document asked for, or show it as it is.
pub struct Answer {
    request: String,
    doc: serde_json::Value,
}

impl Answer {
    /// The answer as the document type of its request (see
    /// `crate::status`).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.doc).with_context(|| {
            format!(
                "the gateway's answer to `{}` is not what this espgw reads (another version?)",
                self.request
            )
        })
    }

    /// The answer as pretty JSON (`--json`), keys as the gateway sent them.
    pub fn pretty(&self) -> String {
        serde_json::to_string_pretty(&self.doc).unwrap_or_default()
    }
}

/// Sends one request to a running gateway and returns its answer, typed
/// as `T` (see `crate::status`).
pub fn ask<T: DeserializeOwned>(path: &Path, request: &str) -> Result<T> {
    ask_raw(path, request)?.parse()
}

/// Sends one request to a running gateway and returns its JSON answer.
pub fn ask_raw(path: &Path, request: &str) -> Result<Answer> {
    let mut stream = match UnixStream::connect(path) {
        Ok(stream) => stream,
        Err(e) => bail!("{}", connect_error(path, &e)),
    };
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    // A gateway that refuses (busy, or not for this user) answers and
    // closes without reading: its answer is still there to read.
    let sent = stream
        .write_all(request.as_bytes())
        .and_then(|()| stream.write_all(b"\n"));
    if let Err(e) = sent {
        if e.kind() != ErrorKind::BrokenPipe {
            return Err(e).with_context(|| format!("sending to {}", path.display()));
        }
    }
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut answer)
        .with_context(|| format!("reading the answer on {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&answer).context("the gateway's answer is not JSON")?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("{error}");
    }
    Ok(Answer {
        request: request.to_owned(),
        doc: value,
    })
}
