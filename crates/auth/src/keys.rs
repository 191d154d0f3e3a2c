//! The keys file: which keys exist (as SHA-256 hashes), what each may do, and its limits.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// What a key may do. Scopes are independent: `admin` does not include `streams` or
/// `infer`, so a key that should do everything lists all three. An operator then reads a
/// key's powers straight off its entry, and a model-management key cannot also flood the
/// engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Detection, KServe inference and metadata, stream and event reads.
    Infer,
    /// Adding, removing and changing streams, zones and lines; deleting events.
    Streams,
    /// Model repository: load, unload, index.
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Infer, Scope::Streams, Scope::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Infer => "infer",
            Scope::Streams => "streams",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| format!("unknown scope {s:?}: the scopes are infer, streams and admin"))
    }
}

/// Per-key limits; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyLimits {
    /// Sustained requests per second.
    pub requests_per_s: Option<u32>,
    /// Requests allowed at once above the sustained rate [default: requests_per_s].
    pub burst: Option<u32>,
    /// Requests of this key being answered at once.
    pub max_concurrent: Option<u32>,
}

/// One key, as the file spells it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntryFile {
    id: String,
    sha256: String,
    scopes: Vec<String>,
    requests_per_s: Option<u32>,
    burst: Option<u32>,
    max_concurrent: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntryFile>,
}

/// One key, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// The name metrics and logs use; never the key itself.
    pub id: String,
    hash: [u8; 32],
    pub scopes: Vec<Scope>,
    pub limits: KeyLimits,
}

impl KeyEntry {
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// What is wrong with a keys file. Messages name the entry and never show a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeysError {
    #[error("the keys file is not valid TOML: {0}")]
    Syntax(String),
    #[error("key {id:?}: {problem}")]
    Entry { id: String, problem: String },
    #[error("key id {0:?} appears twice: ids name keys in metrics and logs, so they must be unique")]
    DuplicateId(String),
    #[error("keys {first:?} and {second:?} have the same sha256: one key cannot have two ids")]
    DuplicateHash { first: String, second: String },
    #[error("the keys file has no [[keys]] entries: with an empty file no request could pass")]
    Empty,
}

/// Every known key. Built once from the file; verification walks all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyStore {
    entries: Vec<KeyEntry>,
}

impl KeyStore {
    /// Parses a keys file:
    ///
    /// ```toml
    /// [[keys]]
    /// id = "ci"
    /// sha256 = "…64 hex digits…"
    /// scopes = ["infer"]
    /// requests_per_s = 20
    /// burst = 40
    /// max_concurrent = 4
    /// ```
    pub fn parse(text: &str) -> Result<KeyStore, KeysError> {
        let file: KeysFile = toml::from_str(text).map_err(|e| KeysError::Syntax(e.message().to_string()))?;
        if file.keys.is_empty() {
            return Err(KeysError::Empty);
        }
        let mut entries: Vec<KeyEntry> = Vec::with_capacity(file.keys.len());
        let mut ids = HashSet::new();
        for raw in file.keys {
            let entry = check_entry(raw)?;
            if !ids.insert(entry.id.clone()) {
                return Err(KeysError::DuplicateId(entry.id));
            }
            if let Some(other) = entries.iter().find(|e| e.hash == entry.hash) {
                return Err(KeysError::DuplicateHash {
                    first: other.id.clone(),
                    second: entry.id,
                });
            }
            entries.push(entry);
        }
        Ok(KeyStore { entries })
    }

    pub fn entries(&self) -> &[KeyEntry] {
        &self.entries
    }

    /// The entry of `presented`, if it is a known key. The presented key is hashed and
    /// compared against every stored hash in constant time, with no early exit, so the
    /// time taken says nothing about which key (or how much of one) matched.
    pub fn verify(&self, presented: &str) -> Option<&KeyEntry> {
        self.position(presented).map(|i| &self.entries[i])
    }

    /// [`KeyStore::verify`], as the entry's index (where its limiter is kept).
    pub(crate) fn position(&self, presented: &str) -> Option<usize> {
        let digest = sha256(presented.as_bytes());
        let mut matched = subtle::Choice::from(0);
        let mut index = 0u64;
        for (i, entry) in self.entries.iter().enumerate() {
            let equal = digest.ct_eq(&entry.hash);
            index = u64::conditional_select(&index, &(i as u64), equal);
            matched |= equal;
        }
        bool::from(matched).then_some(index as usize)
    }
}

