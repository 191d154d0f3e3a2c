//! Which server runs which stream when many share one stream list: rendezvous
//! (highest-random-weight) hashing of the stream's name over shard indexes `0..count`.
//!
//! Every shard scores every stream with `XXH3-64(name as UTF-8, seed = shard index)` and the
//! highest score owns it (on a tie, the lower index). Nothing is exchanged between shards:
//! each computes the same answer from the name and the count alone. Adding shard `N` takes
//! only the streams it now scores highest on (about `1/(N+1)` of them) and moves nothing
//! else; losing a shard moves only the streams it owned. XXH3 is a published algorithm
//! with fixed output, so the assignment never changes between versions or platforms (a
//! test pins it).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::config::StreamConfig;

/// A shard's place in the group: it is shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardAssignment {
    index: u32,
    count: u32,
}

/// A shard index or count that cannot be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("the shard count must be at least 1, not 0")]
    NoShards,
    #[error("shard index {index} is out of range: with {count} shards the indexes are 0 to {}", count - 1)]
    IndexOutOfRange { index: u32, count: u32 },
}

impl Default for ShardAssignment {
    /// One shard that owns every stream.
    fn default() -> Self {
        Self { index: 0, count: 1 }
    }
}

impl ShardAssignment {
    pub fn new(index: u32, count: u32) -> Result<Self, ShardError> {
        if count == 0 {
            return Err(ShardError::NoShards);
        }
        if index >= count {
            return Err(ShardError::IndexOutOfRange { index, count });
        }
        Ok(Self { index, count })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The index of the shard that runs `stream`.
    pub fn owner(&self, stream: &str) -> u32 {
        rendezvous_owner(stream, 0..self.count).unwrap_or(0)
    }

    /// Whether this shard runs `stream`.
    pub fn owns(&self, stream: &str) -> bool {
        self.claim(stream).is_ok()
    }

    /// `Err(owner)` when another shard runs `stream`.
    pub fn claim(&self, stream: &str) -> Result<(), u32> {
        if self.count == 1 {
            return Ok(());
        }
        match self.owner(stream) {
            owner if owner == self.index => Ok(()),
            owner => Err(owner),
        }
    }

    /// Splits a shared stream list into the streams this shard runs and those it leaves
    /// to their owners.
    pub fn split(&self, streams: Vec<StreamConfig>) -> (Vec<StreamConfig>, Vec<SkippedStream>) {
        let mut skipped = Vec::new();
        let mut owned = Vec::new();
        for s in streams {
            match self.claim(&s.name) {
                Ok(()) => owned.push(s),
                Err(owner) => skipped.push(SkippedStream { name: s.name, owner }),
            }
        }
        (owned, skipped)
    }
}

/// A configured stream another shard runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedStream {
    pub name: String,
    /// The index of the shard that runs it.
    pub owner: u32,
}

/// What this shard took of the configured streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardPlacement {
    pub shard: ShardAssignment,
    /// The configured streams left to other shards, in the configuration's order.
    pub skipped: Vec<SkippedStream>,
}

/// A shard's score for a stream: the highest score wins the stream.
pub fn shard_weight(stream: &str, shard: u32) -> u64 {
    xxh3_64_with_seed(stream.as_bytes(), u64::from(shard))
}

