//! Where the operator commands find the controller and their token, put together by
//! `warden-config`'s [`Loader`] like the agent's and the controller's settings: the
//! config file, then `WARDEN_*` variables, then flags, every mistake at once, and where
//! each setting came from. The token is held as an [`ApiKey`], whose `Debug` and
//! `Display` print `***`, and no error names it.

use std::path::{Path, PathBuf};

use serde_json::Value;
use warden_config::{Loaded, Loader, Provenance};
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

/// The config file's keys: `server`, `token_file` (relative paths are taken from the
/// file's directory; `~/` is the home directory) and, discouraged, `token`.
const FILE_KEYS: [&str; 3] = ["server", "token_file", "token"];

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
    /// Where each setting given came from.
    pub provenance: Provenance,
}

/// The config file to read: `--config`, else `WARDEN_CONFIG` (both must exist), else
/// `warden/cli.yaml` under `$XDG_CONFIG_HOME` (or `$HOME/.config`) when it exists.
pub fn config_path(flags: &FlagValues, var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if let Some(p) = flags
        .config
        .clone()
        .or_else(|| get("WARDEN_CONFIG").map(PathBuf::from))
    {
        return Some(p);
    }
    let home = get("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| Path::new(&h).join(".config")))?;
    let default = home.join(DEFAULT_CONFIG_TAIL);
    default.is_file().then_some(default)
}

/// A text value of the file's key `key` (a number too, where `numbers`). Anything else
/// is a mistake that never quotes the value (it may be a token).
fn file_text(l: &mut Loader<'_>, key: &str, numbers: bool) -> Option<String> {
    let origin = l.file_origin().to_owned();
    match l.section::<Value>(key)? {
        Value::String(s) => Some(s.trim().to_owned()).filter(|s| !s.is_empty()),
        Value::Number(n) if numbers => Some(n.to_string()),
        Value::Null => None,
        _ => {
            l.push(&origin, key, "must be a string");
            None
        }
    }
}

/// Put the layers together, lowest first: defaults, the config file, `WARDEN_SERVER`
/// and `WARDEN_TOKEN`/`WARDEN_TOKEN_FILE`, then the flags. For the token, the highest
/// layer that names one, by value or by file, decides it; a layer naming both is a
/// mistake unless a higher one decides. Environment variables are looked up through
/// `var` (`std::env::var` in the binary, a map in tests); an empty one counts as unset.
/// Gives the server, the token's source and the config file read, if any.
pub fn resolve(
    flags: &FlagValues,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Loaded<(String, TokenSource, Option<PathBuf>)>, SettingsError> {
    let home = var("HOME")
        .filter(|h| !h.trim().is_empty())
        .map(PathBuf::from);
    let path = config_path(flags, &var);
    let mut l = Loader::new(path.as_deref(), &var);
    let fo = l.file_origin().to_owned();

    let file_server = file_text(&mut l, "server", false);
    let file_token = file_text(&mut l, "token", true);
    let file_token_file = file_text(&mut l, "token_file", false);
    l.unknown_keys(&FILE_KEYS);
    let flag_decides = flags.token.is_some() || flags.token_file.is_some();
    let from_file = match (file_token, file_token_file) {
        (Some(_), Some(_)) => {
            if !flag_decides {
                l.push(&fo, "token", "set only one of `token` and `token_file`");
            }
            None
        }
        (Some(t), None) => Some(TokenSource::Value(ApiKey::new(t))),
        (None, Some(f)) => Some(TokenSource::File(path.as_deref().map_or_else(
            || PathBuf::from(&f),
            |p| resolve_path(&f, p, home.as_deref()),
        ))),
        (None, None) => None,
    };
    let (env_origin, from_env) = match (l.env("WARDEN_TOKEN"), l.env("WARDEN_TOKEN_FILE")) {
        (Some(_), Some(_)) => {
            if !flag_decides {
                l.push(
                    "environment",
                    "token",
                    "both WARDEN_TOKEN and WARDEN_TOKEN_FILE are set; set only one",
                );
            }
            ("environment", None)
        }
        (Some(t), None) => (
            "environment WARDEN_TOKEN",
            Some(TokenSource::Value(ApiKey::new(t.trim()))),
        ),
        (None, Some(f)) => (
            "environment WARDEN_TOKEN_FILE",
            Some(TokenSource::File(PathBuf::from(f.trim()))),
        ),
        (None, None) => ("environment", None),
    };
    let (flag_origin, from_flag) = match (&flags.token, &flags.token_file) {
        (Some(t), _) => ("flag --token", Some(TokenSource::Value(t.clone()))),
        (None, Some(f)) => ("flag --token-file", Some(TokenSource::File(f.clone()))),
        (None, None) => ("flag --token", None),
    };
    let layers = [
        (fo.clone(), from_file),
        (env_origin.to_owned(), from_env),
        (flag_origin.to_owned(), from_flag),
    ];
    let token = l
        .layer("token", layers, |t: &TokenSource| Ok(t.clone()))
        .unwrap_or(TokenSource::None);

    let layers = l.sources(
        file_server,
        Some("WARDEN_SERVER"),
        Some(("--server", flags.server.clone())),
    );
    let server = l
        .layer("server", layers, |s: &String| {
            let s = s.trim();
            check_server(s).map(|()| s.to_owned())
        })
        .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
    l.finish(|| Some((server, token, path)))
        .map_err(|e| SettingsError(e.to_string()))
}

/// The token of a token file: its first line, trimmed.
pub fn read_token_file(path: &Path) -> Result<ApiKey, SettingsError> {
    token_file_line(path).map(ApiKey::new)
}

/// A token file's first line, trimmed, for a caller that sends it itself (`warden
/// loadgen`'s agent token); never printed.
pub fn token_file_line(path: &Path) -> Result<String, SettingsError> {
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
    Ok(first.to_owned())
}

/// Check the server URL's form: `http://` or `https://` and a host. The error names
/// the value (a URL is no secret) and the form expected.
pub fn check_server(server: &str) -> Result<(), String> {
    let bad = |why: &str| {
        format!("{server:?}: {why}; expected http://HOST:PORT or https://HOST[/PREFIX]")
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
    /// Settings from the flags and the environment (looked up through `var`), reading
    /// the config file and the token file as needed.
    pub fn load(
        flags: &FlagValues,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingsError> {
        let Loaded {
            config: (server, token, config),
            provenance,
        } = resolve(flags, var)?;
        let token = match token {
            TokenSource::Value(t) => Some(t),
            TokenSource::File(path) => Some(read_token_file(&path)?),
            TokenSource::None => None,
        };
        Ok(Settings {
            server,
            token,
            config,
            provenance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&'static str, String)]) -> impl Fn(&str) -> Option<String> + use<> {
        let pairs = pairs.to_vec();
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    fn key(s: &str) -> Option<ApiKey> {
        Some(ApiKey::new(s))
    }

    fn file(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("cli.yaml");
        std::fs::write(&p, text).expect("write the config file");
        p
    }

    #[test]
    fn flags_beat_env_beat_file_beat_defaults() {
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = file(dir.path(), "server: http://file:1\ntoken: file-token\n");
        let env = vars(&[
            ("WARDEN_SERVER", "http://env:1".into()),
            ("WARDEN_TOKEN_FILE", "/env/token".into()),
            ("WARDEN_CONFIG", conf.display().to_string()),
        ]);
        let flags = FlagValues {
            server: Some("http://flag:1".into()),
            token: key("flag-token"),
            ..FlagValues::default()
        };
        let got = resolve(&flags, &env).expect("resolves");
        assert_eq!(got.config.0, "http://flag:1");
        assert_eq!(got.config.1, TokenSource::Value(ApiKey::new("flag-token")));
        assert_eq!(got.provenance.origin("server"), Some("flag --server"));
        assert_eq!(got.config.2.as_deref(), Some(conf.as_path()));
        assert_eq!(got.provenance.origin("token"), Some("flag --token"));
        let got = resolve(&FlagValues::default(), &env).expect("resolves");
        assert_eq!(got.config.0, "http://env:1");
        assert_eq!(got.config.1, TokenSource::File("/env/token".into()));
        assert_eq!(
            got.provenance.origin("token"),
            Some("environment WARDEN_TOKEN_FILE")
        );
        let only_file = vars(&[("WARDEN_CONFIG", conf.display().to_string())]);
        let got = resolve(&FlagValues::default(), &only_file).expect("resolves");
        assert_eq!(got.config.0, "http://file:1");
        assert_eq!(got.config.1, TokenSource::Value(ApiKey::new("file-token")));
        assert_eq!(
            got.provenance.origin("server"),
            Some(conf.display().to_string().as_str())
        );
        let got = resolve(&FlagValues::default(), vars(&[])).expect("resolves");
        assert_eq!(got.config.0, DEFAULT_SERVER);
        assert_eq!(got.config.1, TokenSource::None);
        assert_eq!(
            got.config.2, None,
            "no file named and none at the default path"
        );
        assert_eq!(got.provenance.to_string(), "defaults only");
    }

    #[test]
    fn two_token_variables_at_once_are_refused() {
        let env = vars(&[
            ("WARDEN_TOKEN", "t".into()),
            ("WARDEN_TOKEN_FILE", "/f".into()),
        ]);
        let e = resolve(&FlagValues::default(), &env).expect_err("ambiguous");
        assert!(e.0.contains("set only one"), "{e}");
        // A flag settles it.
        let flags = FlagValues {
            token_file: Some("/flag".into()),
            ..FlagValues::default()
        };
        let got = resolve(&flags, &env).expect("resolves");
        assert_eq!(got.config.1, TokenSource::File("/flag".into()));
    }

    #[test]
    fn empty_variables_count_as_unset_and_the_default_file_is_found() {
        let home = tempfile::tempdir().expect("temp dir");
        let env = vars(&[
            ("WARDEN_SERVER", "  ".into()),
            ("WARDEN_TOKEN", "  ".into()),
            ("HOME", home.path().display().to_string()),
        ]);
        let got = resolve(&FlagValues::default(), &env).expect("resolves");
        assert_eq!(got.config.0, DEFAULT_SERVER);
        assert_eq!(got.config.1, TokenSource::None);
        let dir = home.path().join(".config/warden");
        std::fs::create_dir_all(&dir).expect("config dir");
        std::fs::write(dir.join("cli.yaml"), "token_file: ~/t\n").expect("config");
        let got = resolve(&FlagValues::default(), &env).expect("resolves");
        assert_eq!(got.config.1, TokenSource::File(home.path().join("t")));
    }

    #[test]
    fn config_file_paths_resolve_and_errors_never_quote_the_token() {
        let dir = tempfile::tempdir().expect("temp dir");
        let at = |text: &str| {
            let conf = file(dir.path(), text);
            resolve(
                &FlagValues {
                    config: Some(conf),
                    ..FlagValues::default()
                },
                vars(&[]),
            )
        };
        let got = at("server: https://warden.example\ntoken_file: op.token\n").expect("valid");
        assert_eq!(got.config.0, "https://warden.example");
        assert_eq!(got.config.1, TokenSource::File(dir.path().join("op.token")));
        assert_eq!(at("").expect("empty is fine").config.0, DEFAULT_SERVER);
        for (text, needle) in [
            ("tokn: sekrit123\n", "field `tokn`: unknown field"),
            ("token: [sekrit123]\n", "field `token`: must be a string"),
            ("token: sekrit123\ntoken_file: /x\n", "only one"),
            ("- sekrit123\n", "mapping"),
            ("server: 'sekrit123\n", "not valid YAML"),
            ("server: sekrit.example\n", "field `server`"),
        ] {
            let e = at(text).expect_err(text).0;
            assert!(e.contains(needle) && e.contains("cli.yaml"), "{text}: {e}");
            if !text.starts_with("server: sekrit") {
                assert!(!e.contains("sekrit123"), "{text}: {e}");
            }
        }
        // Every mistake at once, each with its origin.
        let e = at("tokn: x\nserver: ftp://h\n")
            .expect_err("two mistakes")
            .0;
        assert!(e.starts_with("2 configuration errors"), "{e}");
        let got = at("token: 12345\n").expect("numbers are text");
        assert_eq!(got.config.1, TokenSource::Value(ApiKey::new("12345")));
        assert!(!format!("{got:?}").contains("12345"));
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
        let e = resolve(
            &FlagValues::default(),
            vars(&[("WARDEN_SERVER", "ftp://h".into())]),
        )
        .expect_err("a bad variable")
        .0;
        assert!(
            e.contains("environment WARDEN_SERVER: field `server`"),
            "{e}"
        );
    }
}
