//! Where the operator commands find the controller and their token: flags, then
//! `WARDEN_*` variables, then the config file, then defaults. The token is held as an
//! [`ApiKey`], whose `Debug` and `Display` print `***`, and no error names it.

use std::path::{Path, PathBuf};

use warden_diagnosis::llm::ApiKey;

/// The controller's address when nothing else names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:9460";

/// Where the config file is looked for, under the user's config directory.
pub const DEFAULT_CONFIG_TAIL: &str = "warden/cli.yaml";

/// Why the settings could not be put together (exit 2, like a usage error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

/// What the flags said (`None`: not given).
#[derive(Debug, Default, Clone)]
pub struct FlagValues {
    /// `--server`.
    pub server: Option<String>,
    /// `--token`.
    pub token: Option<ApiKey>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// `--config`.
    pub config: Option<PathBuf>,
}

/// What the environment said; an empty variable counts as unset.
#[derive(Debug, Default, Clone)]
pub struct EnvValues {
    /// `WARDEN_SERVER`.
    pub server: Option<String>,
    /// `WARDEN_TOKEN`.
    pub token: Option<ApiKey>,
    /// `WARDEN_TOKEN_FILE`.
    pub token_file: Option<PathBuf>,
    /// `WARDEN_CONFIG`.
    pub config: Option<PathBuf>,
    /// The default config file's directory: `$XDG_CONFIG_HOME`, else `$HOME/.config`.
    pub config_home: Option<PathBuf>,
}

impl EnvValues {
    /// Read through `var` (`std::env::var` in the binary, a map in tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let config_home = get("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| get("HOME").map(|h| Path::new(&h).join(".config")));
        EnvValues {
            server: get("WARDEN_SERVER"),
            token: get("WARDEN_TOKEN").map(|t| ApiKey::new(t.trim())),
            token_file: get("WARDEN_TOKEN_FILE").map(PathBuf::from),
            config: get("WARDEN_CONFIG").map(PathBuf::from),
            config_home,
        }
    }

    /// The process environment.
    pub fn from_process() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }
}

/// The config file: `server`, `token_file` (relative paths are taken from the file's
/// directory; `~/` is the home directory) and, discouraged, `token`.
#[derive(Default, Clone)]
pub struct FileValues {
    /// `server:`.
    pub server: Option<String>,
    /// `token_file:`, resolved against the file's directory.
    pub token_file: Option<PathBuf>,
    /// `token:`.
    pub token: Option<ApiKey>,
}

impl std::fmt::Debug for FileValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileValues")
            .field("server", &self.server)
            .field("token_file", &self.token_file)
            .field("token", &self.token)
            .finish()
    }
}

const FILE_KEYS: [&str; 3] = ["server", "token_file", "token"];

impl FileValues {
    /// Parse the text of config file `path`. Errors name the file and the key, never a
    /// value (the `token` value must not appear in any message).
    pub fn parse(text: &str, path: &Path, home: Option<&Path>) -> Result<Self, SettingsError> {
        let at = |what: String| SettingsError(format!("config file {}: {what}", path.display()));
        if text.trim().is_empty() {
            return Ok(FileValues::default());
        }
        // Parsed as a generic value first: a typed parse would quote a mistyped token
        // back in its error message (and the YAML reader never quotes the source).
        let value: serde_json::Value = warden_model::yaml::from_str(text).map_err(|e| {
            let place = match (e.line, e.column) {
                (Some(l), Some(c)) => format!(" at line {l} column {c}"),
                _ => String::new(),
            };
            at(format!("not valid YAML{place}"))
        })?;
        let map = match value {
            serde_json::Value::Object(m) => m,
            serde_json::Value::Null => return Ok(FileValues::default()),
            _ => return Err(at("expected a mapping of `key: value` lines".into())),
        };
        let mut out = FileValues::default();
        let mut problems = vec![];
        for (key, value) in map {
            let text = match &value {
                serde_json::Value::String(s) => Some(s.trim().to_owned()),
                serde_json::Value::Number(n) if key == "token" => Some(n.to_string()),
                serde_json::Value::Null => None,
                _ => {
                    problems.push(format!("`{key}` must be a string"));
                    continue;
                }
            };
            let text = text.filter(|t| !t.is_empty());
            match key.as_str() {
                "server" => out.server = text,
                "token" => out.token = text.map(ApiKey::new),
                "token_file" => {
                    out.token_file = text.map(|t| resolve_path(&t, path, home));
                }
                other => problems.push(format!(
                    "unknown key `{other}`; allowed: {}",
                    FILE_KEYS.join(", ")
                )),
            }
        }
        if out.token.is_some() && out.token_file.is_some() {
            problems.push("set only one of `token` and `token_file`".into());
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(at(problems.join("; ")))
        }
    }

