//! NVIDIA's XID catalog (code → meaning, severity, cause, recommended action), loaded
//! from the data file `rules/xid.yaml` that ships inside every binary: the one source
//! of what an XID means for the agent's event severity, the simulator's physics and the
//! remediation policy's XID conditions.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::wire::EventSeverity;

/// The catalog shipped with Warden.
pub const BUILTIN: &str = include_str!("../../rules/xid.yaml");

/// Severity given to an XID the catalog does not list.
pub const UNKNOWN_SEVERITY: EventSeverity = EventSeverity::Warning;

/// What usually causes an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// Failing or marginal GPU hardware (PCIe link, board, firmware-detected faults).
    Hardware,
    /// The NVIDIA driver or GPU firmware.
    Driver,
    /// The application running on the GPU.
    Application,
    /// Temperature.
    Thermal,
    /// Power delivery.
    Power,
    /// NVLink or chip-to-chip links.
    Nvlink,
    /// GPU memory (ECC, row remapping).
    Memory,
}

impl Cause {
    /// The variant with this label, as written in the catalog.
    pub fn from_label(s: &str) -> Option<Self> {
        Some(match s {
            "hardware" => Cause::Hardware,
            "driver" => Cause::Driver,
            "application" => Cause::Application,
            "thermal" => Cause::Thermal,
            "power" => Cause::Power,
            "nvlink" => Cause::Nvlink,
            "memory" => Cause::Memory,
            _ => return None,
        })
    }

    /// The label written in the catalog.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::Hardware => "hardware",
            Cause::Driver => "driver",
            Cause::Application => "application",
            Cause::Thermal => "thermal",
            Cause::Power => "power",
            Cause::Nvlink => "nvlink",
            Cause::Memory => "memory",
        }
    }
}

/// One catalog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidInfo {
    /// The XID number.
    pub code: u32,
    /// Short meaning.
    pub name: String,
    /// How bad it is for the GPU and the job on it.
    pub severity: EventSeverity,
    /// What usually causes it.
    pub cause: Cause,
    /// NVIDIA's recommended immediate action, in a few words.
    pub action: String,
    /// Marked "Unused" on A100 and newer GPUs.
    pub unused: bool,
    /// A known cause outside the GPU itself (a driver or firmware bug that an update
    /// fixes, the application), when there is one.
    pub known: Option<String>,
}

