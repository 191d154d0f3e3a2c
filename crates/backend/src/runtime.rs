//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! Search order: an explicit path (flag), `ORT_DYLIB_PATH`, the executable's own directory,
//! then the cache that `make setup` fills inside the checkout. The first existing file wins;
//! a version older than [`ORT_VERSION`]'s minor release is refused with instructions.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

use crate::BackendError;

/// The ONNX Runtime release `make setup` fetches and this build is made for.
pub const ORT_VERSION: &str = "1.31.1";

/// The checkout's cache directory that `scripts/fetch-onnxruntime.sh` fills.
fn checkout_cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/onnxruntime")
        .join(ORT_VERSION)
}

fn library_names() -> [String; 2] {
    [
        format!("libonnxruntime.so.{ORT_VERSION}"),
        "libonnxruntime.so".into(),
    ]
}

/// The candidate paths, in search order.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = explicit {
        out.push(p.to_path_buf());
        return out;
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        out.push(PathBuf::from(p));
        return out;
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        out.extend(library_names().iter().map(|n| dir.join(n)));
    }
    let cache = checkout_cache();
    out.extend(library_names().iter().map(|n| cache.join(n)));
    out
}

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Loads ONNX Runtime (first call only) and returns the process-wide environment.
///
/// Later calls return the first call's outcome whatever `explicit` says: a process has
/// one runtime.
pub fn environment(explicit: Option<&Path>) -> Result<Environment, BackendError> {
    let searched = candidates(explicit);
    let Some(path) = searched.iter().find(|p| p.is_file()).cloned() else {
        if let Some(Ok(env)) = ENVIRONMENT.get() {
            return Ok(env.clone());
        }
        return Err(BackendError::RuntimeNotFound { searched });
    };
    let result = ENVIRONMENT.get_or_init(|| {
        let builder = ort::init_from(&path).map_err(|e| e.to_string())?;
        builder.with_name("peregrine").build().map_err(|e| e.to_string())
    });
    match result {
        Ok(env) => Ok(env.clone()),
        Err(reason) => Err(BackendError::RuntimeLoad {
            path,
            reason: reason.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_path_is_the_only_candidate() {
        let c = candidates(Some(Path::new("/opt/ort/libonnxruntime.so")));
        assert_eq!(c, [PathBuf::from("/opt/ort/libonnxruntime.so")]);
    }

    #[test]
    fn missing_runtime_names_every_place_searched_and_the_fix() {
        let err = BackendError::RuntimeNotFound {
            searched: vec![
                PathBuf::from("/a/libonnxruntime.so"),
                PathBuf::from("/b/libonnxruntime.so"),
            ],
        };
        let msg = err.to_string();
        assert!(
            msg.contains("/a/libonnxruntime.so, /b/libonnxruntime.so"),
            "{msg}"
        );
        assert!(
            msg.contains("make setup") && msg.contains("ORT_DYLIB_PATH"),
            "{msg}"
        );
    }
}
