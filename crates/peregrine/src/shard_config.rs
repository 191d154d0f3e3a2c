//! `[shard]` of the serve settings: which share of the configured streams this server runs
//! when several servers (a StatefulSet's replicas) share one stream list. Rendezvous
//! hashing of each stream's name picks its one owner (`peregrine_video::ShardAssignment`).

use anyhow::{Context, Result};
use clap::Args;
use peregrine_video::ShardAssignment;
use serde::Deserialize;

/// Where the kernel keeps this host's name (a pod's name, in Kubernetes).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// Sharding, as the config file's `[shard]` section spells it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShardSettings {
    /// This server's shard, 0 to `count - 1`.
    pub index: u32,
    /// How many servers share the stream list; 1 runs every stream here.
    pub count: u32,
    /// Take the index from the host name's trailing `-N` instead (a StatefulSet pod's
    /// ordinal: `peregrine-2` is shard 2).
    pub index_from_hostname: bool,
}

impl Default for ShardSettings {
    fn default() -> Self {
        let one = ShardAssignment::default();
        Self {
            index: one.index(),
            count: one.count(),
            index_from_hostname: false,
        }
    }
}

/// Flags for [`ShardSettings`]; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct ShardArgs {
    /// This server's shard of the configured streams, 0 to --shard-count minus 1; in a
    /// StatefulSet, set PEREGRINE_SHARD_INDEX from the pod's label
    /// apps.kubernetes.io/pod-index [default: 0].
    #[arg(id = "shard_index", long = "shard-index", env = "PEREGRINE_SHARD_INDEX")]
    pub index: Option<u32>,
    /// How many servers share the stream list; each runs the streams that rendezvous
    /// hashing of their names gives its index [default: 1, every stream runs here].
    #[arg(id = "shard_count", long = "shard-count", env = "PEREGRINE_SHARD_COUNT")]
    pub count: Option<u32>,
    /// Take the shard index from the host name's trailing -N (a StatefulSet pod's
    /// ordinal: peregrine-2 is shard 2) [default: false].
    #[arg(
        id = "shard_index_from_hostname",
        long = "shard-index-from-hostname",
        env = "PEREGRINE_SHARD_INDEX_FROM_HOSTNAME",
        conflicts_with = "shard_index"
    )]
    pub index_from_hostname: Option<bool>,
}

impl ShardArgs {
    pub fn apply(self, s: &mut ShardSettings) {
        if let Some(v) = self.index {
            s.index = v;
        }
        if let Some(v) = self.count {
            s.count = v;
        }
        if let Some(v) = self.index_from_hostname {
            s.index_from_hostname = v;
        }
    }
}

impl ShardSettings {
    /// This server's shard, reading the host name when the index comes from it.
    pub fn assignment(&self) -> Result<ShardAssignment> {
        let index = if self.index_from_hostname {
            let host = std::fs::read_to_string(HOSTNAME_FILE)
                .with_context(|| format!("shard.index_from_hostname: reading {HOSTNAME_FILE}"))?;
            ordinal_of(host.trim())?
        } else {
            self.index
        };
        ShardAssignment::new(index, self.count)
            .with_context(|| format!("shard settings (index {index}, count {})", self.count))
    }
}

/// The ordinal a StatefulSet gives its pod's name: the number after the last `-`.
fn ordinal_of(host: &str) -> Result<u32> {
    host.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .with_context(|| {
            format!(
                "host name {host:?} does not end in -N, as a StatefulSet pod's does (peregrine-2): \
                 give the index with --shard-index instead"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_by_default_and_flags_override_the_file() {
        let mut s: ShardSettings = toml::from_str("count = 4\nindex = 1").unwrap();
        assert_eq!(
            ShardSettings::default().assignment().unwrap(),
            ShardAssignment::default()
        );
        ShardArgs {
            index: Some(3),
            ..Default::default()
        }
        .apply(&mut s);
        assert_eq!(s.assignment().unwrap(), ShardAssignment::new(3, 4).unwrap());
    }

    #[test]
    fn an_index_past_the_count_is_refused_with_both_numbers() {
        let s = ShardSettings {
            index: 3,
            count: 3,
            index_from_hostname: false,
        };
        let message = format!("{:#}", s.assignment().unwrap_err());
        assert!(message.contains("index 3, count 3"), "{message}");
        assert!(message.contains("indexes are 0 to 2"), "{message}");
        let none = ShardSettings {
            count: 0,
            ..Default::default()
        };
        assert!(format!("{:#}", none.assignment().unwrap_err()).contains("at least 1"));
    }

    #[test]
    fn a_pod_name_gives_its_ordinal() {
        assert_eq!(ordinal_of("peregrine-2").unwrap(), 2);
        assert_eq!(ordinal_of("video-shards-west-11").unwrap(), 11);
        for bad in ["peregrine", "peregrine-", "peregrine-x", "laptop.local"] {
            let message = ordinal_of(bad).unwrap_err().to_string();
            assert!(message.contains("--shard-index"), "{bad}: {message}");
        }
    }
}