/// Why a catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum XidError {
    /// Not valid YAML, or not a list of mappings with known fields.
    #[error("XID catalog is not a valid list of entries: {0}")]
    Yaml(#[from] crate::yaml::Error),
    /// A required field is absent.
    #[error("XID catalog entry {index}: missing field `{field}`")]
    Missing {
        /// Position of the entry in the list, from 0.
        index: usize,
        /// The field.
        field: &'static str,
    },
    /// A field has a value outside its set.
    #[error("XID catalog entry {index}: field `{field}` has invalid value {value:?}")]
    Invalid {
        /// Position of the entry in the list, from 0.
        index: usize,
        /// The field.
        field: &'static str,
        /// What was written.
        value: String,
    },
    /// Two entries for one code.
    #[error("XID catalog entry {index}: code {code} is listed twice")]
    Duplicate {
        /// Position of the second entry, from 0.
        index: usize,
        /// The code.
        code: u32,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    code: Option<u32>,
    name: Option<String>,
    severity: Option<String>,
    cause: Option<String>,
    action: Option<String>,
    #[serde(default)]
    unused: bool,
    #[serde(default)]
    known: Option<String>,
}

/// The XID catalog, by code.
#[derive(Debug, Default)]
pub struct XidCatalog {
    by_code: BTreeMap<u32, XidInfo>,
}

impl XidCatalog {
    /// Parse a catalog in the format of `rules/xid.yaml`.
    pub fn parse(yaml: &str) -> Result<Self, XidError> {
        let raw: Vec<RawEntry> = crate::yaml::from_str(yaml)?;
        let mut by_code = BTreeMap::new();
        for (index, e) in raw.into_iter().enumerate() {
            let missing = |field| XidError::Missing { index, field };
            let code = e.code.ok_or_else(|| missing("code"))?;
            let name = e
                .name
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| missing("name"))?;
            let action = e
                .action
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| missing("action"))?;
            let severity = e.severity.ok_or_else(|| missing("severity"))?;
            let severity = EventSeverity::from_label(&severity).ok_or(XidError::Invalid {
                index,
                field: "severity",
                value: severity,
            })?;
            let cause = e.cause.ok_or_else(|| missing("cause"))?;
            let cause = Cause::from_label(&cause).ok_or(XidError::Invalid {
                index,
                field: "cause",
                value: cause,
            })?;
            let info = XidInfo {
                code,
                name,
                severity,
                cause,
                action,
                unused: e.unused,
                known: e.known.filter(|s| !s.trim().is_empty()),
            };
            if by_code.insert(code, info).is_some() {
                return Err(XidError::Duplicate { index, code });
            }
        }
        Ok(XidCatalog { by_code })
    }

    /// The catalog shipped with Warden, parsed once. Should the shipped file fail
    /// to parse (the tests make sure it does not), this is an empty catalog and
    /// [`XidCatalog::builtin_error`] says why.
    pub fn builtin() -> &'static XidCatalog {
        static EMPTY: OnceLock<XidCatalog> = OnceLock::new();
        match builtin_result() {
            Ok(c) => c,
            Err(_) => EMPTY.get_or_init(XidCatalog::default),
        }
    }

    /// Why the shipped catalog failed to load, if it did.
    pub fn builtin_error() -> Option<&'static XidError> {
        builtin_result().as_ref().err()
    }

    /// The entry for `code`.
    pub fn get(&self, code: u32) -> Option<&XidInfo> {
        self.by_code.get(&code)
    }

    /// The severity of `code`; [`UNKNOWN_SEVERITY`] when the catalog does not list it.
    pub fn severity(&self, code: u32) -> EventSeverity {
        self.get(code).map_or(UNKNOWN_SEVERITY, |i| i.severity)
    }

    /// The severity of one report of `code` whose kernel-log text is `text`: the
    /// catalog's, except where the message states the recovery it needs (XID 154,
    /// "Reset Required" or "Reboot Required": fatal).
    pub fn severity_in(&self, code: u32, text: &str) -> EventSeverity {
        if code == 154 && (text.contains("Reset Required") || text.contains("Reboot Required")) {
            return EventSeverity::Fatal;
        }
        self.severity(code)
    }

    /// What to do about `code`, in words, from the catalog alone: the meaning, NVIDIA's
    /// action, and the known cause outside the GPU where there is one. The GPU is to be
    /// replaced only where the catalog's own action says so (RMA, field diagnostics);
    /// an XID the application causes says to fix the program, not the node. `None` for
    /// a code the catalog does not list.
    pub fn advice(&self, code: u32) -> Option<String> {
        let i = self.get(code)?;
        let what = match i.cause {
            Cause::Application => format!(
                "XID {code} ({}) is raised by the application, not the GPU: fix the program; \
                 NVIDIA's action: {}",
                i.name, i.action
            ),
            _ => format!("XID {code} ({}): {}", i.name, i.action),
        };
        Some(match &i.known {
            Some(known) => format!("{what}; {known}"),
            None => what,
        })
    }

    /// Number of codes listed.
    pub fn len(&self) -> usize {
        self.by_code.len()
    }

    /// Whether no code is listed.
    pub fn is_empty(&self) -> bool {
        self.by_code.is_empty()
    }

    /// All entries, in code order.
    pub fn entries(&self) -> Vec<&XidInfo> {
        self.by_code.values().collect()
    }

    /// Whether the catalog holds `code` fatal: the GPU is lost until it is reset or
    /// replaced, so the process on it stops.
    pub fn is_fatal(&self, code: u32) -> bool {
        self.get(code)
            .is_some_and(|i| i.severity == EventSeverity::Fatal)
    }

    /// The codes the catalog holds fatal, in order.
    pub fn fatal_codes(&self) -> Vec<u32> {
        self.by_code
            .values()
            .filter(|i| i.severity == EventSeverity::Fatal)
            .map(|i| i.code)
            .collect()
    }
}

/// The XID codes texts name (`XID 79`, as the engine's findings write them), in order of
/// first mention, with how many times a text says each was seen (`seen 3 time(s)`; 1
/// when it does not say).
pub fn named_codes<'t>(texts: impl IntoIterator<Item = &'t str>) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for text in texts {
        let mut rest = text;
        while let Some(at) = rest.find("XID ") {
            rest = &rest[at + 4..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let Ok(code) = rest[..digits].parse::<u32>() else {
                continue;
            };
            let seen = text
                .split_once("seen ")
                .and_then(|(_, s)| s.split(' ').next())
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(1);
            match out.iter_mut().find(|(c, _)| *c == code) {
                Some((_, n)) => *n = (*n).max(seen),
                None => out.push((code, seen)),
            }
        }
    }
    out
}

