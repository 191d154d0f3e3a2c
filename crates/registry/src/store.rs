//! Where models come from: a Triton-style repository directory
//! (`<root>/<model>/<version>/model.onnx`, with an optional `<root>/<model>/config.toml`),
//! or models given directly (the embedded default, or one file named on the command line).
//! Reading is blocking file I/O; the registry runs it on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use super::fingerprint::{DigestCache, Fingerprint};
use super::settings::{ModelConfigFile, ModelSettings, SettingsError};

/// Where one version's weights are.
#[derive(Debug, Clone)]
pub enum Weights {
    /// Compiled into the binary.
    Static(&'static [u8]),
    File(PathBuf),
}

/// A model given directly rather than found in a repository.
#[derive(Debug, Clone)]
pub struct FixedModel {
    pub name: String,
    pub version: u64,
    pub weights: Weights,
    pub config: ModelConfigFile,
}

#[derive(Debug, Clone)]
pub enum ModelSource {
    Directory(PathBuf),
    Fixed(Vec<FixedModel>),
}

/// One version found in the source.
#[derive(Debug, Clone)]
pub struct VersionListing {
    pub version: u64,
    pub fingerprint: Fingerprint,
    pub weights: Weights,
}

/// One model as the source holds it now.
#[derive(Debug, Clone)]
pub struct ModelListing {
    pub name: String,
    pub settings: Arc<ModelSettings>,
    pub versions: Vec<VersionListing>,
}

impl ModelListing {
    /// Each listed version with its fingerprint, as the sync plan compares them.
    pub(crate) fn available(&self) -> Vec<(u64, Fingerprint)> {
        self.versions.iter().map(|v| (v.version, v.fingerprint)).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("model name {0:?} is not allowed: use letters, digits, '_', '-' and '.', not starting with '.'")]
    InvalidName(String),
    #[error("model {name:?} is not in the repository{where_}")]
    NotFound { name: String, where_: String },
    #[error("model {name:?}: {source}")]
    Settings {
        name: String,
        #[source]
        source: SettingsError,
    },
    #[error("{0}")]
    Io(String),
}

/// Model names become paths, so anything that could leave the repository is refused.
pub fn check_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidName(name.to_string()))
    }
}

impl ModelSource {
    /// Every model the source holds, by name.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        match self {
            Self::Fixed(models) => Ok(models.iter().map(|m| m.name.clone()).collect()),
            Self::Directory(root) => {
                let entries = std::fs::read_dir(root).map_err(|e| {
                    StoreError::Io(format!(
                        "cannot read the model repository {}: {e}",
                        root.display()
                    ))
                })?;
                let mut names: Vec<String> = entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| check_name(n).is_ok())
                    .collect();
                names.sort();
                Ok(names)
            }
        }
    }

    /// Reads one model's configuration and the versions present, overlaying its
    /// `config.toml` (if any) on `defaults`; each version's fingerprint comes from
    /// `digests` (files are read only when they changed on disk).
    pub fn scan(
        &self,
        name: &str,
        defaults: &ModelSettings,
        digests: &DigestCache,
    ) -> Result<ModelListing, StoreError> {
        check_name(name)?;
        let settings_err = |source| StoreError::Settings {
            name: name.to_string(),
            source,
        };
        match self {
            Self::Fixed(models) => {
                let m = models
                    .iter()
                    .find(|m| m.name == name)
                    .ok_or_else(|| StoreError::NotFound {
                        name: name.to_string(),
                        where_: String::new(),
                    })?;
                let settings = defaults
                    .overlay(&m.config, Path::new("."))
                    .map_err(settings_err)?;
                let fingerprint = match &m.weights {
                    Weights::Static(bytes) => digests.embedded(bytes),
                    Weights::File(path) => digests.file(path).ok_or_else(|| {
                        StoreError::Io(format!("model file {} is missing or unreadable", path.display()))
                    })?,
                };
                Ok(ModelListing {
                    name: name.to_string(),
                    settings: Arc::new(settings),
                    versions: vec![VersionListing {
                        version: m.version,
                        fingerprint,
                        weights: m.weights.clone(),
                    }],
                })
            }
            Self::Directory(root) => {
                let dir = root.join(name);
                if !dir.is_dir() {
                    return Err(StoreError::NotFound {
                        name: name.to_string(),
                        where_: format!(" ({} is not a directory)", dir.display()),
                    });
                }
                let config_path = dir.join("config.toml");
                let file = match std::fs::read_to_string(&config_path) {
                    Ok(text) => ModelConfigFile::parse(&text).map_err(settings_err)?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => ModelConfigFile::default(),
                    Err(e) => {
                        return Err(StoreError::Io(format!(
                            "cannot read {}: {e}",
                            config_path.display()
                        )))
                    }
                };
                let settings = defaults.overlay(&file, &dir).map_err(settings_err)?;
                let entries = std::fs::read_dir(&dir)
                    .map_err(|e| StoreError::Io(format!("cannot read {}: {e}", dir.display())))?;
                let mut versions: Vec<VersionListing> = entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let version: u64 = e.file_name().to_str()?.parse().ok().filter(|&v| v > 0)?;
                        let path = e.path().join(&settings.model_file);
                        Some(VersionListing {
                            version,
                            fingerprint: digests.file(&path)?,
                            weights: Weights::File(path),
                        })
                    })
                    .collect();
                versions.sort_by_key(|v| v.version);
                Ok(ModelListing {
                    name: name.to_string(),
                    settings: Arc::new(settings),
                    versions,
                })
            }
        }
    }
}

