//! Reading a data file a person wrote (a policy, a fleet): whole, and only when it is
//! no larger than its kind can be, so that a wrong path to a huge file is an error
//! naming it, not a process that fills its memory.

use std::path::Path;

/// Why a data file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than its kind can be.
    #[error("{path} is larger than {max} bytes")]
    TooLarge {
        /// The file.
        path: String,
        /// The most its kind may hold.
        max: u64,
    },
}

/// The text of `path`, at most `max` bytes of UTF-8.
pub fn read_bounded(path: &Path, max: u64) -> Result<String, FileError> {
    let shown = || path.display().to_string();
    let read = |source| FileError::Read {
        path: shown(),
        source,
    };
    if std::fs::metadata(path).map_err(read)?.len() > max {
        return Err(FileError::TooLarge { path: shown(), max });
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    // A file that grew between the two looks.
    if text.len() as u64 > max {
        return Err(FileError::TooLarge { path: shown(), max });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_within_its_bound_and_refused_past_it() {
        let dir = std::env::temp_dir().join(format!("warden-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("policy.yaml");
        std::fs::write(&f, "version: 1\n").expect("write");
        assert_eq!(read_bounded(&f, 11).expect("read"), "version: 1\n");
        let e = read_bounded(&f, 10).expect_err("too large");
        assert_eq!(
            e.to_string(),
            format!("{} is larger than 10 bytes", f.display())
        );
        let e = read_bounded(&dir.join("missing.yaml"), 10).expect_err("missing");
        assert!(e.to_string().starts_with("cannot read "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
