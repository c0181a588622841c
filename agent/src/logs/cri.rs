//! The Kubernetes CRI container log format and path layout.
//!
//! The kubelet's container runtime writes each container's output to
//! `/var/log/pods/<namespace>_<pod>_<pod uid>/<container>/<restart count>.log` (with
//! symlinks `/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`),
//! one record per line: `<RFC 3339 time> <stdout|stderr> <tag> <text>`. The tag is `F`
//! for a full line or the last piece of one, `P` for a piece of a line the runtime
//! split (at 16 KiB by default); the pieces of one line are joined until its `F`.

use warden_model::wire::LogStream;

/// One CRI log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriRecord<'a> {
    /// Runtime timestamp, ns since the Unix epoch.
    pub at_ns: i64,
    /// Stream.
    pub stream: LogStream,
    /// A `P` record: more of this line follows.
    pub partial: bool,
    /// The text (without the newline).
    pub content: &'a [u8],
}

/// Parse one CRI record line (without its newline); `None` when it does not have the
/// CRI shape.
pub fn parse_record(line: &[u8]) -> Option<CriRecord<'_>> {
    let sp = line.iter().position(|&b| b == b' ')?;
    let at_ns = parse_rfc3339_ns(&line[..sp])?;
    let rest = &line[sp + 1..];
    let (stream, rest) = if let Some(r) = rest.strip_prefix(b"stdout ") {
        (LogStream::Stdout, r)
    } else if let Some(r) = rest.strip_prefix(b"stderr ") {
        (LogStream::Stderr, r)
    } else {
        return None;
    };
    // Tag: `P`, `F`, or tags joined with `:` of which the first says partial or full.
    let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
    let tag = &rest[..end];
    let partial = match tag.split(|&b| b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return None,
    };
    let content = if end < rest.len() {
        &rest[end + 1..]
    } else {
        &[][..]
    };
    Some(CriRecord {
        at_ns,
        stream,
        partial,
        content,
    })
}

/// Whether a line looks like a CRI record (for format auto-detection).
pub fn looks_like_record(line: &[u8]) -> bool {
    parse_record(line).is_some()
}

