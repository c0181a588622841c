//! The `warden-agent` binary as the Kubernetes DaemonSet runs it: a non-root user
//! (uid 65532, supplementary group 0 for the kubelet's container logs) whose only
//! capabilities are file capabilities on the binary (`cap_syslog,cap_dac_override=ep`),
//! inside a bounding set of just those two. It must open the real `/dev/kmsg` and bind
//! its capture socket in a root-owned directory, then hold no capability at all and have
//! `no_new_privs` set, and keep reading the kernel log, the capture socket and root's
//! mode-0640 container logs. Without the file capabilities the same two opens fail and
//! the agent keeps running with those collectors down.
//!
//! Needs root (to switch user and set file capabilities), `setpriv` (util-linux) and
//! `setcap` (libcap2-bin); under `CI=true` a missing one is a failure.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod support;
use support::{AgentProc, free_port, metric};

/// The DaemonSet's user and group.
const AGENT_UID: u32 = 65532;

/// Whether this test can run here; under CI it must.
fn runnable() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        == Some("0");
    let tool = |name: &str| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    let missing: Vec<&str> = [
        (!root).then_some("root"),
        (!tool("setpriv")).then_some("setpriv (util-linux)"),
        (!tool("setcap")).then_some("setcap (libcap2-bin)"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!("privilege test needs {}", missing.join(", "));
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

fn dmesg_restricted() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|s| s.trim() == "1")
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A node as the DaemonSet sees it, under `dir`: the agent binary (with `caps` as file
/// capabilities, if any), a root-owned capture directory, and a container log the way
/// containerd writes it (root, mode 0640).
struct Node {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    config: PathBuf,
    port: u16,
    pod_log: PathBuf,
    socket: PathBuf,
}

impl Node {
    fn new(caps: Option<&str>) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        chmod(dir.path(), 0o755);
        let bin = dir.path().join("warden-agent");
        // Copied by `cp`, not in this process: a file this process held open for
        // writing can be inherited by a child the other test forks at that moment, and
        // executing it then fails with ETXTBSY ("Text file busy").
        let cp = Command::new("cp")
            .arg(env!("CARGO_BIN_EXE_warden-agent"))
            .arg(&bin)
            .status()
            .expect("run cp");
        assert!(cp.success(), "copy the agent: {cp}");
        chmod(&bin, 0o755);
        if let Some(caps) = caps {
            let out = Command::new("setcap")
                .arg(caps)
                .arg(&bin)
                .output()
                .expect("setcap");
            assert!(
                out.status.success(),
                "setcap {caps}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let run = dir.path().join("run/warden");
        std::fs::create_dir_all(&run).expect("capture dir");
        chmod(&run, 0o755);
        chmod(&dir.path().join("run"), 0o755);
        let logs = dir.path().join("pods/train_rank0_0a1b/trainer");
        std::fs::create_dir_all(&logs).expect("pod log dir");
        for d in [
            &logs,
            logs.parent().expect("pod dir"),
            &dir.path().join("pods"),
        ] {
            chmod(d, 0o755);
        }
        let pod_log = logs.join("0.log");
        std::fs::write(&pod_log, "").expect("pod log");
        chmod(&pod_log, 0o640);
        let boot = dir.path().join("boot_id");
        std::fs::write(&boot, "boot-privilege\n").expect("boot id");
        let port = free_port();
        let socket = run.join("capture.sock");
        let config = dir.path().join("agent.yaml");
        std::fs::write(
            &config,
            format!(
                "node_name: gpu-node-9\nlisten: 127.0.0.1:{port}\n\
                 nvml:\n  enabled: false\n\
                 kmsg:\n  path: /dev/kmsg\n  boot_id_path: {}\n\
                 logs:\n  sources:\n    - paths: [\"{}/pods/*/*/*.log\"]\n      format: cri\n\
                 capture:\n  socket: {}\n  shm_dir: {}\n",
                boot.display(),
                dir.path().display(),
                socket.display(),
                dir.path().join("shm").display(),
            ),
        )
        .expect("config");
        Node {
            _dir: dir,
            bin,
            config,
            port,
            pod_log,
            socket,
        }
    }

    /// Start the agent as uid/gid 65532 with supplementary group 0, inside a bounding
    /// set of `cap_syslog` and `cap_dac_override` (the DaemonSet's `capabilities.add`),
    /// no inheritable or ambient capability, and `no_new_privs` off (file capabilities
    /// need it off: `allowPrivilegeEscalation: true`).
    fn start(&self) -> AgentProc {
        let child = Command::new("setpriv")
            .args(["--reuid", &AGENT_UID.to_string()])
            .args(["--regid", &AGENT_UID.to_string()])
            .args(["--groups", "0"])
            .args(["--inh-caps", "-all"])
            .args(["--bounding-set", "-all,+syslog,+dac_override"])
            .arg("--")
            .arg(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the agent through setpriv");
        AgentProc::ready(child, self.port)
    }

    fn append_pod_log(&self, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.pod_log)
            .expect("open pod log");
        writeln!(f, "2026-11-24T12:00:00.000000000Z stdout F {line}").expect("write pod log");
    }
}

/// `field` of `/proc/<pid>/status`, trimmed.
fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

#[test]
fn a_non_root_agent_opens_what_it_needs_then_holds_no_capability() {
    if !runnable() {
        return;
    }
    let node = Node::new(Some("cap_syslog,cap_dac_override=ep"));
    let agent = node.start();
    let pid = agent.pid();

    // Who it runs as, and what it holds once it runs.
    assert_eq!(
        status_field(pid, "Uid:")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["65532"; 4]
    );
    assert_eq!(status_field(pid, "Groups:"), "0");
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
        assert_eq!(
            status_field(pid, set),
            "0000000000000000",
            "{set} of the running agent"
        );
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    // Every thread, not just the first: capabilities are per thread.
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let task = task.expect("task").path();
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        for set in ["CapPrm:", "CapEff:"] {
            let line = status.lines().find(|l| l.starts_with(set));
            assert!(
                line.is_none_or(|l| l.ends_with("0000000000000000")),
                "{}: {line:?}",
                task.display()
            );
        }
    }

    // Capabilities are given up, and the collectors and their metrics set up, before
    // the agent serves /metrics: one scrape shows them.
    let m = agent.metrics();
    assert_eq!(metric(&m, "warden_agent_capabilities"), Some(0.0), "{m}");
    // The kernel log, opened with CAP_SYSLOG, is read without it.
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"kmsg\"}"),
        Some(1.0),
        "{m}"
    );
    agent.wait_metric("warden_agent_kmsg_lines_total", |n| n > 0.0);

    // The capture socket, bound in root's directory with CAP_DAC_OVERRIDE, is the
    // agent's and open to every local user.
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"capture\"}"),
        Some(1.0),
        "{m}"
    );
    let sock = std::fs::symlink_metadata(&node.socket).expect("capture socket");
    assert_eq!(sock.uid(), AGENT_UID);
    assert_eq!(sock.mode() & 0o777, 0o666);
    std::os::unix::net::UnixStream::connect(&node.socket).expect("connect to the capture socket");

    // Root's mode-0640 container log is read through group 0, with no capability.
    node.append_pod_log("step 1 | loss 2.5");
    agent.wait_metric("warden_agent_log_lines_total", |n| n >= 1.0);
}

#[test]
fn without_its_file_capabilities_the_agent_runs_with_those_collectors_down() {
    if !runnable() {
        return;
    }
    let node = Node::new(None);
    let agent = node.start();
    let m = agent.metrics();
    assert_eq!(metric(&m, "warden_agent_capabilities"), Some(0.0), "{m}");
    let kmsg = metric(&m, "warden_agent_collector_up{collector=\"kmsg\"}");
    // /dev/kmsg needs CAP_SYSLOG only under kernel.dmesg_restrict=1.
    assert_eq!(
        kmsg,
        Some(if dmesg_restricted() { 0.0 } else { 1.0 }),
        "{m}"
    );
    assert_eq!(
        metric(&m, "warden_agent_collector_up{collector=\"capture\"}"),
        Some(0.0),
        "the socket cannot be bound in root's directory: {m}"
    );
    assert!(!node.socket.exists());
    // What needs no capability still works.
    node.append_pod_log("step 1 | loss 2.5");
    agent.wait_metric("warden_agent_log_lines_total", |n| n >= 1.0);
    assert_eq!(status_field(agent.pid(), "NoNewPrivs:"), "1");
}
