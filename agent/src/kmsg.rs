//! Recognisers for hardware and kernel events in kernel log lines, as read from
//! `/dev/kmsg` (`pri,seq,usec,flags;message`) or as printed by dmesg and syslog
//! (`[  312.587402] NVRM: ...`, `Mar 14 04:52:23 host kernel: [ 312.5] NVRM: ...`).
//!
//! [`parse_line`] is cheap on the lines that matter not: a few literal searches reject
//! them before any parsing. It never panics, whatever the input.

use warden_model::wire::{EventSeverity, NodeEventKind};

use crate::{pci, xid::XidCatalog};

/// Longest message kept in an event, bytes.
pub const MAX_MESSAGE_LEN: usize = 512;

/// A hardware or kernel event recognised in one kernel log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelEvent {
    /// What kind of event.
    pub kind: NodeEventKind,
    /// How bad (XIDs through the catalog).
    pub severity: EventSeverity,
    /// The XID number, for XIDs.
    pub code: Option<u32>,
    /// PCI address of the device the line names, normalised (`0000:3b:00`).
    pub pci_bus_id: Option<String>,
    /// Network interface or HCA the line names (`ib0`, `mlx5_2`), for network events.
    pub device: Option<String>,
    /// Process id the line names (XID `pid=`, OOM victim).
    pub pid: Option<u32>,
    /// Process name the line names.
    pub process: Option<String>,
    /// The kernel message without its log prefix, capped at [`MAX_MESSAGE_LEN`] bytes.
    pub message: String,
    /// The part of the message that describes the event, without the process and
    /// address fields that vary between repeats (for XIDs, the text after `name=`).
    pub detail: String,
}

/// Literals one of which every recognised line contains.
const NEEDLES: [&str; 7] = [
    "NVRM",
    "mlx5",
    "ut of memory",
    "mce:",
    "AER",
    "ink down",
    "fallen off the bus",
];

/// Recognise one kernel log line; `None` when it is not an event this agent reports.
pub fn parse_line(line: &str) -> Option<KernelEvent> {
    if !NEEDLES.iter().any(|n| line.contains(n)) {
        return None;
    }
    let msg = strip_prefix(line);
    if msg.is_empty() {
        return None;
    }
    if msg.contains("NVRM")
        && let Some(ev) = parse_nvrm(msg)
    {
        return Some(ev);
    }
    if msg.contains("fallen off the bus") {
        return Some(event(
            NodeEventKind::FallenOffBus,
            EventSeverity::Fatal,
            msg,
            msg,
        ));
    }
    if msg.contains("AER")
        && let Some(ev) = parse_aer(msg)
    {
        return Some(ev);
    }
    if msg.contains("mce:") && msg.contains("Hardware Error") {
        let fatal = ["Fatal", "fatal", "PANIC", "Uncorrected", "uncorrected"];
        let severity = if fatal.iter().any(|w| msg.contains(w)) {
            EventSeverity::Error
        } else {
            EventSeverity::Warning
        };
        return Some(event(NodeEventKind::MachineCheck, severity, msg, msg));
    }
    if msg.contains("ut of memory")
        && let Some(ev) = parse_oom(msg)
    {
        return Some(ev);
    }
    parse_network(msg)
}

/// The kernel message of a line, without the `/dev/kmsg` header, the syslog
/// `host kernel:` prefix, a `<pri>` marker or the `[seconds]` timestamp.
pub fn strip_prefix(line: &str) -> &str {
    let mut s = line.trim();
    // /dev/kmsg: `6,1234,5678901,-;message` (fields may follow the flags).
    if let Some((head, rest)) = s.split_once(';')
        && head.len() <= 64
        && head.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && head.bytes().filter(|&b| b == b',').count() >= 3
        && head
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b",-+=".contains(&b))
    {
        s = rest;
    }
    // syslog / journal: `Mar 14 04:52:23 host kernel: message`.
    if let Some(i) = s.find(" kernel: ")
        && i <= 80
    {
        s = &s[i + " kernel: ".len()..];
    }
    // `dmesg -r`: `<4>message`.
    if let Some(rest) = s.strip_prefix('<')
        && let Some((pri, after)) = rest.split_once('>')
        && !pri.is_empty()
        && pri.len() <= 3
        && pri.bytes().all(|b| b.is_ascii_digit())
    {
        s = after;
    }
    // dmesg timestamp: `[  312.587402] message`.
    let t = s.trim_start();
    if let Some(rest) = t.strip_prefix('[')
        && let Some((ts, after)) = rest.split_once(']')
        && ts.len() <= 24
        && ts
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b' ')
    {
        s = after;
    }
    s.trim()
}