    /// Read and parse config file `path`.
    pub fn load(path: &Path, home: Option<&Path>) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            SettingsError(format!(
                "cannot read the config file {}: {e}",
                path.display()
            ))
        })?;
        Self::parse(&text, path, home)
    }
}

/// `~/x` under `home`; a relative path under the config file's directory.
fn resolve_path(text: &str, config: &Path, home: Option<&Path>) -> PathBuf {
    if let (Some(rest), Some(home)) = (text.strip_prefix("~/"), home) {
        return home.join(rest);
    }
    let p = PathBuf::from(text);
    if p.is_relative() {
        config.parent().map_or(p.clone(), |dir| dir.join(&p))
    } else {
        p
    }
}

/// Where the token comes from, before it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// Given as is.
    Value(ApiKey),
    /// The first line of a file.
    File(PathBuf),
    /// None: requests carry no `Authorization` header.
    None,
}

/// The settings in force.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The controller's base URL.
    pub server: String,
    /// The token to send, if any.
    pub token: Option<ApiKey>,
    /// The config file read, if any.
    pub config: Option<PathBuf>,
}

/// The config file to read: `--config`, else `WARDEN_CONFIG` (both must exist), else
/// the default path when it exists.
pub fn config_path(flags: &FlagValues, env: &EnvValues) -> Option<(PathBuf, bool)> {
    if let Some(p) = flags.config.clone().or_else(|| env.config.clone()) {
        return Some((p, true));
    }
    let default = env.config_home.as_ref()?.join(DEFAULT_CONFIG_TAIL);
    default.is_file().then_some((default, false))
}

/// Put the layers together: flag > env > file > default, for the server and for the
/// token (a layer that names a token, by value or by file, decides it).
pub fn resolve(
    flags: &FlagValues,
    env: &EnvValues,
    file: &FileValues,
) -> Result<(String, TokenSource), SettingsError> {
    let server = flags
        .server
        .clone()
        .or_else(|| env.server.clone())
        .or_else(|| file.server.clone())
        .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
    let token = match (&flags.token, &flags.token_file) {
        (Some(t), _) => TokenSource::Value(t.clone()),
        (None, Some(f)) => TokenSource::File(f.clone()),
        (None, None) => match (&env.token, &env.token_file) {
            (Some(_), Some(_)) => {
                return Err(SettingsError(
                    "both WARDEN_TOKEN and WARDEN_TOKEN_FILE are set; set only one".into(),
                ));
            }
            (Some(t), None) => TokenSource::Value(t.clone()),
            (None, Some(f)) => TokenSource::File(f.clone()),
            (None, None) => match (&file.token, &file.token_file) {
                (Some(t), _) => TokenSource::Value(t.clone()),
                (None, Some(f)) => TokenSource::File(f.clone()),
                (None, None) => TokenSource::None,
            },
        },
    };
    Ok((server, token))
}

/// The token of a token file: its first line, trimmed.
pub fn read_token_file(path: &Path) -> Result<ApiKey, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        SettingsError(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let first = text.lines().next().unwrap_or("").trim();
    if first.is_empty() {
        return Err(SettingsError(format!(
            "the token file {} is empty (its first line is the token)",
            path.display()
        )));
    }
    Ok(ApiKey::new(first))
}

/// Check the server URL's form: `http://` or `https://` and a host.
pub fn check_server(server: &str) -> Result<(), SettingsError> {
    let bad = |why: &str| {
        SettingsError(format!(
            "server {server:?}: {why}; expected http://HOST:PORT or https://HOST[/PREFIX]"
        ))
    };
    let uri: hyper::Uri = server.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad("the scheme must be http or https")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if uri.query().is_some() {
        return Err(bad("a query is not allowed"));
    }
    Ok(())
}

