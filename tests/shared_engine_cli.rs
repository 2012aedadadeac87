//! `espgw engine serve` as its own process, and `espgw pcap` through it
//! with `engine = "shared"` over both transports: the same verdicts and
//! bytes as in-process, an owner-only socket, and config errors that name
//! the spot and the fix.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

mod common;

fn espgw() -> Command {
    Command::new(env!("CARGO_BIN_EXE_espgw"))
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("espgw-shcli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        // SAFETY: signals our own child, by its pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn serve(socket: &Path, engine: &str) -> Serve {
    let child = espgw()
        .args(["engine", "serve", "--engine", engine, "--socket"])
        .arg(socket)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the server did not bind {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Serve(child)
}

fn shared_config(from: &str, socket: &Path, transport: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo(from)).unwrap().replace(
        "engine = \"soft\"",
        &format!(
            "engine = \"shared\"\nsocket = \"{}\"\ntransport = \"{transport}\"",
            socket.display()
        ),
    );
    assert!(text.contains("shared"), "{from} has an [accel] engine line");
    let name = Path::new(from).file_name().unwrap().to_string_lossy().to_string();
    let path = dir.join(format!("{transport}-{name}"));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let file = std::fs::File::create(path).unwrap();
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(file, header).unwrap();
    for (i, frame) in frames.iter().enumerate() {
        let packet = PcapPacket::new(Duration::from_millis(i as u64), frame.len() as u32, frame);
        writer.write_packet(&packet).unwrap();
    }
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let mut reader = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut frames = Vec::new();
    while let Some(packet) = reader.next_packet() {
        frames.push(packet.unwrap().data.into_owned());
    }
    frames
}

fn pcap(config: &Path, from: &str, input: &Path, output: &Path) {
    let result = espgw()
        .args(["pcap", "--config"])
        .arg(config)
        .args(["--from", from, "--in"])
        .arg(input)
        .arg("--out")
        .arg(output)
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
}

#[test]
fn pcap_through_the_server_delivers_what_was_sent_over_both_transports() {
    let dir = temp_dir("pcap");
    let socket = dir.join("engine.sock");
    let _server = serve(&socket, "soft");
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600,
        "the socket is the owner's alone"
    );
    let packets: Vec<Vec<u8>> = [0usize, 17, 600, 1400]
        .iter()
        .enumerate()
        .map(|(i, &n)| common::udp_packet(common::HOST_A, common::HOST_B, n, i as u8))
        .collect();
    let mut frames = Vec::new();
    for p in &packets {
        let mut frame = vec![0x02, 0, 0, 0, 0x01, 0x01, 0x02, 0, 0, 0, 0x01, 0x10, 0x08, 0x00];
        frame.extend_from_slice(p);
        frames.push(frame);
    }
    let input = dir.join("in.pcap");
    write_pcap(&input, &frames);
    for transport in ["shm", "socket"] {
        let a = shared_config("configs/site-a.toml", &socket, transport, &dir);
        let b = shared_config("configs/site-b.toml", &socket, transport, &dir);
        let summary = espgw().arg("check-config").arg(&a).output().unwrap();
        let summary = String::from_utf8_lossy(&summary.stdout);
        let want = format!(
            "engine shared style async buffers registered socket {} transport {transport}",
            socket.display()
        );
        assert!(summary.contains(&want), "{summary}");
        let (esp, out) = (
            dir.join(format!("{transport}-esp.pcap")),
            dir.join(format!("{transport}-out.pcap")),
        );
        pcap(&a, "inside", &input, &esp);
        pcap(&b, "outside", &esp, &out);
        assert!(
            read_pcap(&esp).iter().all(|f| f[14 + 9] == 50),
            "{transport}: ESP on the outside"
        );
        let delivered = read_pcap(&out);
        assert_eq!(delivered.len(), packets.len(), "{transport}");
        for (got, sent) in delivered.iter().zip(&packets) {
            assert_eq!(&got[14..], &common::after_hops(sent, 2)[..], "{transport}");
        }
    }
    // The operator's view: four gateways came and went, nothing refused.
    let out = espgw()
        .args(["engine", "stats", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["attached"], 4, "{stats}");
    assert_eq!(stats["reclaimed"], 4, "{stats}");
    assert_eq!(stats["tenants"], 0, "{stats}");
    assert!(stats["executed"].as_u64().unwrap() >= 8, "{stats}");
    assert_eq!(stats["foreign_session"], 0);
    assert_eq!(stats["bad_region"], 0);
    // A second server on the same socket is refused, naming the path.
    let second = espgw()
        .args(["engine", "serve", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another server answers"));
}

#[test]
fn shared_engine_settings_are_checked_where_they_are_written() {
    let dir = temp_dir("config");
    let text = std::fs::read_to_string(repo("configs/site-a.toml")).unwrap();
    let cases = [
        ("engine = \"shared\"", "needs socket = \"PATH\""),
        (
            "engine = \"soft\"\nsocket = \"/tmp/x.sock\"",
            "set engine = \"shared\"",
        ),
        (
            "engine = \"shared\"\nsocket = \"/tmp/x.sock\"\ntransport = \"vsock\"",
            "expected shm or socket",
        ),
    ];
    for (i, (accel, want)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.toml"));
        std::fs::write(&path, text.replace("engine = \"soft\"", accel)).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let result = espgw().arg("check-config").arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success());
        assert!(
            err.contains(want) && err.contains(&format!("bad-{i}.toml:")),
            "{err}"
        );
    }
    // No server: the engine is refused with the command that starts one.
    let path = dir.join("no-server.toml");
    let missing = dir.join("missing.sock");
    std::fs::write(
        &path,
        text.replace(
            "engine = \"soft\"",
            &format!("engine = \"shared\"\nsocket = \"{}\"", missing.display()),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let input = dir.join("empty.pcap");
    write_pcap(&input, &[]);
    let result = espgw()
        .args(["pcap", "--config"])
        .arg(&path)
        .args(["--from", "inside", "--in"])
        .arg(&input)
        .arg("--out")
        .arg(dir.join("out.pcap"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success());
    assert!(err.contains("espgw engine serve --socket"), "{err}");
}