fn builtin_result() -> &'static Result<XidCatalog, XidError> {
    static BUILTIN_CATALOG: OnceLock<Result<XidCatalog, XidError>> = OnceLock::new();
    BUILTIN_CATALOG.get_or_init(|| XidCatalog::parse(BUILTIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builtin() -> &'static XidCatalog {
        if let Some(e) = XidCatalog::builtin_error() {
            panic!("shipped catalog fails to load: {e}");
        }
        XidCatalog::builtin()
    }

    #[test]
    fn shipped_catalog_loads_and_every_code_has_severity_and_action() {
        let c = builtin();
        assert!(c.len() >= 160, "only {} codes", c.len());
        for i in c.entries() {
            assert!(!i.name.is_empty() && !i.action.is_empty(), "{i:?}");
        }
    }

    #[test]
    fn shipped_catalog_has_no_duplicate_codes() {
        // `parse` refuses duplicates; check the raw list too so the test says which.
        let raw: Vec<serde_json::Value> = crate::yaml::from_str(BUILTIN).unwrap_or_default();
        let mut codes: Vec<u64> = raw
            .iter()
            .filter_map(|v| v.get("code").and_then(serde_json::Value::as_u64))
            .collect();
        let n = codes.len();
        assert_eq!(n, builtin().len());
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), n, "duplicate codes in rules/xid.yaml");
    }

    #[test]
    fn known_entries() {
        let c = builtin();
        let get = |code| c.get(code).unwrap_or_else(|| panic!("XID {code} missing"));
        assert_eq!(get(79).severity, EventSeverity::Fatal);
        assert_eq!(get(79).cause, Cause::Hardware);
        assert!(matches!(
            get(48).severity,
            EventSeverity::Fatal | EventSeverity::Error
        ));
        assert_eq!(get(48).cause, Cause::Memory);
        assert_eq!(get(13).cause, Cause::Application);
        assert_eq!(get(13).severity, EventSeverity::Info);
        assert_eq!(get(31).cause, Cause::Application);
        assert_eq!(get(74).cause, Cause::Nvlink);
        for fatal in [74, 94, 95, 119, 120] {
            assert_eq!(get(fatal).severity, EventSeverity::Fatal, "XID {fatal}");
        }
        assert!(get(1).unused);
        assert!(!get(79).unused);
    }

    #[test]
    fn named_codes_reads_codes_and_counts() {
        assert_eq!(
            named_codes([
                "GPU 3 on node-7 reported XID 79 (GPU has fallen off the bus), fatal",
                "XID 13 (graphics engine exception) seen 4 time(s)",
                "XID 79 seen 2 time(s)",
                "XID ninety, XID ",
            ]),
            vec![(79, 2), (13, 4)]
        );
        assert!(named_codes(["no codes here"]).is_empty());
    }

    #[test]
    fn unknown_codes_default_to_warning() {
        assert_eq!(builtin().get(9999), None);
        assert_eq!(builtin().severity(9999), EventSeverity::Warning);
    }

    #[test]
    fn loader_errors_name_the_entry_and_field() {
        let cases = [
            (
                "- {code: 1, name: a, severity: info, cause: driver}",
                "entry 0: missing field `action`",
            ),
            (
                "- {code: 1, name: a, severity: info, cause: driver, action: x}\n\
                 - {code: 2, name: b, severity: bad, cause: driver, action: x}",
                "entry 1: field `severity` has invalid value \"bad\"",
            ),
            (
                "- {code: 1, name: a, severity: info, cause: gremlins, action: x}",
                "entry 0: field `cause`",
            ),
            (
                "- {code: 1, name: a, severity: info, cause: driver, action: x}\n\
                 - {code: 1, name: b, severity: info, cause: driver, action: x}",
                "entry 1: code 1 is listed twice",
            ),
            ("- {code: 1, nmae: a}", "unknown field `nmae`"),
        ];
        for (yaml, want) in cases {
            match XidCatalog::parse(yaml) {
                Ok(_) => panic!("{yaml:?} should fail"),
                Err(e) => assert!(e.to_string().contains(want), "{yaml:?}: {e}"),
            }
        }
    }
}