impl Settings {
    /// Settings from the flags and the process environment, reading the config file
    /// and the token file as needed.
    pub fn load(flags: &FlagValues, env: &EnvValues) -> Result<Settings, SettingsError> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let (file, config) = match config_path(flags, env) {
            Some((path, _)) => (FileValues::load(&path, home.as_deref())?, Some(path)),
            None => (FileValues::default(), None),
        };
        let (server, token) = resolve(flags, env, &file)?;
        check_server(&server)?;
        let token = match token {
            TokenSource::Value(t) => Some(t),
            TokenSource::File(path) => Some(read_token_file(&path)?),
            TokenSource::None => None,
        };
        Ok(Settings {
            server,
            token,
            config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Option<ApiKey> {
        Some(ApiKey::new(s))
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let file = FileValues {
            server: Some("http://file:1".into()),
            token: key("file-token"),
            token_file: None,
        };
        let env = EnvValues {
            server: Some("http://env:1".into()),
            token_file: Some("/env/token".into()),
            ..EnvValues::default()
        };
        let flags = FlagValues {
            server: Some("http://flag:1".into()),
            token: key("flag-token"),
            ..FlagValues::default()
        };
        let (s, t) = resolve(&flags, &env, &file).expect("resolves");
        assert_eq!(s, "http://flag:1");
        assert_eq!(t, TokenSource::Value(ApiKey::new("flag-token")));
        let (s, t) = resolve(&FlagValues::default(), &env, &file).expect("resolves");
        assert_eq!(s, "http://env:1");
        assert_eq!(t, TokenSource::File("/env/token".into()));
        let (s, t) =
            resolve(&FlagValues::default(), &EnvValues::default(), &file).expect("resolves");
        assert_eq!(s, "http://file:1");
        assert_eq!(t, TokenSource::Value(ApiKey::new("file-token")));
        let (s, t) = resolve(
            &FlagValues::default(),
            &EnvValues::default(),
            &FileValues::default(),
        )
        .expect("resolves");
        assert_eq!(s, DEFAULT_SERVER);
        assert_eq!(t, TokenSource::None);
    }

    #[test]
    fn two_token_variables_at_once_are_refused() {
        let env = EnvValues::from_lookup(|name| match name {
            "WARDEN_TOKEN" => Some("t".into()),
            "WARDEN_TOKEN_FILE" => Some("/f".into()),
            _ => None,
        });
        let e =
            resolve(&FlagValues::default(), &env, &FileValues::default()).expect_err("ambiguous");
        assert!(e.0.contains("set only one"), "{e}");
        // A flag settles it.
        let flags = FlagValues {
            token_file: Some("/flag".into()),
            ..FlagValues::default()
        };
        let (_, t) = resolve(&flags, &env, &FileValues::default()).expect("resolves");
        assert_eq!(t, TokenSource::File("/flag".into()));
    }

    #[test]
    fn empty_variables_count_as_unset() {
        let env = EnvValues::from_lookup(|name| match name {
            "WARDEN_SERVER" | "WARDEN_TOKEN" => Some("  ".into()),
            "HOME" => Some("/home/u".into()),
            _ => None,
        });
        assert!(env.server.is_none() && env.token.is_none());
        assert_eq!(env.config_home, Some(PathBuf::from("/home/u/.config")));
    }

    #[test]
    fn config_file_paths_resolve_and_errors_never_quote_the_token() {
        let path = Path::new("/etc/warden/cli.yaml");
        let home = Path::new("/home/u");
        let f = FileValues::parse(
            "server: https://warden.example\ntoken_file: op.token\n",
            path,
            Some(home),
        )
        .expect("valid");
        assert_eq!(f.server.as_deref(), Some("https://warden.example"));
        assert_eq!(f.token_file, Some(PathBuf::from("/etc/warden/op.token")));
        let f = FileValues::parse("token_file: ~/t\n", path, Some(home)).expect("valid");
        assert_eq!(f.token_file, Some(PathBuf::from("/home/u/t")));
        assert!(
            FileValues::parse("", path, None)
                .expect("empty is fine")
                .server
                .is_none()
        );
        for (text, needle) in [
            ("tokn: sekrit123\n", "unknown key `tokn`"),
            ("token: [sekrit123]\n", "`token` must be a string"),
            ("token: sekrit123\ntoken_file: /x\n", "only one"),
            ("- sekrit123\n", "mapping"),
            ("server: 'sekrit123\n", "not valid YAML"),
        ] {
            let e = FileValues::parse(text, path, None).expect_err(text).0;
            assert!(e.contains(needle) && e.contains("cli.yaml"), "{text}: {e}");
            assert!(!e.contains("sekrit123"), "{text}: {e}");
        }
        let f = FileValues::parse("token: 12345\n", path, None).expect("numbers are text");
        assert_eq!(f.token, key("12345"));
        assert!(!format!("{f:?}").contains("12345"));
    }

    #[test]
    fn server_urls_need_a_scheme_and_a_host() {
        assert!(check_server("http://127.0.0.1:9460").is_ok());
        assert!(check_server("https://warden.example/prefix").is_ok());
        for bad in [
            "127.0.0.1:9460",
            "ftp://h",
            "http://",
            "http://h/?q=1",
            "::",
        ] {
            assert!(check_server(bad).is_err(), "{bad}");
        }
    }
}
