//! API authentication and authorization: bearer tokens, each with a name and a role,
//! kept as SHA-256 digests in a YAML file (the tokens themselves are never stored, and
//! never logged), and the role each route needs.
//!
//! Roles: `viewer` reads; `operator` also acknowledges and resolves incidents and drains
//! nodes; `admin` can do everything, the audit log included; `agent` only reports
//! (batches from agents, job starts and ends from schedulers). `/healthz`, `/readyz` and
//! `/metrics` need no token. Without a token file the API is open, which the
//! configuration allows only on a loopback address.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read incidents, nodes, jobs and rank progress.
    Viewer,
    /// A viewer who may also acknowledge and resolve incidents and drain nodes.
    Operator,
    /// Everything.
    Admin,
    /// Report: agents' batches and schedulers' job lifecycle, nothing else.
    Agent,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Admin, Role::Agent];

    /// The label in token files and answers.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
            Role::Agent => "agent",
        }
    }

    /// Whether this role may do what `need` asks.
    pub const fn allows(self, need: Need) -> bool {
        matches!(
            (self, need),
            (Role::Admin, _)
                | (Role::Viewer | Role::Operator, Need::Read)
                | (Role::Operator, Need::Operate)
                | (Role::Agent, Need::Report)
        )
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}; roles: viewer, operator, admin, agent"))
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// Reading.
    Read,
    /// Changing incidents or nodes.
    Operate,
    /// Administration (the audit log).
    Admin,
    /// Reporting signals.
    Report,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name (a person or a system).
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// Why a token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// It could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a valid token file.
    #[error("token file {path}: {detail}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

/// One entry of a token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Who holds it (shown in the audit log).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Lowercase hex SHA-256 of the token.
    pub sha256: String,
}

/// A token file: `tokens: [{name, role, sha256}, ...]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    /// The tokens.
    pub tokens: Vec<TokenEntry>,
}

/// Who may call the API.
#[derive(Debug, Clone)]
pub enum Auth {
    /// No tokens: everyone is `admin` (loopback listeners only).
    Open,
    /// Tokens by digest.
    Tokens(HashMap<[u8; 32], Principal>),
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header (401).
    Missing,
    /// A token nobody holds (401).
    Unknown,
    /// A known token whose role does not allow this (403).
    Forbidden(Role),
}