/// Parse an RFC 3339 timestamp (`2024-05-01T12:00:00.123456789Z`, or with a numeric
/// offset such as `+02:00`) to ns since the Unix epoch. Fractions longer than 9 digits
/// are cut to ns.
pub fn parse_rfc3339_ns(s: &[u8]) -> Option<i64> {
    if s.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let mut v = 0i64;
        for &b in s.get(r)? {
            if !b.is_ascii_digit() {
                return None;
            }
            v = v * 10 + i64::from(b - b'0');
        }
        Some(v)
    };
    if s[4] != b'-' || s[7] != b'-' || !matches!(s[10], b'T' | b't' | b' ') {
        return None;
    }
    if s[13] != b':' || s[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 {
        return None;
    }
    if sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if s[i] == b'.' {
        i += 1;
        let start = i;
        while i < s.len() && s[i].is_ascii_digit() {
            if i - start < 9 {
                nanos = nanos * 10 + i64::from(s[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..9 {
            nanos *= 10;
        }
    }
    let offset_secs = match s.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let h = i64::from((h1 - b'0') * 10 + (h2 - b'0'));
            let m = i64::from((m1 - b'0') * 10 + (m2 - b'0'));
            let off = h * 3600 + m * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_secs;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What a container log path says about the pod it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLogPath {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// Parse a container log path: `/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`
/// (any parent directory, rotated names such as `0.log.20240501-120000` included) or
/// `/var/log/containers/<pod>_<ns>_<container>-<64 hex id>.log`.
pub fn parse_pod_log_path(path: &str) -> Option<PodLogPath> {
    let mut parts = path.rsplit('/');
    let file = parts.next()?;
    let dir = parts.next()?;
    let grand = parts.next()?;
    // /var/log/pods layout: <ns>_<pod>_<uid>/<container>/<n>.log
    let restart = file.split('.').next().unwrap_or("");
    if !restart.is_empty() && restart.bytes().all(|b| b.is_ascii_digit()) && file.contains(".log") {
        let mut it = grand.split('_');
        if let (Some(ns), Some(pod), Some(uid), None) = (it.next(), it.next(), it.next(), it.next())
            && !ns.is_empty()
            && !pod.is_empty()
            && !uid.is_empty()
            && !dir.is_empty()
        {
            return Some(PodLogPath {
                namespace: ns.to_string(),
                pod: pod.to_string(),
                container: dir.to_string(),
            });
        }
    }
    // /var/log/containers layout: <pod>_<ns>_<container>-<id>.log
    let stem = file.strip_suffix(".log")?;
    let mut it = stem.split('_');
    let (pod, ns, rest) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    let (container, id) = rest.rsplit_once('-')?;
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if pod.is_empty() || ns.is_empty() || container.is_empty() {
        return None;
    }
    Some(PodLogPath {
        namespace: ns.to_string(),
        pod: pod.to_string(),
        container: container.to_string(),
    })
}

/// Whether a path is in one of the kubelet's container log directories.
pub fn is_container_log_dir(path: &str) -> bool {
    path.contains("/var/log/pods/") || path.contains("/var/log/containers/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_partial_records() {
        let r = parse_record(b"2024-05-01T12:00:00.123456789Z stdout F hello world")
            .expect("valid record");
        assert_eq!(r.at_ns, 1_714_564_800_123_456_789);
        assert_eq!(r.stream, LogStream::Stdout);
        assert!(!r.partial);
        assert_eq!(r.content, b"hello world");

        let r = parse_record(b"2024-05-01T12:00:00Z stderr P  two spaces").expect("valid");
        assert!(r.partial);
        assert_eq!(r.stream, LogStream::Stderr);
        assert_eq!(r.content, b" two spaces");

        let r = parse_record(b"2024-05-01T12:00:00.5Z stdout F").expect("empty content");
        assert_eq!(r.content, b"");
        assert_eq!(r.at_ns, 1_714_564_800_500_000_000);

        let r = parse_record(b"2024-05-01T12:00:00.5Z stdout F:x y").expect("tag list");
        assert_eq!(r.content, b"y");
    }

    #[test]
    fn not_records() {
        for l in [
            &b"hello"[..],
            b"2024-05-01T12:00:00Z stdin F x",
            b"2024-05-01T12:00:00Z stdout X x",
            b"2024-13-01T12:00:00Z stdout F x",
            b"2024-05-01 12:00:00,123 INFO x",
            b"[2024-05-01T12:00:00Z] stdout F x",
            b"",
            b"\xff\xfe stdout F",
        ] {
            assert!(parse_record(l).is_none(), "{}", String::from_utf8_lossy(l));
        }
    }

    #[test]
    fn timestamps_with_offsets_and_long_fractions() {
        let z = parse_rfc3339_ns(b"2021-03-05T11:21:48.000000001Z").expect("valid");
        let plus = parse_rfc3339_ns(b"2021-03-05T13:21:48.000000001+02:00").expect("valid");
        let minus = parse_rfc3339_ns(b"2021-03-05T06:21:48.000000001-05:00").expect("valid");
        assert_eq!(z, plus);
        assert_eq!(z, minus);
        let long = parse_rfc3339_ns(b"2021-03-05T11:21:48.0000000019Z").expect("valid");
        assert_eq!(long, z);
        assert_eq!(parse_rfc3339_ns(b"1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ns(b"2000-02-29T00:00:00Z"),
            Some(951_782_400_000_000_000)
        );
        assert_eq!(parse_rfc3339_ns(b"2021-03-05T11:21:48.Z"), None);
        assert_eq!(parse_rfc3339_ns(b"2021-03-05T11:21:48+0200"), None);
    }

    #[test]
    fn pod_log_paths() {
        let p = parse_pod_log_path(
            "/var/log/pods/train_llama-worker-3_0f1e2d3c-4b5a-6978-8899-aabbccddeeff/pytorch/0.log",
        )
        .expect("pods layout");
        assert_eq!(p.namespace, "train");
        assert_eq!(p.pod, "llama-worker-3");
        assert_eq!(p.container, "pytorch");
        let rotated = parse_pod_log_path("/var/log/pods/ns_pod-0_uid/c/1.log.20240501-120000")
            .expect("rotated name");
        assert_eq!(rotated.pod, "pod-0");
        let id = "a".repeat(64);
        let p = parse_pod_log_path(&format!(
            "/var/log/containers/llama-master-0_train_pytorch-{id}.log"
        ))
        .expect("containers layout");
        assert_eq!(p.pod, "llama-master-0");
        assert_eq!(p.namespace, "train");
        assert_eq!(p.container, "pytorch");
        assert_eq!(parse_pod_log_path("/var/log/train/rank_3.log"), None);
        assert_eq!(parse_pod_log_path("0.log"), None);
    }
}