fn event(kind: NodeEventKind, severity: EventSeverity, msg: &str, detail: &str) -> KernelEvent {
    KernelEvent {
        kind,
        severity,
        code: None,
        pci_bus_id: pci::find(msg),
        device: None,
        pid: None,
        process: None,
        message: cap(msg),
        detail: cap(detail),
    }
}

fn cap(s: &str) -> String {
    if s.len() <= MAX_MESSAGE_LEN {
        return s.to_owned();
    }
    let mut end = MAX_MESSAGE_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn parse_nvrm(msg: &str) -> Option<KernelEvent> {
    if let Some(i) = msg.find("Xid (") {
        return parse_xid(msg, &msg[i + "Xid (".len()..]);
    }
    if msg.contains("fallen off the bus") {
        return None; // handled by the caller, with or without NVRM
    }
    let has = |words: &[&str]| words.iter().any(|w| msg.contains(w));
    if has(&["ECC", "ecc"]) {
        let severity = if has(&[
            "double bit",
            "double-bit",
            "Double Bit",
            "DBE",
            "uncorrectable",
            "Uncorrectable",
        ]) {
            EventSeverity::Error
        } else {
            EventSeverity::Warning
        };
        return Some(event(NodeEventKind::Ecc, severity, msg, msg));
    }
    if has(&["NVLink", "Nvlink", "NVLINK", "nvlink"])
        && has(&[
            "error", "Error", "ERROR", "fatal", "Fatal", "FATAL", "down", "DOWN",
        ])
    {
        return Some(event(NodeEventKind::Nvlink, EventSeverity::Error, msg, msg));
    }
    None
}

/// `rest` starts after `Xid (`: `PCI:0000:3b:00): 79, pid=1234, name=python, text`.
fn parse_xid(msg: &str, rest: &str) -> Option<KernelEvent> {
    let (bus, rest) = rest.split_once("):")?;
    let pci_bus_id = Some(pci::normalize(bus.trim())?);
    let rest = rest.trim_start();
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let code: u32 = rest.get(..digits)?.parse().ok()?;
    let rest = &rest[digits..];
    if !(rest.is_empty() || rest.starts_with([',', ' '])) {
        return None;
    }
    let mut rest = rest.trim_start_matches([',', ' ']);
    let mut pid = None;
    let mut process = None;
    if let Some(r) = rest.strip_prefix("pid=") {
        let (v, after) = r.split_once(',').unwrap_or((r, ""));
        pid = v.trim_matches(['\'', '"', ' ']).parse().ok();
        rest = after.trim_start();
    }
    if let Some(r) = rest.strip_prefix("name=") {
        let (v, after) = r.split_once(", ").unwrap_or((r, ""));
        let v = v.trim_matches(['\'', '"', ' ', ',']);
        if !v.is_empty() && v != "<unknown>" {
            process = Some(cap(v));
        }
        rest = after;
    }
    // XID 154 states the recovery the other XIDs need.
    let severity = XidCatalog::builtin().severity_in(code, rest);
    Some(KernelEvent {
        kind: NodeEventKind::Xid,
        severity,
        code: Some(code),
        pci_bus_id,
        device: None,
        pid,
        process,
        message: cap(msg),
        detail: cap(rest.trim()),
    })
}

fn parse_aer(msg: &str) -> Option<KernelEvent> {
    let i = msg.find("AER:")?;
    let tail = &msg[i..];
    if !(tail.contains("rror") || tail.contains("Link")) {
        return None;
    }
    let severity = if tail.contains("Uncorrected (Fatal)") || tail.contains("severity=Fatal") {
        EventSeverity::Error
    } else if tail.contains("Uncorrected") || tail.contains("Non-Fatal") {
        EventSeverity::Warning
    } else {
        EventSeverity::Info
    };
    let mut ev = event(NodeEventKind::Pcie, severity, msg, tail);
    // `pcieport 0000:00:03.0: AER: Corrected error received: 0000:3b:00.0`: the device
    // at fault is the one after "received".
    if let Some(j) = tail.find("received:")
        && let Some(p) = pci::find(&tail[j + "received:".len()..])
    {
        ev.pci_bus_id = Some(p);
    }
    Some(ev)
}

fn parse_oom(msg: &str) -> Option<KernelEvent> {
    let i = msg.find("Killed process ")?;
    let rest = &msg[i + "Killed process ".len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let pid = rest.get(..digits)?.parse().ok()?;
    let process = rest[digits..]
        .trim_start()
        .strip_prefix('(')
        .and_then(|r| r.split_once(')'))
        .map(|(name, _)| cap(name));
    let mut ev = event(NodeEventKind::OomKill, EventSeverity::Error, msg, &msg[..i]);
    ev.pci_bus_id = None;
    ev.pid = Some(pid);
    ev.process = process;
    Some(ev)
}

fn parse_network(msg: &str) -> Option<KernelEvent> {
    let link_down = msg.contains("ink down");
    let module_event = msg.contains("mlx5") && msg.contains("Port module event");
    if !(link_down || module_event) {
        return None;
    }
    // An InfiniBand / RoCE device: an mlx5 HCA, or an `ibN` / `ibpNsN` interface.
    let device = msg
        .split(|c: char| c.is_whitespace() || c == ':' || c == ',')
        .find(|t| {
            t.starts_with("mlx5_") && !t.starts_with("mlx5_core") && !t.contains("event")
                || (t.starts_with("ib")
                    && t[2..].starts_with(|c: char| c.is_ascii_digit() || c == 'p'))
        })
        .map(cap);
    if !msg.contains("mlx5") && device.is_none() {
        return None; // a link down on some other kind of interface
    }
    let severity = if link_down || msg.contains("error") || msg.contains("unplugged") {
        EventSeverity::Error
    } else {
        EventSeverity::Warning
    };
    let mut ev = event(NodeEventKind::Network, severity, msg, msg);
    ev.device = device;
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Want {
        kind: NodeEventKind,
        severity: EventSeverity,
        code: Option<u32>,
        pci: Option<&'static str>,
        pid: Option<u32>,
        process: Option<&'static str>,
    }

    fn want(kind: NodeEventKind, severity: EventSeverity) -> Want {
        Want {
            kind,
            severity,
            code: None,
            pci: None,
            pid: None,
            process: None,
        }
    }

    fn check(line: &str, w: Want) {
        let Some(ev) = parse_line(line) else {
            panic!("not recognised: {line}");
        };
        assert_eq!(ev.kind, w.kind, "{line}");
        assert_eq!(ev.severity, w.severity, "{line}");
        assert_eq!(ev.code, w.code, "{line}");
        assert_eq!(ev.pci_bus_id.as_deref(), w.pci, "{line}");
        assert_eq!(ev.pid, w.pid, "{line}");
        assert_eq!(ev.process.as_deref(), w.process, "{line}");
    }

    use EventSeverity as S;
    use NodeEventKind as K;

    #[test]
    fn xid_lines_in_every_log_format() {
        let body =
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.";
        for line in [
            body.to_owned(),
            format!("6,2231,312587402,-;{body}"),
            format!("[  312.587402] {body}"),
            format!("Mar 14 04:52:23 gpu-node-15 kernel: [  312.587402] {body}"),
            format!("Mar 14 04:52:23 gpu-node-15 kernel: {body}"),
            format!("<4>[  312.587402] {body}"),
        ] {
            check(
                &line,
                Want {
                    code: Some(79),
                    pci: Some("0000:3b:00"),
                    pid: Some(1234),
                    process: Some("python"),
                    ..want(K::Xid, S::Fatal)
                },
            );
            let ev = parse_line(&line).expect("recognised");
            assert_eq!(ev.message, body);
            assert_eq!(ev.detail, "GPU has fallen off the bus.");
        }
    }

    #[test]
    fn xid_variants() {
        // Unknown pid and name, as the driver prints them for hardware faults.
        check(
            "[ 2419087.113215] NVRM: Xid (PCI:0000:ab:00): 48, pid='<unknown>', name=<unknown>, \
             An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
            Want {
                code: Some(48),
                pci: Some("0000:ab:00"),
                ..want(K::Xid, S::Fatal)
            },
        );
        // Older drivers: no `PCI:` and no pid/name fields.
        check(
            "kernel: NVRM: Xid (0000:01:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)",
            Want {
                code: Some(13),
                pci: Some("0000:01:00"),
                ..want(K::Xid, S::Info)
            },
        );
        check(
            "NVRM: Xid (PCI:0000:18:00): 31, pid=88412, name=pt_main_thread, Ch 00000008, \
             intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_4c000000.",
            Want {
                code: Some(31),
                pci: Some("0000:18:00"),
                pid: Some(88412),
                process: Some("pt_main_thread"),
                ..want(K::Xid, S::Info)
            },
        );
        check(
            "NVRM: Xid (PCI:0000:5d:00): 74, pid=-1, name=<unknown>, NVLink: fatal error detected \
             on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            Want {
                code: Some(74),
                pci: Some("0000:5d:00"),
                ..want(K::Xid, S::Fatal)
            },
        );
        check(
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to \
             0x2 (Node Reboot Required)",
            Want {
                code: Some(154),
                pci: Some("0000:3b:00"),
                ..want(K::Xid, S::Fatal)
            },
        );
        // A code the catalog does not list.
        check(
            "NVRM: Xid (PCI:0000:3b:00): 999, something new",
            Want {
                code: Some(999),
                pci: Some("0000:3b:00"),
                ..want(K::Xid, S::Warning)
            },
        );
    }

    #[test]
    fn fallen_off_the_bus_without_xid() {
        for line in [
            "[2419087.113219] NVRM: GPU 0000:ab:00.0: GPU has fallen off the bus.",
            "NVRM: GPU at PCI:0000:AB:00: GPU has fallen off the bus.",
        ] {
            check(
                line,
                Want {
                    pci: Some("0000:ab:00"),
                    ..want(K::FallenOffBus, S::Fatal)
                },
            );
        }
    }

    #[test]
    fn ecc_and_nvlink_lines() {
        check(
            "NVRM: GPU at PCI:0000:41:00: uncorrectable ECC error (double bit) detected in framebuffer",
            Want {
                pci: Some("0000:41:00"),
                ..want(K::Ecc, S::Error)
            },
        );
        check(
            "NVRM: GPU 0000:41:00.0: single bit ECC error corrected at 0x3ffd51a40",
            Want {
                pci: Some("0000:41:00"),
                ..want(K::Ecc, S::Warning)
            },
        );
        check(
            "NVRM: GPU 0000:5d:00.0: NVLink: link 7 is DOWN, fatal error",
            Want {
                pci: Some("0000:5d:00"),
                ..want(K::Nvlink, S::Error)
            },
        );
        // Driver chatter is not an event.
        assert_eq!(
            parse_line("[   17.208311] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64"),
            None
        );
    }

    #[test]
    fn pcie_aer_lines() {
        check(
            "pcieport 0000:3a:00.0: AER: Corrected error received: 0000:3b:00.0",
            Want {
                pci: Some("0000:3b:00"),
                ..want(K::Pcie, S::Info)
            },
        );
        check(
            "[ 8812.1] nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), \
             type=Transaction Layer, (Receiver ID)",
            Want {
                pci: Some("0000:3b:00"),
                ..want(K::Pcie, S::Error)
            },
        );
        check(
            "pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
            Want {
                pci: Some("0000:3b:00"),
                ..want(K::Pcie, S::Warning)
            },
        );
    }

    #[test]
    fn network_lines() {
        check(
            "mlx5_core 0000:0c:00.0: mlx5_port_module_event:1191:(pid 0): Port module event[error]: \
             module 0, Cable error, Bus stuck (I2C or data shorted)",
            Want {
                pci: Some("0000:0c:00"),
                ..want(K::Network, S::Error)
            },
        );
        check(
            "mlx5_core 0000:0c:00.0: mlx5_port_module_event:1191:(pid 0): Port module event: \
             module 0, Cable plugged",
            Want {
                pci: Some("0000:0c:00"),
                ..want(K::Network, S::Warning)
            },
        );
        let line = "[ 9120.4] mlx5_core 0000:0c:00.0 ib0: Link down";
        check(
            line,
            Want {
                pci: Some("0000:0c:00"),
                ..want(K::Network, S::Error)
            },
        );
        assert_eq!(
            parse_line(line).and_then(|e| e.device).as_deref(),
            Some("ib0")
        );
        let line = "kernel: ibp24s0: Link down";
        assert_eq!(
            parse_line(line).and_then(|e| e.device).as_deref(),
            Some("ibp24s0")
        );
        // Ethernet link flaps on other NICs are not reported.
        assert_eq!(
            parse_line("e1000e 0000:00:1f.6 eno1: NIC Link is Down"),
            None
        );
        assert_eq!(
            parse_line("igb 0000:02:00.0 eth0: igb: eth0 NIC Link down"),
            None
        );
    }

    #[test]
    fn oom_and_machine_check_lines() {
        check(
            "[ 5120.99] Out of memory: Killed process 1234 (python) total-vm:81234567kB, \
             anon-rss:7654321kB, file-rss:0kB",
            Want {
                pid: Some(1234),
                process: Some("python"),
                ..want(K::OomKill, S::Error)
            },
        );
        check(
            "Memory cgroup out of memory: Killed process 4321 (pt_main_thread) total-vm:1kB",
            Want {
                pid: Some(4321),
                process: Some("pt_main_thread"),
                ..want(K::OomKill, S::Error)
            },
        );
        check(
            "mce: [Hardware Error]: Machine check events logged",
            want(K::MachineCheck, S::Warning),
        );
        check(
            "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank 5: be00000000800400 \
             Uncorrected error",
            want(K::MachineCheck, S::Error),
        );
    }

    #[test]
    fn garbage_and_empty_lines_are_not_events() {
        let long = "NVRM ".repeat(100_000);
        let cases = [
            "",
            " ",
            ";",
            "6,1,2,-;",
            "[",
            "[]",
            "<",
            "<>",
            "NVRM",
            "NVRM: Xid (",
            "NVRM: Xid (PCI:0000:3b:00): ",
            "NVRM: Xid (PCI:0000:3b:00): x",
            "NVRM: Xid (PCI:0000:3b:00): 99999999999999999999, huge",
            "Out of memory: Killed process ",
            "Out of memory: Killed process (python)",
            "mce:",
            "AER:",
            "ink down",
            "mlx5",
            "ü NVRM Xid (é): 7é, pid=é, name=ü",
            long.as_str(),
        ];
        for line in cases {
            assert_eq!(parse_line(line), None, "{line:.80}");
        }
        // Every prefix of real lines, cut at every char boundary: no panic.
        let real =
            "Mar 14 04:52:23 h kernel: [ 1.2] NVRM: Xid (PCI:0000:41:00): 48, pid=1, name=p, x é";
        for (i, _) in real.char_indices() {
            let _ = parse_line(&real[..i]);
        }
        // A long XID message is capped.
        let line = format!("NVRM: Xid (PCI:0000:3b:00): 13, {}", "é".repeat(10_000));
        let ev = parse_line(&line).expect("recognised");
        assert!(ev.message.len() <= MAX_MESSAGE_LEN && ev.detail.len() <= MAX_MESSAGE_LEN);
    }
}
