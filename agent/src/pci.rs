//! PCI bus ids as the kernel and the NVIDIA driver print them, reduced to one form so
//! that `0000:3b:00`, `PCI:0000:3B:00.0` and `00000000:3b:00.0` name the same device.

/// The canonical form of a PCI address: `dddd:bb:dd` in lower-case hex (domain, bus,
/// device; the function is dropped, as GPUs are function 0 and NVRM omits it). Domains
/// above `ffff` (Intel VMD puts devices in `10000` and up) keep their extra digits, as
/// the kernel prints them; the canonical form of a canonical form is itself.
///
/// Accepts an optional `PCI:` prefix, a domain of 4 to 8 digits (or none, meaning 0),
/// and an optional `.function`. Returns `None` for anything else.
pub fn normalize(raw: &str) -> Option<String> {
    let s = raw.strip_prefix("PCI:").unwrap_or(raw);
    let (s, has_func) = match s.rsplit_once('.') {
        Some((head, func)) if !func.is_empty() && func.len() <= 2 && is_hex(func) => (head, true),
        Some(_) => return None,
        None => (s, false),
    };
    let mut parts = s.split(':');
    let (domain, bus, dev) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(v), None) if (4..=8).contains(&d.len()) => (d, b, v),
        // Without a domain only with a function (`3b:00.0`), so times like 04:52 are not
        // taken for addresses.
        (Some(b), Some(v), None, None) if has_func => ("0", b, v),
        _ => return None,
    };
    let ok = |p: &str, max: usize| !p.is_empty() && p.len() <= max && is_hex(p);
    if !(ok(domain, 8) && ok(bus, 2) && ok(dev, 2)) {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}"))
}

/// The first token of `s` that is a PCI address, normalised.
pub fn find(s: &str) -> Option<String> {
    s.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')' || c == '[' || c == ']')
        .map(|t| t.trim_end_matches(':'))
        .filter(|t| t.len() >= 7 && t.contains(':'))
        .find_map(normalize)
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_device_agree() {
        for raw in [
            "0000:3b:00",
            "0000:3B:00.0",
            "PCI:0000:3b:00",
            "00000000:3b:00.0",
            "3b:00.0",
        ] {
            assert_eq!(normalize(raw).as_deref(), Some("0000:3b:00"), "{raw}");
        }
    }

    #[test]
    fn a_normalised_address_normalises_to_itself() {
        // Domains past 16 bits (Intel VMD) as NVML and the kernel print them.
        for (raw, canonical) in [
            ("00010000:3b:00.0", "10000:3b:00"),
            ("PCI:00040000:3b:00", "40000:3b:00"),
            ("10000:3b:00.0", "10000:3b:00"),
            ("0000:3b:00", "0000:3b:00"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Some(canonical), "{raw}");
            assert_eq!(
                normalize(canonical).as_deref(),
                Some(canonical),
                "{canonical}"
            );
        }
    }

    #[test]
    fn non_addresses_are_refused() {
        for raw in [
            "",
            "3b",
            "xyz:00:00",
            "0000:3b:00:01",
            "0000:3b:00.zz",
            "0000:123:00",
            "123456789:3b:00",
            ":::",
            "12:34:56",
            "3b:00",
        ] {
            assert_eq!(normalize(raw), None, "{raw}");
        }
    }

    #[test]
    fn finds_the_first_address_in_text() {
        assert_eq!(
            find("NVRM: GPU 0000:ab:00.0: GPU has fallen off the bus.").as_deref(),
            Some("0000:ab:00")
        );
        assert_eq!(find("Mar 14 04:52:23 host at 12:34:56 nothing"), None);
    }
}
