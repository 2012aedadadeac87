//! The control socket of a running gateway: a Unix stream socket, created
//! owner-only, answering one request line per connection with JSON.
//! Requests ([`ike_stub::ControlRequest`]): `stats`, `sa list`,
//! `sa show NAME`, `reload`.
//!
//! A listener thread accepts and reads requests; the dataplane answers them
//! between batches through a bounded channel, so the packet path takes no
//! lock and never waits for a client.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};

/// A request waiting for the dataplane, with where to send the answer.
pub struct Request {
    pub line: String,
    pub reply: Sender<String>,
}

/// Where a gateway's control socket lives by default.
pub fn default_path(name: &str) -> PathBuf {
    Path::new("/run/espgw").join(format!("{name}.sock"))
}

/// Creates the socket (owner-only) and starts the listener thread.
pub fn listen(path: &Path) -> Result<Receiver<Request>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        // A socket nobody answers on is a leftover; a live one is a conflict.
        if UnixStream::connect(path).is_ok() {
            bail!("another gateway already answers on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let (tx, rx) = bounded::<Request>(16);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                serve(stream, &tx);
            }
        })
        .context("starting the control thread")?;
    Ok(rx)
}

fn serve(mut stream: UnixStream, tx: &Sender<Request>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let Ok(read_half) = stream.try_clone() else { return };
    let mut line = String::new();
    // One bounded line per connection.
    if BufReader::new(read_half.take(ike_stub::request::MAX_REQUEST as u64))
        .read_line(&mut line)
        .is_err()
    {
        return;
    }
    let (reply_tx, reply_rx) = bounded(1);
    let answer = match tx.try_send(Request {
        line: line.trim().to_owned(),
        reply: reply_tx,
    }) {
        Ok(()) => reply_rx
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_else(|_| r#"{"error":"the gateway did not answer in time"}"#.into()),
        Err(_) => r#"{"error":"the gateway is busy; try again"}"#.into(),
    };
    let _ = stream.write_all(answer.as_bytes());
    let _ = stream.write_all(b"\n");
}

/// Sends one request to a running gateway and returns its JSON answer.
pub fn ask(path: &Path, request: &str) -> Result<serde_json::Value> {
    let mut stream = UnixStream::connect(path).with_context(|| {
        format!(
            "no gateway answers on {} (is `espgw run` running?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(request.as_bytes())?;
    stream.write_all(b"\n")?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    let value: serde_json::Value =
        serde_json::from_str(&answer).context("the gateway's answer is not JSON")?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("{error}");
    }
    Ok(value)
}
