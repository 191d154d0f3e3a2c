//! Model versions identified by content: each weights file's SHA-256, computed on the
//! blocking pool when the registry scans its source, never on a request's path.
//!
//! Hashing every file on every poll would read whole repositories every few seconds, so
//! [`DigestCache`] keeps each file's digest beside the file's [`FileStamp`] (size,
//! modification and change times, inode): a file is read again only when its stamp moved.
//! A `touch` moves the stamp, the file is hashed again, the digest is the same, and the
//! sync plan keeps the version. A file replaced with one of the same size and modification
//! time still gets a new inode (renamed into place) or change time (written in place),
//! which no user can set back, so it is hashed and, its content being different,
//! reloaded. The one blind spot: a rewrite in place within the same tick of the file
//! system's clock as the previous change (a few milliseconds) keeps the ctime.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// A version's identity: the SHA-256 of its weights.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    pub sha256: [u8; 32],
}

impl Fingerprint {
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            sha256: Sha256::digest(bytes).into(),
        }
    }

    /// The digest as 64 lowercase hex digits, as `sha256sum` prints it.
    pub fn hex(&self) -> String {
        hex::encode(self.sha256)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

/// What the file system says about a file without reading it: if none of this moved, the
/// content is taken to be the one last hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    inode: u64,
    device: u64,
}

impl FileStamp {
    /// The stamp of a regular file; `None` for anything else or an unreadable path.
    pub fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        m.is_file().then(|| Self {
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
            inode: m.ino(),
            device: m.dev(),
        })
    }
}

/// Digests of the files scanned so far, by path and the stamp they were hashed at. Used
/// only from the registry's scans, one at a time, on the blocking pool.
#[derive(Debug, Default)]
pub struct DigestCache {
    files: Mutex<HashMap<PathBuf, (FileStamp, Fingerprint)>>,
}

impl DigestCache {
    /// The file's fingerprint: the cached one while its stamp has not moved, else the
    /// file is read and hashed. `None`: not a readable regular file.
    pub fn file(&self, path: &Path) -> Option<Fingerprint> {
        let stamp = FileStamp::of(path)?;
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached, fp)) = files.get(path) {
            if *cached == stamp {
                return Some(*fp);
            }
        }
        let started = std::time::Instant::now();
        let fp = hash_file(path).ok()?;
        tracing::debug!(path = %path.display(), sha256 = %fp, elapsed_ms = started.elapsed().as_millis() as u64, "weights hashed");
        // The stamp from before reading: a write during the read moves it, so the next
        // scan hashes again.
        files.insert(path.to_path_buf(), (stamp, fp));
        Some(fp)
    }

    /// The fingerprint of weights compiled into the binary, hashed once per address.
    pub fn embedded(&self, bytes: &'static [u8]) -> Fingerprint {
        let key = PathBuf::from(format!("<embedded {:p}+{}>", bytes.as_ptr(), bytes.len()));
        let stamp = FileStamp {
            len: bytes.len() as u64,
            mtime_ns: 0,
            ctime_ns: 0,
            inode: 0,
            device: 0,
        };
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        files
            .entry(key)
            .or_insert_with(|| (stamp, Fingerprint::of(bytes)))
            .1
    }
}

fn hash_file(path: &Path) -> std::io::Result<Fingerprint> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(Fingerprint {
        sha256: hasher.finalize().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_sha256_as_sha256sum_prints_it() {
        assert_eq!(
            Fingerprint::of(b"abc").hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_touched_file_keeps_its_fingerprint_and_a_same_size_same_time_replacement_does_not() {
        let dir = std::env::temp_dir().join(format!("peregrine-fingerprint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.onnx");
        std::fs::write(&path, b"weights one").unwrap();
        let cache = DigestCache::default();
        let first = cache.file(&path).unwrap();
        assert_eq!(first, Fingerprint::of(b"weights one"));

        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(cache.file(&path), Some(first), "touched, same content");

        // Replaced the way deployments do it (a new file renamed over the old one), with
        // the old size and modification time.
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        let staged = dir.join("model.onnx.new");
        std::fs::write(&staged, b"weights two").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&staged)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        std::fs::rename(&staged, &path).unwrap();
        let second = cache.file(&path).unwrap();
        assert_eq!(
            second,
            Fingerprint::of(b"weights two"),
            "same size and mtime, new content"
        );
        assert!(cache.file(&dir.join("missing")).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