impl Weights {
    pub fn read(&self) -> Result<Arc<[u8]>, String> {
        match self {
            Self::Static(bytes) => Ok(Arc::from(*bytes)),
            Self::File(path) => std::fs::read(path)
                .map(Arc::from)
                .map_err(|e| format!("cannot read {}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_repo(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("peregrine-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_repository_lists_models_and_numbered_versions_with_weights() {
        let root = temp_repo("scan");
        for v in ["1", "3", "x", "0"] {
            std::fs::create_dir_all(root.join("det").join(v)).unwrap();
        }
        std::fs::write(root.join("det/1/model.onnx"), b"one").unwrap();
        std::fs::write(root.join("det/3/model.onnx"), b"three").unwrap();
        std::fs::write(root.join("det/x/model.onnx"), b"not a version").unwrap();
        std::fs::write(root.join("det/0/model.onnx"), b"zero is not a version").unwrap();
        std::fs::create_dir_all(root.join("empty/2")).unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        std::fs::write(root.join("det/config.toml"), "max_batch = 2\n").unwrap();
        let source = ModelSource::Directory(root.clone());
        assert_eq!(source.list().unwrap(), ["det", "empty"]);
        let digests = DigestCache::default();
        let listing = source.scan("det", &ModelSettings::default(), &digests).unwrap();
        let versions: Vec<u64> = listing.versions.iter().map(|v| v.version).collect();
        assert_eq!(versions, [1, 3]);
        assert_eq!(listing.versions[1].fingerprint, Fingerprint::of(b"three"));
        assert_eq!(listing.settings.engine.policy.max_batch, 2);
        assert!(source
            .scan("empty", &ModelSettings::default(), &digests)
            .unwrap()
            .versions
            .is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_that_could_escape_the_repository_are_refused() {
        for bad in ["..", "../etc", "a/b", ".git", "", "sp ace"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["yolo11n", "yolo26n-e2e", "det_v2.1"] {
            check_name(good).unwrap();
        }
        let source = ModelSource::Directory(std::env::temp_dir());
        assert!(matches!(
            source.scan("../x", &ModelSettings::default(), &DigestCache::default()),
            Err(StoreError::InvalidName(_))
        ));
    }

    #[test]
    fn a_bad_config_file_is_an_error_naming_the_model() {
        let root = temp_repo("badcfg");
        std::fs::create_dir_all(root.join("m/1")).unwrap();
        std::fs::write(root.join("m/config.toml"), "instances = 0\n").unwrap();
        let err = ModelSource::Directory(root.clone())
            .scan("m", &ModelSettings::default(), &DigestCache::default())
            .unwrap_err();
        assert_eq!(err.to_string(), "model \"m\": instances must be at least 1");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
