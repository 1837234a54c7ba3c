//! Key files. A key pair is stored as two files: `NAME.key` holds the private key in base64
//! (created with mode 0600), `NAME.pub` the public key in base64. Public keys are given on
//! command lines in base64 or hex.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine;
use tern_proto::{PublicKey, StaticKeypair};

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The file does not hold a 32-byte key in base64.
    #[error("{path}: not a tern key (expected 32 bytes in base64)")]
    Format {
        /// The file.
        path: PathBuf,
    },
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// A public key in the form `tern keygen` prints (base64).
pub fn encode_public(key: &PublicKey) -> String {
    b64().encode(key.0)
}

/// Writes `base.key` (private, 0600) and `base.pub`; returns the two paths.
pub fn write_keypair(
    base: &Path,
    pair: &StaticKeypair,
) -> Result<(PathBuf, PathBuf), KeyFileError> {
    let private = base.with_extension("key");
    let public = base.with_extension("pub");
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KeyFileError::Io { path, source }
    };
    write_private(&private, &b64().encode(pair.private_bytes())).map_err(io_err(&private))?;
    fs::write(&public, format!("{}\n", encode_public(&pair.public()))).map_err(io_err(&public))?;
    Ok((private, public))
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies only to a new file: an existing one (say 0644) is made private before
    // the key goes in.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{text}")
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> io::Result<()> {
    fs::write(path, format!("{text}\n"))
}

/// Reads a private key file written by [`write_keypair`].
pub fn read_keypair(path: &Path) -> Result<StaticKeypair, KeyFileError> {
    let text = fs::read_to_string(path).map_err(|source| KeyFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = b64()
        .decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| KeyFileError::Format {
            path: path.to_path_buf(),
        })?;
    Ok(StaticKeypair::from_private(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("tern-keys-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let pair = StaticKeypair::generate([5; 32]);
        let (private, public) = write_keypair(&dir.join("node"), &pair).unwrap();
        let again = read_keypair(&private).unwrap();
        assert_eq!(again.public(), pair.public());
        let text = fs::read_to_string(&public).unwrap();
        assert_eq!(PublicKey::parse(&text).unwrap(), pair.public());
        fs::write(dir.join("bad.key"), "not a key").unwrap();
        assert!(matches!(
            read_keypair(&dir.join("bad.key")),
            Err(KeyFileError::Format { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A key written over an existing world-readable file is private afterwards.
    #[cfg(unix)]
    #[test]
    fn a_private_key_written_over_a_readable_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tern-keys-mode-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let private = dir.join("node.key");
        fs::write(&private, "old").unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o644)).unwrap();
        write_keypair(&dir.join("node"), &StaticKeypair::generate([6; 32])).unwrap();
        let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