fn check_entry(raw: KeyEntryFile) -> Result<KeyEntry, KeysError> {
    let problem = |problem: String| KeysError::Entry {
        id: raw.id.clone(),
        problem,
    };
    if raw.id.is_empty()
        || !raw
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(problem(
            "ids are made of letters, digits, '-', '_' and '.' (they become metric labels)".into(),
        ));
    }
    let bytes = hex::decode(raw.sha256.trim()).map_err(|e| {
        problem(format!(
            "sha256 is not hex ({e}): give the 64 hex digits `peregrine keys new` printed"
        ))
    })?;
    let hash: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| problem(format!("sha256 has {} bytes, not 32 (64 hex digits)", b.len())))?;
    if raw.scopes.is_empty() {
        return Err(problem(
            "scopes is empty: list at least one of infer, streams, admin".into(),
        ));
    }
    let mut scopes = Vec::new();
    for s in &raw.scopes {
        let scope = s.parse::<Scope>().map_err(&problem)?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    let zero = |name: &str, v: Option<u32>| match v {
        Some(0) => Err(problem(format!("{name} is 0: leave it out for no limit"))),
        _ => Ok(()),
    };
    zero("requests_per_s", raw.requests_per_s)?;
    zero("burst", raw.burst)?;
    zero("max_concurrent", raw.max_concurrent)?;
    if raw.burst.is_some() && raw.requests_per_s.is_none() {
        return Err(problem("burst needs requests_per_s".into()));
    }
    Ok(KeyEntry {
        id: raw.id.clone(),
        hash,
        scopes,
        limits: KeyLimits {
            requests_per_s: raw.requests_per_s,
            burst: raw.burst,
            max_concurrent: raw.max_concurrent,
        },
    })
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A fresh key and its entry for the keys file.
#[derive(Debug)]
pub struct NewKey {
    /// The key itself: shown once, stored nowhere.
    pub key: String,
    /// The `[[keys]]` entry to paste into the keys file (the hash, not the key).
    pub entry: String,
}

/// Makes a new random key: `pk_` and 32 bytes from the operating system's generator in
/// base64url, with its SHA-256 as the entry for `id` with `scopes`.
pub fn new_key(id: &str, scopes: &[Scope]) -> Result<NewKey, KeysError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| KeysError::Entry {
        id: id.to_string(),
        problem: format!("the system's random generator failed: {e}"),
    })?;
    let key = format!(
        "pk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    let scopes: Vec<String> = scopes.iter().map(|s| format!("{:?}", s.as_str())).collect();
    let entry = format!(
        "[[keys]]\nid = {id:?}\nsha256 = \"{}\"\nscopes = [{}]\n",
        hex::encode(sha256(key.as_bytes())),
        scopes.join(", ")
    );
    // The entry must be one the parser accepts: checked here rather than trusted.
    KeyStore::parse(&entry)?;
    Ok(NewKey { key, entry })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, key: &str, scopes: &str) -> String {
        format!(
            "[[keys]]\nid = \"{id}\"\nsha256 = \"{}\"\nscopes = {scopes}\n",
            hex::encode(sha256(key.as_bytes()))
        )
    }

    #[test]
    fn a_presented_key_finds_its_own_entry_and_no_other() {
        let text = entry("a", "pk_alpha", r#"["infer"]"#) + &entry("b", "pk_beta", r#"["admin", "streams"]"#);
        let store = KeyStore::parse(&text).unwrap();
        assert_eq!(store.verify("pk_alpha").unwrap().id, "a");
        let b = store.verify("pk_beta").unwrap();
        assert_eq!(
            (b.id.as_str(), b.allows(Scope::Admin), b.allows(Scope::Infer)),
            ("b", true, false)
        );
        assert!(store.verify("pk_alph").is_none());
        assert!(store.verify("").is_none());
        assert!(store.verify("pk_alpha ").is_none());
    }

    #[test]
    fn parsing_errors_name_the_entry_and_the_problem() {
        let good = hex::encode(sha256(b"k"));
        let cases = [
            (
                format!("[[keys]]\nid = \"x\"\nsha256 = \"{good}\"\nscopes = [\"root\"]\n"),
                "unknown scope \"root\"",
            ),
            (
                "[[keys]]\nid = \"x\"\nsha256 = \"zz\"\nscopes = [\"infer\"]\n".into(),
                "sha256 is not hex",
            ),
            (
                "[[keys]]\nid = \"x\"\nsha256 = \"abcd\"\nscopes = [\"infer\"]\n".into(),
                "sha256 has 2 bytes, not 32",
            ),
            (
                format!("[[keys]]\nid = \"x\"\nsha256 = \"{good}\"\nscopes = []\n"),
                "scopes is empty",
            ),
            (
                format!("[[keys]]\nid = \"a b\"\nsha256 = \"{good}\"\nscopes = [\"infer\"]\n"),
                "ids are made of",
            ),
            (
                format!(
                    "[[keys]]\nid = \"x\"\nsha256 = \"{good}\"\nscopes = [\"infer\"]\nmax_concurrent = 0\n"
                ),
                "max_concurrent is 0",
            ),
            (
                format!("[[keys]]\nid = \"x\"\nsha256 = \"{good}\"\nscopes = [\"infer\"]\nburst = 3\n"),
                "burst needs requests_per_s",
            ),
            (
                format!("[[keys]]\nid = \"x\"\nsha256 = \"{good}\"\nscope = [\"infer\"]\n"),
                "unknown field `scope`",
            ),
            ("".into(), "no [[keys]] entries"),
        ];
        for (text, expected) in cases {
            let err = KeyStore::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "{err:?} should say {expected:?}");
        }
    }

    #[test]
    fn ids_and_hashes_are_unique() {
        let twice = entry("a", "k1", r#"["infer"]"#) + &entry("a", "k2", r#"["infer"]"#);
        assert_eq!(KeyStore::parse(&twice), Err(KeysError::DuplicateId("a".into())));
        let same_key = entry("a", "k1", r#"["infer"]"#) + &entry("b", "k1", r#"["infer"]"#);
        assert!(matches!(
            KeyStore::parse(&same_key),
            Err(KeysError::DuplicateHash { .. })
        ));
    }

    #[test]
    fn a_new_key_verifies_against_its_own_entry_and_is_not_in_it() {
        let made = new_key("ci", &[Scope::Infer, Scope::Streams]).unwrap();
        assert!(
            made.key.starts_with("pk_") && made.key.len() == 3 + 43,
            "{}",
            made.key
        );
        assert!(!made.entry.contains(&made.key));
        let store = KeyStore::parse(&made.entry).unwrap();
        let found = store.verify(&made.key).unwrap();
        assert_eq!(
            (found.id.as_str(), found.scopes.clone()),
            ("ci", vec![Scope::Infer, Scope::Streams])
        );
        assert_ne!(made.key, new_key("ci", &[Scope::Infer]).unwrap().key);
    }
}