/// The shard among `shards` with the highest score for `stream` (the lower index on a
/// tie); `None` when there are no shards.
pub fn rendezvous_owner(stream: &str, shards: impl IntoIterator<Item = u32>) -> Option<u32> {
    shards
        .into_iter()
        .map(|shard| (shard_weight(stream, shard), std::cmp::Reverse(shard)))
        .max()
        .map(|(_, std::cmp::Reverse(shard))| shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("camera-{i}")).collect()
    }

    fn owners(names: &[String], count: u32) -> Vec<u32> {
        let shard = ShardAssignment::new(0, count).unwrap();
        names.iter().map(|n| shard.owner(n)).collect()
    }

    #[test]
    fn the_hash_is_pinned() {
        // Reference values from the xxhash Python package (xxh3_64_intdigest(name, seed)),
        // an implementation independent of the crate's: an owner must never change.
        assert_eq!(shard_weight("camera-0", 0), 0x0559_8896_e468_f6db);
        assert_eq!(shard_weight("camera-0", 1), 0x4eeb_dd02_7b40_f984);
        assert_eq!(shard_weight("lobby", 2), 0x59eb_8a6b_2c2e_520e);
        assert_eq!(shard_weight("", 0), 0x2d06_8005_38d3_94c2);
        let three = ShardAssignment::new(0, 3).unwrap();
        let pinned: Vec<u32> = names(8).iter().map(|n| three.owner(n)).collect();
        assert_eq!(pinned, [2, 1, 2, 0, 0, 2, 0, 1]);
    }

    #[test]
    fn every_stream_has_exactly_one_owner() {
        let names = names(1000);
        for count in [1, 2, 3, 7] {
            let shards: Vec<ShardAssignment> = (0..count)
                .map(|i| ShardAssignment::new(i, count).unwrap())
                .collect();
            for name in &names {
                let owning: Vec<u32> = shards
                    .iter()
                    .filter(|s| s.owns(name))
                    .map(|s| s.index())
                    .collect();
                assert_eq!(owning.len(), 1, "{name} over {count} shards: owned by {owning:?}");
                assert_eq!(owning[0], shards[0].owner(name));
            }
        }
    }

    #[test]
    fn the_load_is_spread_evenly() {
        let names = names(1000);
        let owners = owners(&names, 4);
        for shard in 0..4 {
            let share = owners.iter().filter(|&&o| o == shard).count();
            // 250 expected; binomial sd ~14.
            assert!((190..=310).contains(&share), "shard {shard} owns {share} of 1000");
        }
    }

    #[test]
    fn a_new_shard_takes_only_its_own_share() {
        let names = names(1000);
        for n in [1u32, 2, 3, 5, 9] {
            let (before, after) = (owners(&names, n), owners(&names, n + 1));
            let moved: Vec<usize> = (0..names.len()).filter(|&i| before[i] != after[i]).collect();
            assert!(
                moved.iter().all(|&i| after[i] == n),
                "{n} -> {}: a stream moved between old shards",
                n + 1
            );
            let expected = names.len() as f64 / f64::from(n + 1);
            let fraction = moved.len() as f64 / expected;
            // Modulo hashing would move n/(n+1) of them, far outside this.
            assert!(
                (0.75..=1.25).contains(&fraction),
                "{n} -> {}: {} moved, {expected:.0} expected",
                n + 1,
                moved.len()
            );
        }
    }

    #[test]
    fn removing_a_shard_moves_only_its_streams() {
        let names = names(1000);
        let all: Vec<u32> = (0..5).collect();
        for gone in 0..5 {
            let left: Vec<u32> = all.iter().copied().filter(|&s| s != gone).collect();
            for name in &names {
                let before = rendezvous_owner(name, all.iter().copied()).unwrap();
                let after = rendezvous_owner(name, left.iter().copied()).unwrap();
                if before != gone {
                    assert_eq!(before, after, "{name} moved though shard {gone} did not own it");
                }
            }
        }
        // Scaling a StatefulSet down removes its highest index: the same property.
        let (five, four) = (owners(&names, 5), owners(&names, 4));
        assert!((0..names.len()).all(|i| five[i] == 4 || five[i] == four[i]));
    }

    #[test]
    fn split_keeps_the_owned_streams_and_names_the_owner_of_the_rest() {
        let all: Vec<StreamConfig> = names(30)
            .iter()
            .map(|n| StreamConfig::new(n, "file:///x.mp4"))
            .collect();
        let shard = ShardAssignment::new(1, 3).unwrap();
        let (owned, skipped) = shard.split(all.clone());
        assert!(owned.iter().all(|s| shard.owner(&s.name) == 1));
        assert!(skipped
            .iter()
            .all(|s| s.owner != 1 && shard.owner(&s.name) == s.owner));
        assert_eq!(owned.len() + skipped.len(), 30);
        assert_eq!(shard.claim("camera-0"), Err(2));
        let (owned, skipped) = ShardAssignment::default().split(all);
        assert_eq!((owned.len(), skipped.len()), (30, 0));
    }

    #[test]
    fn one_shard_owns_everything_and_bad_ranges_are_refused() {
        let one = ShardAssignment::default();
        assert!(names(100).iter().all(|n| one.owns(n) && one.owner(n) == 0));
        assert_eq!(ShardAssignment::new(0, 0), Err(ShardError::NoShards));
        let err = ShardAssignment::new(3, 3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shard index 3 is out of range: with 3 shards the indexes are 0 to 2"
        );
        assert_eq!(rendezvous_owner("x", []), None);
    }
}
