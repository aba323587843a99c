//! The provisioned key (docs/security.md): a file of
//! `VT3_KEY_LEN` random bytes that the launcher gives vt3d
//! (`--key-file`) and the guest kernel (QEMU `-fw_cfg name=opt/vt3/key`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{key_from_bytes, Key};
use crate::abi::VT3_KEY_LEN;

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("key file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("key file {path} holds {len} bytes, not {VT3_KEY_LEN} (make a new one: rm it and let vt3d create it)")]
    Length { path: PathBuf, len: u64 },
    #[error("no random bytes for a new key file {path}: {reason}")]
    Random { path: PathBuf, reason: String },
}

/// Reads the key in `path`, or makes a new random one there (mode 0600)
/// if the file does not exist. Returns the key and whether it was made.
pub fn load_or_create(path: &Path) -> Result<(Key, bool), KeyError> {
    let io_err = |source| KeyError::Io { path: path.to_owned(), source };
    match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut file) => {
            let mut bytes = [0u8; VT3_KEY_LEN];
            getrandom::fill(&mut bytes)
                .map_err(|e| KeyError::Random { path: path.to_owned(), reason: e.to_string() })?;
            file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(io_err)?;
            Ok((key_from_bytes(&bytes), true))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => load(path).map(|k| (k, false)),
        Err(e) => Err(io_err(e)),
    }
}

/// Reads an existing key file: exactly `VT3_KEY_LEN` bytes.
pub fn load(path: &Path) -> Result<Key, KeyError> {
    let io_err = |source| KeyError::Io { path: path.to_owned(), source };
    let mut file = File::open(path).map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if meta.len() != VT3_KEY_LEN as u64 {
        return Err(KeyError::Length { path: path.to_owned(), len: meta.len() });
    }
    if meta.permissions().mode() & 0o004 != 0 {
        log::warn!("key file {} is readable by every user of this host: chmod o-r it", path.display());
    }
    let mut bytes = [0u8; VT3_KEY_LEN];
    file.read_exact(&mut bytes).map_err(io_err)?;
    Ok(key_from_bytes(&bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_file_is_made_private_and_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.key");
        let (made, created) = load_or_create(&path).unwrap();
        assert!(created);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (VT3_KEY_LEN as u64, 0o600));
        assert_eq!(load_or_create(&path).unwrap(), (made, false));
        let other = load_or_create(&dir.path().join("h.key")).unwrap().0;
        assert_ne!(made, other, "two new key files, one key");
    }

    #[test]
    fn a_key_file_of_another_length_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.key");
        std::fs::write(&path, [7u8; 15]).unwrap();
        let err = load_or_create(&path).unwrap_err();
        assert!(matches!(err, KeyError::Length { len: 15, .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), [7u8; 15], "vt3d overwrote a key file it could not use");
        let bytes: Vec<u8> = (1..=16).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&path).unwrap(), [0x0807_0605_0403_0201, 0x100f_0e0d_0c0b_0a09]);
    }
}