/// SHA-256 of `token`, as the 32 bytes.
fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// SHA-256 of `token` in lowercase hex, as token files keep it.
pub fn hash_token(token: &str) -> String {
    digest(token).iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random token: `wdn_` and 64 hex digits (256 bits from the kernel's CSPRNG).
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("wdn_{hex}"))
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

impl Auth {
    /// Tokens from the YAML text of a token file (`origin` names it in errors).
    pub fn from_yaml(text: &str, origin: &str) -> Result<Auth, AuthError> {
        let invalid = |detail: String| AuthError::Invalid {
            path: origin.to_owned(),
            detail,
        };
        let file: TokenFile =
            warden_model::yaml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if file.tokens.is_empty() {
            return Err(invalid(
                "no tokens: list at least one under `tokens`".into(),
            ));
        }
        let mut map = HashMap::new();
        for (i, t) in file.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}]");
            if t.name.trim().is_empty()
                || t.name.len() > 128
                || t.name.chars().any(char::is_control)
            {
                return Err(invalid(format!(
                    "{at}.name: a name of 1 to 128 printable characters is required"
                )));
            }
            let key = parse_hex(&t.sha256.to_ascii_lowercase()).ok_or_else(|| {
                invalid(format!(
                    "{at}.sha256 (for {:?}): not 64 hex digits; hash a token with \
                     `warden-controller token`",
                    t.name
                ))
            })?;
            if map.contains_key(&key) {
                return Err(invalid(format!(
                    "{at}: the same token digest is listed twice"
                )));
            }
            map.insert(
                key,
                Principal {
                    name: t.name,
                    role: t.role,
                },
            );
        }
        Ok(Auth::Tokens(map))
    }

    /// Tokens from a token file.
    pub fn from_file(path: &Path) -> Result<Auth, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Auth::from_yaml(&text, &path.display().to_string())
    }

    /// Whether the API is open (no tokens).
    pub fn is_open(&self) -> bool {
        matches!(self, Auth::Open)
    }

    /// Who the `Authorization` header value `header` names, and whether they may do
    /// `need`.
    pub fn check(&self, header: Option<&str>, need: Need) -> Result<Principal, Refusal> {
        let map = match self {
            Auth::Open => {
                return Ok(Principal {
                    name: "local".into(),
                    role: Role::Admin,
                });
            }
            Auth::Tokens(map) => map,
        };
        let token = header
            .and_then(|h| {
                let (scheme, rest) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Missing)?;
        let p = map.get(&digest(token)).ok_or(Refusal::Unknown)?;
        if p.role.allows(need) {
            Ok(p.clone())
        } else {
            Err(Refusal::Forbidden(p.role))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_they_should() {
        use Need::*;
        let table = [
            (Role::Viewer, [true, false, false, false]),
            (Role::Operator, [true, true, false, false]),
            (Role::Admin, [true, true, true, true]),
            (Role::Agent, [false, false, false, true]),
        ];
        for (role, allowed) in table {
            for (need, want) in [Read, Operate, Admin, Report].into_iter().zip(allowed) {
                assert_eq!(role.allows(need), want, "{role} {need:?}");
            }
        }
    }

    #[test]
    fn tokens_are_checked_by_digest() {
        let token = new_token().expect("urandom");
        assert!(token.starts_with("wdn_") && token.len() == 68, "{token}");
        let yaml = format!(
            "tokens:\n  - name: alice\n    role: operator\n    sha256: {}\n",
            hash_token(&token)
        );
        let auth = Auth::from_yaml(&yaml, "test").expect("valid");
        let bearer = format!("Bearer {token}");
        let p = auth.check(Some(&bearer), Need::Operate).expect("allowed");
        assert_eq!(p.name, "alice");
        assert_eq!(
            auth.check(Some(&bearer), Need::Admin),
            Err(Refusal::Forbidden(Role::Operator))
        );
        assert_eq!(
            auth.check(Some(&format!("bearer  {token} ")), Need::Read)
                .map(|p| p.role),
            Ok(Role::Operator)
        );
        assert_eq!(auth.check(None, Need::Read), Err(Refusal::Missing));
        assert_eq!(
            auth.check(Some("Basic abc"), Need::Read),
            Err(Refusal::Missing)
        );
        assert_eq!(
            auth.check(Some("Bearer "), Need::Read),
            Err(Refusal::Missing)
        );
        assert_eq!(
            auth.check(Some("Bearer wdn_00"), Need::Read),
            Err(Refusal::Unknown)
        );
    }

    #[test]
    fn bad_token_files_say_what_is_wrong() {
        for (yaml, needle) in [
            ("tokens: []", "no tokens"),
            ("tokens:\n  - {name: a, role: root, sha256: x}", "role"),
            (
                "tokens:\n  - {name: a, role: admin, sha256: abc}",
                "tokens[0].sha256",
            ),
            (
                "tokens:\n  - {name: '', role: admin, sha256: abc}",
                "tokens[0].name",
            ),
            (
                "tokens:\n  - {name: a, role: admin, sha256: x, extra: 1}",
                "extra",
            ),
        ] {
            let e = Auth::from_yaml(yaml, "f.yaml").expect_err(yaml).to_string();
            assert!(e.contains(needle) && e.contains("f.yaml"), "{yaml}: {e}");
        }
        let h = hash_token("t");
        let dup = format!(
            "tokens:\n  - {{name: a, role: admin, sha256: {h}}}\n  - {{name: b, role: viewer, sha256: {h}}}"
        );
        let e = Auth::from_yaml(&dup, "f").expect_err("dup").to_string();
        assert!(e.contains("twice"), "{e}");
    }
}
