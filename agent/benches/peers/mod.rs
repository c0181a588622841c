//! Log shippers run beside the agent by the steady bench (`WARDEN_BENCH_PEERS`): each in
//! the foreground, with a generated config in its own directory, tailing the bench's log
//! and forwarding every line over TCP to a counting sink the bench runs.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::support::free_port;
use warden_testkit::{PATIENCE, wait_for};

/// A peer the bench knows: its name in `WARDEN_BENCH_PEERS`, binary, version flag and
/// Debian package.
#[derive(Clone, Copy)]
pub struct Kind {
    pub name: &'static str,
    bin: &'static str,
    version_flag: &'static str,
    package: &'static str,
}

const KINDS: [Kind; 2] = [
    Kind {
        name: "rsyslog",
        bin: "rsyslogd",
        version_flag: "-v",
        package: "rsyslog",
    },
    Kind {
        name: "syslog-ng",
        bin: "syslog-ng",
        version_flag: "--version",
        package: "syslog-ng-core (it conflicts with rsyslog: to have both, unpack it with \
                  `dpkg -x` and put a wrapper on PATH, BENCHMARKS.md \"Against a log shipper\")",
    },
];

/// The peers `WARDEN_BENCH_PEERS` asks for (comma-separated; none when unset), each with
/// the first line of its version. Panics on an unknown name or a binary not on PATH.
pub fn from_env() -> Vec<(Kind, String)> {
    let asked = std::env::var("WARDEN_BENCH_PEERS").unwrap_or_default();
    asked
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            let Some(kind) = KINDS.iter().find(|k| k.name == name) else {
                panic!("WARDEN_BENCH_PEERS: unknown peer {name:?} (known: rsyslog, syslog-ng)");
            };
            let out = match Command::new(kind.bin).arg(kind.version_flag).output() {
                Ok(out) => out,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "WARDEN_BENCH_PEERS asks for {name}, but `{}` is not on PATH: install the \
                     Debian package {}",
                    kind.bin, kind.package
                ),
                Err(e) => panic!("cannot run `{} {}`: {e}", kind.bin, kind.version_flag),
            };
            let text = String::from_utf8_lossy(&out.stdout);
            (*kind, text.lines().next().unwrap_or("").trim().to_owned())
        })
        .collect()
}

/// A running peer and the sink it forwards to; killed when dropped.
pub struct Peer {
    pub name: &'static str,
    child: Child,
    /// Bytes and lines (newlines) the sink has received.
    bytes: Arc<AtomicU64>,
    lines: Arc<AtomicU64>,
}

impl Peer {
    /// Start `kind` tailing `log` from its start, with its config, pid file and state in
    /// `dir/<name>`, and wait until it has written its pid file.
    pub fn start(kind: Kind, dir: &Path, log: &Path) -> Peer {
        let d = dir.join(kind.name);
        std::fs::create_dir_all(&d).expect("peer dir");
        let port = free_port();
        let (bytes, lines) = tcp_sink(port);
        let (conf, pid) = (d.join(format!("{}.conf", kind.name)), d.join("pid"));
        let at = |p: &Path| p.display().to_string();
        let (text, args): (String, Vec<String>) = if kind.name == "rsyslog" {
            // Only imfile: no imuxsock (/dev/log), no imklog; its lines in a ruleset of
            // their own, so rsyslog's own messages are not forwarded.
            let text = format!(
                "global(workDirectory=\"{}\")\nmodule(load=\"imfile\")\n\
                 input(type=\"imfile\" File=\"{}\" Tag=\"train\" ruleset=\"fwd\")\n\
                 ruleset(name=\"fwd\") {{\n  action(type=\"omfwd\" target=\"127.0.0.1\" \
                 port=\"{port}\" protocol=\"tcp\")\n}}\n",
                at(&d),
                at(log)
            );
            (
                text,
                vec!["-n".into(), "-f".into(), at(&conf), "-i".into(), at(&pid)],
            )
        } else {
            // No internal() source: nothing but the file's lines is forwarded; no-parse,
            // as imfile takes a line as the message.
            let text = format!(
                "@version: 3.38\n\
                 source s_train {{ file(\"{}\" follow-freq(1) flags(no-parse)); }};\n\
                 destination d_sink {{ network(\"127.0.0.1\" port({port}) transport(\"tcp\")); }};\n\
                 log {{ source(s_train); destination(d_sink); }};\n",
                at(log)
            );
            let args = vec![
                "-F".into(),
                "-f".into(),
                at(&conf),
                "-p".into(),
                at(&pid),
                format!("--persist-file={}", at(&d.join("persist"))),
                format!("--control={}", at(&d.join("ctl"))),
            ];
            (text, args)
        };
        std::fs::write(&conf, text).expect("peer config");
        let child = Command::new(kind.bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", kind.bin));
        let mut peer = Peer {
            name: kind.name,
            child,
            bytes,
            lines,
        };
        let what = format!("{} to write its pid file (see its output above)", kind.bin);
        let written = wait_for(&what, PATIENCE, || {
            if let Ok(Some(status)) = peer.child.try_wait() {
                return Some(Err(status));
            }
            let pid = std::fs::read_to_string(&pid).ok()?;
            pid.trim().parse::<u32>().ok().map(Ok)
        });
        match written {
            Ok(p) if p == peer.pid() => peer,
            Ok(p) => panic!("{} wrote pid {p}, not its own {}", kind.bin, peer.pid()),
            Err(status) => panic!("{} exited ({status}) (see its output above)", kind.bin),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (bytes, lines) the sink has received so far.
    pub fn delivered(&self) -> (u64, u64) {
        (
            self.bytes.load(Ordering::Relaxed),
            self.lines.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain TCP listener on 127.0.0.1:`port` that reads and discards what every
/// connection sends, counting bytes and lines.
fn tcp_sink(port: u16) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("peer sink port");
    let (bytes, lines): (Arc<AtomicU64>, Arc<AtomicU64>) = Default::default();
    let (b, l) = (bytes.clone(), lines.clone());
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let (b, l) = (b.clone(), l.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    b.fetch_add(n as u64, Ordering::Relaxed);
                    let nl = memchr::memchr_iter(b'\n', &buf[..n]).count();
                    l.fetch_add(nl as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (bytes, lines)
}
