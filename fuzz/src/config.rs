//! Fuzz target: the controller's and the agent's configuration loaders
//! (`warden_controller::config::ControllerConfig::load`,
//! `warden_agent::config::AgentConfig::load`): YAML file, then `WARDEN_*` environment,
//! then flags, every mistake reported at once.
//!
//! The first byte picks the binary; the input up to the first `0xff` byte is the
//! config file (written to a scratch file and loaded as the binaries load it), the
//! lines after it are `NAME=value` environment variables (`flag.listen=...` and the
//! like set the flag overrides). Checked: nothing panics; a refused config names at
//! least one mistake and every mistake says what is wrong; parsing the same file text
//! with `ConfigFile::from_yaml` refuses it exactly when the loader reports a mistake
//! from the file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use warden_model::config::ConfigErrors;

/// This process's scratch config file.
fn config_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("warden-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the scratch directory");
        dir.join("warden.yaml")
    })
}

/// One input, as libFuzzer passes it (`fuzz_targets/config.rs`).
pub fn run(input: &[u8]) {
    let Some((&which, data)) = input.split_first() else {
        return;
    };
    let (file, env_bytes) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let env_text = String::from_utf8_lossy(env_bytes);
    let vars: HashMap<String, String> = env_text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let env = |k: &str| vars.get(k).cloned();
    let flag = |k: &str| vars.get(&format!("flag.{k}")).cloned();
    let path = config_path();
    std::fs::write(path, file).expect("write the scratch config");
    let origin = path.display().to_string();
    let text = String::from_utf8_lossy(file);
    let utf8 = std::str::from_utf8(file).is_ok();

    let result: Result<(), ConfigErrors> = if which & 1 == 0 {
        use warden_controller::config::{ConfigFile, ControllerConfig, Overrides};
        let flags = Overrides {
            listen: flag("listen"),
            data_dir: flag("data_dir").map(PathBuf::from),
            database_url: flag("database_url"),
            tokens_file: flag("tokens_file").map(PathBuf::from),
        };
        let loaded = ControllerConfig::load(Some(path), env, &flags).map(drop);
        if utf8 {
            file_errors_agree(
                ConfigFile::from_yaml(&text, &origin).err(),
                &loaded,
                &origin,
            );
        }
        loaded
    } else {
        use warden_agent::config::{AgentConfig, ConfigFile, Overrides};
        let flags = Overrides {
            node_name: flag("node_name"),
            listen: flag("listen"),
            controller_url: flag("controller_url"),
        };
        let loaded = AgentConfig::load(Some(path), env, &flags, Some("node-1".into())).map(drop);
        if utf8 {
            file_errors_agree(
                ConfigFile::from_yaml(&text, &origin).err(),
                &loaded,
                &origin,
            );
        }
        loaded
    };
    if let Err(errors) = result {
        assert!(!errors.0.is_empty(), "a refused config names a mistake");
        for e in &errors.0 {
            assert!(
                !e.message.is_empty(),
                "every mistake says what is wrong: {e:?}"
            );
        }
        assert!(!errors.to_string().is_empty());
    }
}

/// `ConfigFile::from_yaml` refuses the text exactly when the loader has a mistake whose
/// origin is the file and that is not about a value's meaning (which only the loader
/// checks): so a refusal by the parser shows up in the loader's answer.
fn file_errors_agree(
    parsed: Option<ConfigErrors>,
    loaded: &Result<(), ConfigErrors>,
    origin: &str,
) {
    let Some(parsed) = parsed else { return };
    let Err(loaded) = loaded else {
        panic!("from_yaml refuses the file ({parsed}) but the loader accepts it");
    };
    for p in &parsed.0 {
        assert!(
            loaded
                .0
                .iter()
                .any(|l| l.origin == origin && l.field == p.field),
            "the parser's mistake {p:?} is missing from the loader's {loaded:?}"
        );
    }
}
